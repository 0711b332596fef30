"""Where corr_pipeline keeps its local state, read from environment variables.

Every path the project writes to by default hangs off one directory, the *home*:

    $CORR_PIPELINE_HOME            (default: ./.corr_pipeline, resolved to an absolute path)
    ├── pgdata/                    embedded PostgreSQL data directory (when no database URL is set)
    └── store/                     matrix store (SPEC §8), unless $CORR_PIPELINE_STORE_DIR is set

Environment variables (all optional):

- ``CORR_PIPELINE_HOME``: the home directory above.
- ``CORR_PIPELINE_DATABASE_URL``: an external PostgreSQL (``postgresql://user:pass@host/db``);
  when unset, an embedded PostgreSQL is started in ``home/pgdata``.
- ``CORR_PIPELINE_STORE_DIR``: the matrix store root (default ``home/store``).
- ``CORR_PIPELINE_TEST_DATABASE_URL``: the PostgreSQL the test-suite uses instead of starting its
  own embedded one in a temporary directory.
- ``CORR_PIPELINE_PARTITION_START``: the first snapshot date (``YYYY-MM-DD``, default 2020-01-01).
- ``CORR_PIPELINE_MAX_RUNTIME_SECONDS``: the run-level maximum runtime (default 4 h).
- ``CORR_PIPELINE_KEEP_MATRICES``: how many of the newest published partitions keep their
  matrices in the store after each publication (retention, default 5).
- ``CORR_PIPELINE_DASK_SCHEDULER``: the address of a Dask distributed scheduler
  (``tcp://host:8786``) on which the correlation, neighbors and lead-lag stripes run; when unset
  they run on threads in the step's process (see docs/user_guide.md, "A Dask cluster").
- ``DAGSTER_HOME``: the Dagster instance directory. The project's own entry points default to
  the current directory when it holds a ``dagster.yaml`` (the repository root: the instance
  configuration Dagster then reads is the project's own file, and Dagster's own commands, run
  from there with ``DAGSTER_HOME`` set to it, say nothing about a second ``dagster.yaml``),
  else ``home/dagster_home``.
- ``XDG_RUNTIME_DIR``: the user's private runtime directory; the embedded PostgreSQL puts its
  Unix socket there when the data directory's path is too long for a socket name.

The project's ``.env`` (:func:`env_file`: ``./.env``, the file Dagster's own commands read when
started from the project root) is applied to the environment by the ``corr-pipeline`` command
(:func:`env_file_applied`) with Dagster's precedence, so the command line and the UI see the same
values; ``corr-pipeline demo`` writes its first partition there (:func:`write_env_value`). It
applies only in the project root (a directory with the project's ``dagster.yaml`` and
``pyproject.toml``), only when the file is the user's own and nobody else may write it, and only
its ``CORR_PIPELINE_*`` and ``DAGSTER_*`` keys.

The functions read the environment on every call (no caching), so a process that changes the
environment (tests, the CLI) sees the change immediately.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

ENV_HOME = "CORR_PIPELINE_HOME"
ENV_DATABASE_URL = "CORR_PIPELINE_DATABASE_URL"
ENV_STORE_DIR = "CORR_PIPELINE_STORE_DIR"
ENV_TEST_DATABASE_URL = "CORR_PIPELINE_TEST_DATABASE_URL"
ENV_PARTITION_START = "CORR_PIPELINE_PARTITION_START"
ENV_MAX_RUNTIME = "CORR_PIPELINE_MAX_RUNTIME_SECONDS"
ENV_KEEP_MATRICES = "CORR_PIPELINE_KEEP_MATRICES"
ENV_MEMORY_DIR = "CORR_PIPELINE_MEMORY_DIR"
ENV_DASK_SCHEDULER = "CORR_PIPELINE_DASK_SCHEDULER"
ENV_DASK_TLS_CA_FILE = "CORR_PIPELINE_DASK_TLS_CA_FILE"
ENV_DASK_TLS_CERT = "CORR_PIPELINE_DASK_TLS_CERT"
ENV_DASK_TLS_KEY = "CORR_PIPELINE_DASK_TLS_KEY"
ENV_UNIVERSE_SYMBOLS = "CORR_PIPELINE_UNIVERSE_SYMBOLS"
ENV_SESSIONS_PER_RUN = "CORR_PIPELINE_SESSIONS_PER_RUN"
ENV_DAGSTER_HOME = "DAGSTER_HOME"
ENV_RUNTIME_DIR = "XDG_RUNTIME_DIR"

DEFAULT_PARTITION_START = "2020-01-01"
DEFAULT_MAX_RUNTIME_SECONDS = 4 * 3600
DEFAULT_KEEP_MATRICES = 5
#: Where the matrices retention will not keep live by default: the shared-memory file system.
DEFAULT_MEMORY_DIR = "/dev/shm"
#: The universe size a deployment is sized for unless it says otherwise: the design size.
DEFAULT_UNIVERSE_SYMBOLS = 24_000

DEFAULT_HOME_DIRNAME = ".corr_pipeline"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    return Path(value).expanduser().resolve()


def corr_pipeline_home() -> Path:
    """The local state directory: ``$CORR_PIPELINE_HOME`` or ``./.corr_pipeline`` (absolute).

    The directory is not created here; use :func:`ensure_dir` on the path you are about to write.
    """
    return _env_path(ENV_HOME) or (Path.cwd() / DEFAULT_HOME_DIRNAME).resolve()


def pgdata_dir() -> Path:
    """Data directory of the embedded PostgreSQL: ``home/pgdata``."""
    return corr_pipeline_home() / "pgdata"


def store_dir() -> Path:
    """Root of the matrix store (SPEC §8): ``$CORR_PIPELINE_STORE_DIR`` or ``home/store``."""
    return _env_path(ENV_STORE_DIR) or corr_pipeline_home() / "store"


def database_url_from_env() -> str | None:
    """``$CORR_PIPELINE_DATABASE_URL`` stripped, or None when unset/empty (embedded database)."""
    value = os.environ.get(ENV_DATABASE_URL, "").strip()
    return value or None


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def export_database_url(url: str) -> None:
    """Set ``$CORR_PIPELINE_DATABASE_URL`` for this process and the subprocesses it starts (so
    Dagster's step processes attach to the server this process started)."""
    os.environ[ENV_DATABASE_URL] = url


def test_database_url() -> str | None:
    """``$CORR_PIPELINE_TEST_DATABASE_URL`` stripped, or None when unset/empty."""
    value = os.environ.get(ENV_TEST_DATABASE_URL, "").strip()
    return value or None


def partition_start() -> dt.date:
    """First snapshot date: ``$CORR_PIPELINE_PARTITION_START`` or :data:`DEFAULT_PARTITION_START`.

    Raises ValueError naming the variable when the value is not a ``YYYY-MM-DD`` date.
    """
    raw = os.environ.get(ENV_PARTITION_START, "").strip() or DEFAULT_PARTITION_START
    try:
        return dt.datetime.strptime(raw, "%Y-%m-%d").date()
    except ValueError:
        raise ValueError(
            f"{ENV_PARTITION_START}={raw!r} is not a date in YYYY-MM-DD form "
            f"(e.g. {DEFAULT_PARTITION_START})"
        ) from None


def export_partition_start(day: dt.date) -> None:
    """Set ``$CORR_PIPELINE_PARTITION_START`` for this process and the subprocesses it starts
    (the code server that loads the code location, the run worker)."""
    os.environ[ENV_PARTITION_START] = day.isoformat()


def _env_int(name: str, default: int, low: int, high: int | None, must: str) -> int:
    """``$name`` as a whole number in ``[low, high]`` (``high`` None: no upper bound), ``default``
    when unset or empty; ValueError ``NAME='raw' must ...`` otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name}={raw!r} must {must}")
    return value


def max_runtime_seconds() -> int:
    """``$CORR_PIPELINE_MAX_RUNTIME_SECONDS`` (whole seconds >= 1) or
    :data:`DEFAULT_MAX_RUNTIME_SECONDS`; ValueError naming the variable otherwise."""
    return _env_int(
        ENV_MAX_RUNTIME, DEFAULT_MAX_RUNTIME_SECONDS, 1, None, "be a whole number of seconds >= 1"
    )


def universe_symbols() -> int:
    """``$CORR_PIPELINE_UNIVERSE_SYMBOLS`` (a whole number >= 1) or
    :data:`DEFAULT_UNIVERSE_SYMBOLS`: the number of symbols the code location sizes its runs for
    (the executor, the sessions per backfill run); ValueError naming the variable otherwise."""
    return _env_int(
        ENV_UNIVERSE_SYMBOLS,
        DEFAULT_UNIVERSE_SYMBOLS,
        1,
        None,
        "be a whole number >= 1 (the symbols of the universe the runs are sized for)",
    )


def sessions_per_run() -> int | None:
    """``$CORR_PIPELINE_SESSIONS_PER_RUN`` (a whole number >= 1), or None when unset (then
    :func:`corr_pipeline.snapshot.sizing.sessions_per_run` decides); ValueError naming the
    variable otherwise."""
    if not os.environ.get(ENV_SESSIONS_PER_RUN, "").strip():
        return None
    return _env_int(
        ENV_SESSIONS_PER_RUN, 1, 1, None, "be a whole number >= 1 (sessions per backfill run)"
    )


def memory_dir() -> Path | None:
    """The memory file system under which sessions that retention will not keep hold their
    matrices (SPEC §8): ``$CORR_PIPELINE_MEMORY_DIR`` (``off`` disables it), else
    :data:`DEFAULT_MEMORY_DIR` when that is a ``tmpfs`` mount; None when there is none."""
    raw = os.environ.get(ENV_MEMORY_DIR, "").strip()
    if raw.lower() == "off":
        return None
    if raw:
        return Path(raw).expanduser().resolve()
    return Path(DEFAULT_MEMORY_DIR) if _is_tmpfs(DEFAULT_MEMORY_DIR) else None


@functools.lru_cache(maxsize=8)
def _is_tmpfs(mount_point: str) -> bool:
    """Whether ``mount_point`` is a ``tmpfs`` mount (``/proc/self/mounts``)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            return any(
                fields[1] == mount_point and fields[2] == "tmpfs"
                for fields in (line.split() for line in mounts)
                if len(fields) > 2
            )
    except OSError:
        return False


def keep_matrices() -> int:
    """``$CORR_PIPELINE_KEEP_MATRICES`` (a whole number >= 1) or :data:`DEFAULT_KEEP_MATRICES`:
    how many of the newest published partitions keep their matrices (retention); ValueError
    naming the variable otherwise."""
    return _env_int(
        ENV_KEEP_MATRICES,
        DEFAULT_KEEP_MATRICES,
        1,
        None,
        "be a whole number >= 1 (how many of the newest published partitions keep their matrices)",
    )


DAGSTER_YAML = "dagster.yaml"


def dagster_home() -> Path:
    """``$DAGSTER_HOME`` if set; else the current directory when it holds a ``dagster.yaml`` (the
    repository root, whose ``dagster.yaml`` is then the instance's configuration: Dagster reads
    ``$DAGSTER_HOME/dagster.yaml``); else ``home/dagster_home`` (not created here)."""
    explicit = _env_path(ENV_DAGSTER_HOME)
    if explicit is not None:
        return explicit
    cwd = Path.cwd()
    if (cwd / DAGSTER_YAML).is_file():
        return cwd
    return corr_pipeline_home() / "dagster_home"


def runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR`` (the user's private runtime directory, e.g. ``/run/user/1000``) when
    set to an absolute path, else None. Not checked here: the embedded server verifies that the
    directory it creates inside is private before using it."""
    value = os.environ.get(ENV_RUNTIME_DIR, "").strip()
    return Path(value) if value and os.path.isabs(value) else None


def child_environment(pythonpath_first: str) -> dict[str, str]:
    """This process's environment for a child Python process, with ``pythonpath_first`` put
    first on ``PYTHONPATH`` (so the child imports this very copy of the package)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath_first, env.get("PYTHONPATH", "")) if p
    )
    return env


# --------------------------------------------------------------------------------------------
# The price source and the exchange calendar (read on every call, like everything above)
# --------------------------------------------------------------------------------------------
#
# - ``CORR_PIPELINE_PRICES_TABLE``: the table or view the window reads (``prices``, the
#   project's own table, by default; ``schema.name`` or ``name``, SQL identifier syntax:
#   unquoted names fold to lower case, ``"Quoted"`` names keep their case).
# - ``CORR_PIPELINE_PRICES_COLUMNS``: its symbol, trade date and price columns, in that order,
#   comma-separated (default ``symbol,trade_date,close``).
# - ``CORR_PIPELINE_PRICES_TIMEZONE``: the time zone in which a ``timestamp with time zone``
#   trade-date column is turned into a date (default ``UTC``; unused for ``date`` and
#   ``timestamp`` columns).
# - ``CORR_PIPELINE_CALENDAR``: the exchange calendar of the partitions and the schedule (an
#   ``exchange_calendars`` code such as ``XNYS``, the default, or ``weekdays``).
# - ``CORR_PIPELINE_SCHEDULE_DELAY_MINUTES``: how long after a session's close the schedule
#   requests its snapshot (default 90).

ENV_PRICES_TABLE = "CORR_PIPELINE_PRICES_TABLE"
ENV_PRICES_COLUMNS = "CORR_PIPELINE_PRICES_COLUMNS"
ENV_PRICES_TIMEZONE = "CORR_PIPELINE_PRICES_TIMEZONE"
ENV_CALENDAR = "CORR_PIPELINE_CALENDAR"
ENV_SCHEDULE_DELAY = "CORR_PIPELINE_SCHEDULE_DELAY_MINUTES"

DEFAULT_PRICES_TABLE = "prices"
DEFAULT_PRICES_COLUMNS = "symbol,trade_date,close"
DEFAULT_PRICES_TIMEZONE = "UTC"
DEFAULT_CALENDAR = "XNYS"
#: The calendar name that means plain Monday-Friday partitions in UTC and the 06:30 UTC schedule.
WEEKDAYS_CALENDAR = "weekdays"
DEFAULT_SCHEDULE_DELAY_MINUTES = 90


def _env_text(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def dask_scheduler() -> str | None:
    """``$CORR_PIPELINE_DASK_SCHEDULER`` (a scheduler address such as ``tcp://host:8786``), or
    None: the products then run on threads in the step's process."""
    return _env_text(ENV_DASK_SCHEDULER)


def dask_tls_files() -> dict[str, Path | None]:
    """The files a ``tls://`` Dask scheduler is reached with: ``ca_file`` (the certificate
    authority that signed the scheduler's and workers' certificates), ``cert`` and ``key``
    (this client's), from ``$CORR_PIPELINE_DASK_TLS_CA_FILE`` / ``_CERT`` / ``_KEY``; None where
    unset."""
    return {
        "ca_file": _env_path(ENV_DASK_TLS_CA_FILE),
        "cert": _env_path(ENV_DASK_TLS_CERT),
        "key": _env_path(ENV_DASK_TLS_KEY),
    }


def prices_table() -> str:
    """``$CORR_PIPELINE_PRICES_TABLE`` (raw text, parsed by :mod:`corr_pipeline.db.price_source`)
    or :data:`DEFAULT_PRICES_TABLE`."""
    return _env_text(ENV_PRICES_TABLE) or DEFAULT_PRICES_TABLE


def prices_columns() -> str:
    """``$CORR_PIPELINE_PRICES_COLUMNS`` (raw text) or :data:`DEFAULT_PRICES_COLUMNS`."""
    return _env_text(ENV_PRICES_COLUMNS) or DEFAULT_PRICES_COLUMNS


def prices_timezone() -> str:
    """``$CORR_PIPELINE_PRICES_TIMEZONE`` (raw text) or :data:`DEFAULT_PRICES_TIMEZONE`."""
    return _env_text(ENV_PRICES_TIMEZONE) or DEFAULT_PRICES_TIMEZONE


def calendar_name() -> str:
    """``$CORR_PIPELINE_CALENDAR`` or :data:`DEFAULT_CALENDAR` (checked by
    :mod:`corr_pipeline.sessions`, which knows the calendars)."""
    return _env_text(ENV_CALENDAR) or DEFAULT_CALENDAR


def schedule_delay_minutes() -> int:
    """``$CORR_PIPELINE_SCHEDULE_DELAY_MINUTES`` (whole minutes, 0 to 1440) or
    :data:`DEFAULT_SCHEDULE_DELAY_MINUTES`; ValueError naming the variable otherwise."""
    return _env_int(
        ENV_SCHEDULE_DELAY,
        DEFAULT_SCHEDULE_DELAY_MINUTES,
        0,
        1440,
        "be a whole number of minutes from 0 to 1440",
    )


# --------------------------------------------------------------------------------------------
# The prices sensor and the freshness check (read on every call)
# --------------------------------------------------------------------------------------------
#
# - ``CORR_PIPELINE_SENSOR_MIN_SHARE``: the prices sensor requests a session's snapshot once at
#   least this share (0 < share <= 1) of the symbols priced on the previous trade date have a
#   price on the session (default 0.95).
# - ``CORR_PIPELINE_SENSOR_CUTOFF_MINUTES``: ... or once this many minutes have passed since the
#   session's close, however complete the day is (default 180).
# - ``CORR_PIPELINE_FRESHNESS_HOURS``: the freshness check on ``snapshot_publication`` fails when
#   the latest session has no publication this many hours after its close + the schedule delay
#   (default 6).

ENV_SENSOR_MIN_SHARE = "CORR_PIPELINE_SENSOR_MIN_SHARE"
ENV_SENSOR_CUTOFF_MINUTES = "CORR_PIPELINE_SENSOR_CUTOFF_MINUTES"
ENV_FRESHNESS_HOURS = "CORR_PIPELINE_FRESHNESS_HOURS"

DEFAULT_SENSOR_MIN_SHARE = 0.95
DEFAULT_SENSOR_CUTOFF_MINUTES = 180
DEFAULT_FRESHNESS_HOURS = 6.0


def sensor_min_share() -> float:
    """``$CORR_PIPELINE_SENSOR_MIN_SHARE`` (a number in (0, 1]) or
    :data:`DEFAULT_SENSOR_MIN_SHARE`; ValueError naming the variable otherwise."""
    raw = _env_text(ENV_SENSOR_MIN_SHARE)
    if raw is None:
        return DEFAULT_SENSOR_MIN_SHARE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{ENV_SENSOR_MIN_SHARE}={raw!r} must be a number in (0, 1], e.g. 0.95")
    return value


def sensor_cutoff_minutes() -> int:
    """``$CORR_PIPELINE_SENSOR_CUTOFF_MINUTES`` (whole minutes, 0 to 2880) or
    :data:`DEFAULT_SENSOR_CUTOFF_MINUTES`; ValueError naming the variable otherwise."""
    return _env_int(
        ENV_SENSOR_CUTOFF_MINUTES,
        DEFAULT_SENSOR_CUTOFF_MINUTES,
        0,
        2880,
        "be a whole number of minutes from 0 to 2880",
    )


def freshness_hours() -> float:
    """``$CORR_PIPELINE_FRESHNESS_HOURS`` (hours, > 0 and <= 72) or
    :data:`DEFAULT_FRESHNESS_HOURS`; ValueError naming the variable otherwise."""
    raw = _env_text(ENV_FRESHNESS_HOURS)
    if raw is None:
        return DEFAULT_FRESHNESS_HOURS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 72.0:
        raise ValueError(f"{ENV_FRESHNESS_HOURS}={raw!r} must be a number of hours in (0, 72]")
    return value


# --------------------------------------------------------------------------------------------
# The project's .env file
# --------------------------------------------------------------------------------------------
#
# Dagster's commands load ``.env`` from the directory they are started in (``dagster dev``,
# ``dagster-webserver``, ``dagster-daemon``, ``dagster job ...``) or from the project root (``dg
# dev``, ``dg launch``, ``dg list defs``, and every code server and run worker of a ``dg``
# project), and its values *replace* the ones already in the environment
# (``dagster._cli.utils._inject_local_env_file``, ``DagsterInstance.inject_env_vars``). The
# ``corr-pipeline`` command applies the same file with the same precedence, so that a value in
# ``.env`` means the same thing to the command line and to the UI.

ENV_FILE_NAME = ".env"
PROJECT_MARKERS = ("dagster.yaml", "pyproject.toml")


def env_file() -> Path:
    """The project's ``.env``: ``./.env`` in the current directory (the repository root, where the
    docs run ``dg`` and ``corr-pipeline``)."""
    return Path.cwd() / ENV_FILE_NAME


def is_project_root(directory: Path) -> bool:
    """True when ``directory`` holds the project's ``dagster.yaml`` and ``pyproject.toml`` (the
    repository root, or a copy of it): the directory Dagster is started from."""
    return all((directory / name).is_file() for name in PROJECT_MARKERS)


#: The keys a ``.env`` may set for ``corr-pipeline``: the project's settings and Dagster's own.
#: Others (``PSQLRC``, ``PYTHONPATH``, ``LD_PRELOAD``, ...) are left out, with a warning.
ENV_FILE_KEY_PREFIXES = ("CORR_PIPELINE_", "DAGSTER_")


class EnvFileError(ValueError):
    """A ``.env`` that must not be applied: another user's, or one others may write."""


def env_file_values(path: Path | None = None) -> dict[str, str]:
    """The assignments of ``path`` (default :func:`env_file`) as Dagster reads them
    (``python-dotenv``; keys without a value left out); empty when there is no such file.
    The file is read through one descriptor whose owner and mode are checked first:
    :class:`EnvFileError` when it belongs to another user or group or others may write it."""
    import io

    from dotenv import dotenv_values

    path = path or env_file()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, IsADirectoryError):
        return {}
    with os.fdopen(fd, "r", encoding="utf-8") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            return {}
        if st.st_uid != os.geteuid():
            raise EnvFileError(
                f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): not "
                "applied; remove it, or run from a project directory of your own"
            )
        if st.st_mode & 0o022:
            raise EnvFileError(
                f"{path} may be written by group or others (mode {stat.S_IMODE(st.st_mode):04o}"
                f"): not applied; chmod go-w {path}"
            )
        text = handle.read()
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


def env_file_settings(values: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(applied, ignored)``: the keys of ``values`` with a prefix of
    :data:`ENV_FILE_KEY_PREFIXES`, and the names of the others (sorted)."""
    applied = {k: v for k, v in values.items() if k.startswith(ENV_FILE_KEY_PREFIXES)}
    return applied, sorted(set(values) - set(applied))


@contextlib.contextmanager
def env_file_applied(path: Path | None = None) -> Iterator[dict[str, str]]:
    """Apply ``path`` (default: :func:`env_file` when the current directory is the project root,
    :func:`is_project_root`; nothing elsewhere) to ``os.environ`` with Dagster's precedence (the
    file's values replace the environment's), yield what was applied, and restore the whole
    environment afterwards: a command run in-process (e.g. by the tests) leaves nothing behind,
    neither the file's values nor what the command itself exported (the demo's first
    partition, the embedded database's URL). Only the project's and Dagster's keys apply
    (:func:`env_file_settings`; a warning names the others); :class:`EnvFileError` for a file
    that is not the user's own (:func:`env_file_values`)."""
    if path is None and not is_project_root(Path.cwd()):
        values: dict[str, str] = {}
    else:
        values, ignored = env_file_settings(env_file_values(path))
        if ignored:
            import logging

            logging.getLogger(__name__).warning(
                "%s: not applied: %s (only %s* settings are)",
                path or env_file(),
                ", ".join(ignored),
                "* and ".join(ENV_FILE_KEY_PREFIXES),
            )
    with environment_restored():
        os.environ.update(values)
        yield values


@contextlib.contextmanager
def environment_restored() -> Iterator[None]:
    """Restore the whole process environment when the block ends (whatever it set or removed)."""
    previous = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(previous)


def write_env_value(path: Path, name: str, value: str, comment: list[str]) -> None:
    """Set ``name=value`` in the ``.env`` file ``path`` and nothing else: every other line is kept
    as it is; earlier assignments of ``name`` (``NAME=...`` or ``export NAME=...``) and the
    comment lines written with them (those starting ``# [NAME]``) are replaced by ``comment``
    (each line prefixed ``# [NAME] ``) and the new assignment, at the end. The file is replaced
    atomically; a new file is readable by its owner only (it may later hold secrets). ValueError
    for a name or value that would need quoting."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or re.search(r"[\s'\"#\\$]", value):
        raise ValueError(f"cannot write {name}={value!r} to {path}")
    marker = f"# [{name}]"
    assignment = re.compile(rf"^\s*(export\s+)?{re.escape(name)}\s*=")
    kept: list[str] = []
    if path.is_file():
        kept = [
            line
            for line in path.read_text().splitlines()
            if not assignment.match(line) and not line.startswith(marker)
        ]
    while kept and not kept[-1].strip():
        kept.pop()
    block = [f"{marker} {line}" for line in comment] + [f"{name}={value}"]
    text = "\n".join([*kept, *([""] if kept else []), *block]) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = path.stat().st_mode & 0o755 if path.exists() else 0o600
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
