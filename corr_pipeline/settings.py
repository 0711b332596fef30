"""Where corr_pipeline keeps its local state and how it is deployed: environment variables.

Every path the project writes to by default hangs off one directory, the *home*:

    $CORR_PIPELINE_HOME            (default: ./.corr_pipeline, resolved to an absolute path)
    ├── pgdata/                    embedded PostgreSQL data directory (when no database URL is set)
    └── store/                     matrix store (SPEC §8), unless $CORR_PIPELINE_STORE_DIR is set

:data:`VARIABLES` is the one table of the variables (name, type, default, range, help), and
:func:`read` the one function that reads them: the value of a set variable, parsed and checked
(``ValueError`` ``NAME='raw' must ...`` naming the variable otherwise), else its default. The
getters below (:func:`store_dir`, :func:`keep_matrices`, ...) are that value with the defaults
that depend on other values (the home, the current directory, the mounts). The README's and the
user guide's configuration tables are checked against the table by the tests.

The project's ``.env`` is applied to the environment by the ``corr-pipeline`` command
(:mod:`corr_pipeline.env_file`). Everything is read on every call (no caching), so a process that
changes the environment (tests, the CLI) sees the change immediately.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corr_pipeline import privacy, project_env
from corr_pipeline.dates import date_problem, missing_day

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
ENV_PRICES_TABLE = "CORR_PIPELINE_PRICES_TABLE"
ENV_PRICES_COLUMNS = "CORR_PIPELINE_PRICES_COLUMNS"
ENV_PRICES_TIMEZONE = "CORR_PIPELINE_PRICES_TIMEZONE"
ENV_CALENDAR = "CORR_PIPELINE_CALENDAR"
ENV_SCHEDULE_DELAY = "CORR_PIPELINE_SCHEDULE_DELAY_MINUTES"
ENV_SENSOR_MIN_SHARE = "CORR_PIPELINE_SENSOR_MIN_SHARE"
ENV_SENSOR_CUTOFF_MINUTES = "CORR_PIPELINE_SENSOR_CUTOFF_MINUTES"
ENV_FRESHNESS_HOURS = "CORR_PIPELINE_FRESHNESS_HOURS"
ENV_DAGSTER_HOME = "DAGSTER_HOME"
ENV_NUMBA_CACHE = "CORR_PIPELINE_NUMBA_CACHE"
ENV_RUNTIME_DIR = "XDG_RUNTIME_DIR"
ENV_ENV_FILE = project_env.ENV_FILE_SWITCH

DEFAULT_HOME_DIRNAME = ".corr_pipeline"
DEFAULT_PARTITION_START = "2020-01-01"
DEFAULT_MAX_RUNTIME_SECONDS = 4 * 3600
DEFAULT_KEEP_MATRICES = 5
#: Where the matrices retention will not keep live by default: the shared-memory file system.
DEFAULT_MEMORY_DIR = "/dev/shm"
#: The universe size a deployment is sized for unless it says otherwise: the design size.
DEFAULT_UNIVERSE_SYMBOLS = 24_000
DEFAULT_PRICES_TABLE = "prices"
DEFAULT_PRICES_COLUMNS = "symbol,trade_date,close"
DEFAULT_PRICES_TIMEZONE = "UTC"
DEFAULT_CALENDAR = "XNYS"
#: The calendar name that means plain Monday-Friday partitions in UTC and the 06:30 UTC schedule.
WEEKDAYS_CALENDAR = "weekdays"
DEFAULT_SCHEDULE_DELAY_MINUTES = 90
DEFAULT_SENSOR_MIN_SHARE = 0.95
DEFAULT_SENSOR_CUTOFF_MINUTES = 180
DEFAULT_FRESHNESS_HOURS = 6.0

DAGSTER_YAML = "dagster.yaml"


@dataclass(frozen=True)
class Variable:
    """One environment variable: its ``name``; its ``kind`` (``text``, ``path``: expanded and
    resolved, ``int``, ``float`` or ``date``: ``YYYY-MM-DD``); ``default`` (None: unset, or a
    default that depends on other values, which ``shown`` describes); for numbers the range
    ``[low, high]`` (``low_open``: ``low`` itself excluded; ``high`` None: no upper bound) and
    ``must``, the end of the error message; ``shown``: the default as the docs' tables show it;
    ``help``: what it sets."""

    name: str
    kind: str
    default: Any
    help: str
    shown: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    must: str = ""

    def parse(self, raw: str) -> Any:
        """``raw`` (stripped, non-empty) as this variable's value; ValueError naming it."""
        if self.kind == "text":
            return raw
        if self.kind == "path":
            return Path(raw).expanduser().resolve()
        if self.kind == "date":
            problem = date_problem(raw)
            if problem is not None:
                example = "" if missing_day(raw) is not None else f" {self.must}"
                raise ValueError(f"{self.name}={raw!r}: {problem}{example}")
            return dt.date.fromisoformat(raw)
        number: float
        try:
            number = int(raw) if self.kind == "int" else float(raw)
        except ValueError:
            number = float("nan")
        low_ok = self.low is None or (number > self.low if self.low_open else number >= self.low)
        if not (low_ok and (self.high is None or number <= self.high)):
            raise ValueError(f"{self.name}={raw!r} must {self.must}")
        return number


#: Every variable the project reads, in the order the docs' tables list them.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        ENV_HOME, "path", None, "local state directory (embedded PostgreSQL, matrix store)",
        shown="./.corr_pipeline",
    ),
    Variable(
        ENV_DATABASE_URL, "text", None, "an existing PostgreSQL instead of the embedded one",
        shown="embedded server",
    ),
    Variable(ENV_STORE_DIR, "path", None, "matrix store root", shown="$CORR_PIPELINE_HOME/store"),
    Variable(
        ENV_KEEP_MATRICES, "int", DEFAULT_KEEP_MATRICES,
        "how many of the newest published partitions keep their matrices (retention)",
        low=1, must="be a whole number >= 1 (how many of the newest published partitions keep "
        "their matrices)",
    ),
    Variable(
        ENV_MEMORY_DIR, "text", None,
        "memory file system for the matrices retention will not keep; off: always on disk",
        shown="/dev/shm when it is a tmpfs",
    ),
    Variable(
        ENV_PARTITION_START, "date", DEFAULT_PARTITION_START, "first snapshot date (partition)",
        must=f"(e.g. {DEFAULT_PARTITION_START})",
    ),
    Variable(
        ENV_MAX_RUNTIME, "int", DEFAULT_MAX_RUNTIME_SECONDS,
        "a snapshot run is terminated and failed after this long", low=1,
        must="be a whole number of seconds >= 1",
    ),
    Variable(
        ENV_DASK_SCHEDULER, "text", None, "the Dask scheduler the stripes run on",
        shown="unset: threads",
    ),
    Variable(ENV_DASK_TLS_CA_FILE, "path", None, "a tls:// scheduler's certificate authority",
             shown="unset"),
    Variable(ENV_DASK_TLS_CERT, "path", None, "this client's certificate", shown="unset"),
    Variable(ENV_DASK_TLS_KEY, "path", None, "this client's key", shown="unset"),
    Variable(
        ENV_UNIVERSE_SYMBOLS, "int", DEFAULT_UNIVERSE_SYMBOLS,
        "the symbols the code location sizes its runs for", low=1,
        must="be a whole number >= 1 (the symbols of the universe the runs are sized for)",
    ),
    Variable(
        ENV_SESSIONS_PER_RUN, "int", None, "sessions per run of a UI backfill", shown="sized",
        low=1, must="be a whole number >= 1 (sessions per backfill run)",
    ),
    Variable(
        ENV_TEST_DATABASE_URL, "text", None, "the PostgreSQL of the test-suite",
        shown="a temporary embedded server",
    ),
    Variable(
        ENV_ENV_FILE, "text", None,
        "off: corr-pipeline neither applies nor writes the project's .env (read by "
        "corr_pipeline.project_env.env_file_in_use)",
        shown="./.env in the project root",
    ),
    Variable(
        ENV_DAGSTER_HOME, "path", None, "the Dagster instance directory",
        shown="the current directory when it is your own project root",
    ),
    Variable(
        ENV_NUMBA_CACHE, "path", None,
        "read-only kernels compiled in advance, copied into each process's private numba cache",
        shown="unset; the image: its kernels",
    ),
    Variable(ENV_PRICES_TABLE, "text", DEFAULT_PRICES_TABLE, "the table or view of daily prices"),
    Variable(
        ENV_PRICES_COLUMNS, "text", DEFAULT_PRICES_COLUMNS,
        "its symbol, trade date and price columns",
    ),
    Variable(
        ENV_PRICES_TIMEZONE, "text", DEFAULT_PRICES_TIMEZONE,
        "the zone that dates a timestamp with time zone trade-date column",
    ),
    Variable(ENV_CALENDAR, "text", DEFAULT_CALENDAR, "the exchange calendar of the partitions"),
    Variable(
        ENV_SCHEDULE_DELAY, "int", DEFAULT_SCHEDULE_DELAY_MINUTES,
        "the nightly run starts this long after each session's close", low=0, high=1440,
        must="be a whole number of minutes from 0 to 1440",
    ),
    Variable(
        ENV_SENSOR_MIN_SHARE, "float", DEFAULT_SENSOR_MIN_SHARE,
        "the share of symbols priced that lets the sensor run a session", low=0.0, high=1.0,
        low_open=True, must="be a number in (0, 1], e.g. 0.95",
    ),
    Variable(
        ENV_SENSOR_CUTOFF_MINUTES, "int", DEFAULT_SENSOR_CUTOFF_MINUTES,
        "the sensor runs a session this long after its close however incomplete", low=0,
        high=2880, must="be a whole number of minutes from 0 to 2880",
    ),
    Variable(
        ENV_FRESHNESS_HOURS, "float", DEFAULT_FRESHNESS_HOURS,
        "hours after its close and the schedule delay when an unpublished session fails the "
        "freshness check", low=0.0, high=72.0, low_open=True,
        must="be a number of hours in (0, 72]",
    ),
)  # fmt: skip

BY_NAME: dict[str, Variable] = {variable.name: variable for variable in VARIABLES}


def shown_default(variable: Variable) -> str:
    """The default as the docs' tables show it: ``shown``, else the default itself (an
    integer number of seconds or minutes as a whole number, a float without trailing zeros)."""
    if variable.shown:
        return variable.shown
    value = variable.default
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def read(name: str) -> Any:
    """The variable ``name`` of :data:`VARIABLES` from the environment: parsed and checked when
    set to a non-blank value (``ValueError`` naming it otherwise), else its ``default`` (a
    ``date`` default parsed too)."""
    variable = BY_NAME[name]
    raw = os.environ.get(name, "").strip()
    if raw:
        return variable.parse(raw)
    if variable.kind == "date" and variable.default is not None:
        return variable.parse(variable.default)
    return variable.default


def corr_pipeline_home() -> Path:
    """The local state directory: ``$CORR_PIPELINE_HOME`` or ``./.corr_pipeline`` (absolute).

    The directory is not created here; use :func:`ensure_dir` on the path you are about to write.
    An existing one must be the user's own and closed to writes by anyone else
    (:func:`corr_pipeline.privacy.check_own_directory`: refused in one line otherwise).
    """
    home = read(ENV_HOME) or (Path.cwd() / DEFAULT_HOME_DIRNAME).resolve()
    privacy.check_own_directory(home, ENV_HOME)
    return home


def pgdata_dir() -> Path:
    """Data directory of the embedded PostgreSQL: ``home/pgdata``."""
    return corr_pipeline_home() / "pgdata"


def store_dir() -> Path:
    """Root of the matrix store (SPEC §8): ``$CORR_PIPELINE_STORE_DIR`` or ``home/store``; an
    existing one must be the user's own and closed to writes by anyone else (as the home)."""
    store = read(ENV_STORE_DIR) or corr_pipeline_home() / "store"
    privacy.check_own_directory(store, ENV_STORE_DIR)
    return store


def database_url_from_env() -> str | None:
    """``$CORR_PIPELINE_DATABASE_URL`` stripped, or None when unset/empty (embedded database)."""
    return read(ENV_DATABASE_URL)


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
    return read(ENV_TEST_DATABASE_URL)


def partition_start() -> dt.date:
    """First snapshot date: ``$CORR_PIPELINE_PARTITION_START`` or :data:`DEFAULT_PARTITION_START`;
    ValueError naming the variable when the value is not a ``YYYY-MM-DD`` date."""
    return read(ENV_PARTITION_START)


def export_partition_start(day: dt.date) -> None:
    """Set ``$CORR_PIPELINE_PARTITION_START`` for this process and the subprocesses it starts
    (the code server that loads the code location, the run worker)."""
    os.environ[ENV_PARTITION_START] = day.isoformat()


def max_runtime_seconds() -> int:
    """``$CORR_PIPELINE_MAX_RUNTIME_SECONDS`` (whole seconds >= 1) or
    :data:`DEFAULT_MAX_RUNTIME_SECONDS`."""
    return read(ENV_MAX_RUNTIME)


def universe_symbols() -> int:
    """``$CORR_PIPELINE_UNIVERSE_SYMBOLS`` (>= 1) or :data:`DEFAULT_UNIVERSE_SYMBOLS`: the number
    of symbols the code location sizes its runs for (the executor, the sessions per backfill
    run)."""
    return read(ENV_UNIVERSE_SYMBOLS)


def sessions_per_run() -> int | None:
    """``$CORR_PIPELINE_SESSIONS_PER_RUN`` (>= 1), or None when unset (then
    :func:`corr_pipeline.snapshot.sizing.sessions_per_run` decides)."""
    return read(ENV_SESSIONS_PER_RUN)


def memory_dir() -> Path | None:
    """The memory file system under which sessions that retention will not keep hold their
    matrices (SPEC §8): ``$CORR_PIPELINE_MEMORY_DIR`` (``off`` disables it), else
    :data:`DEFAULT_MEMORY_DIR` when that is a ``tmpfs`` mount; None when there is none."""
    raw = read(ENV_MEMORY_DIR)
    if raw is not None and raw.lower() == "off":
        return None
    if raw is not None:
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
    """``$CORR_PIPELINE_KEEP_MATRICES`` (>= 1) or :data:`DEFAULT_KEEP_MATRICES`: how many of the
    newest published partitions keep their matrices (retention)."""
    return read(ENV_KEEP_MATRICES)


def dagster_home() -> Path:
    """``$DAGSTER_HOME`` if set; else the current directory when it is the project root whose
    ``dagster.yaml`` may configure the instance (:func:`project_instance_problem`: Dagster reads
    ``$DAGSTER_HOME/dagster.yaml``, and its ``python_logs`` handlers run code); else
    ``home/dagster_home`` (not created here; an existing one checked as the home is), with a
    warning when the current directory holds a ``dagster.yaml`` that is not used."""
    explicit = read(ENV_DAGSTER_HOME)
    if explicit is not None:
        return explicit
    cwd = Path.cwd()
    if (cwd / DAGSTER_YAML).is_file():
        problem = project_instance_problem(cwd)
        if problem is None:
            return cwd
        home = corr_pipeline_home() / "dagster_home"
        _warn_once(
            f"{cwd / DAGSTER_YAML} is not used as the Dagster instance ({problem}); the instance "
            f"is {home}"
        )
    else:
        home = corr_pipeline_home() / "dagster_home"
    privacy.check_own_directory(home, ENV_DAGSTER_HOME)
    return home


@functools.lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    """Log ``message`` as a warning, once per process."""
    logging.getLogger(__name__).warning("%s", message)


def project_instance_problem(directory: Path) -> str | None:
    """Why ``directory``'s ``dagster.yaml`` must not configure the instance, or None: it must
    be the project root (:func:`corr_pipeline.project_env.is_project_root`), and the directory
    and the file must be the user's own and closed to writes by anyone else, the rule of the
    project's ``.env`` (:func:`corr_pipeline.privacy.untrusted_reason`)."""
    if not project_env.is_project_root(directory):
        return (
            f"{directory} is not the project root (no {' and '.join(project_env.PROJECT_MARKERS)})"
        )
    for path in (directory, directory / DAGSTER_YAML):
        st = os.lstat(path)
        problem = privacy.untrusted_reason(path, st)
        if problem is not None:
            return f"{path} {problem[0]}; {problem[1]}, or set {ENV_DAGSTER_HOME}"
    return None


def runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR`` (the user's private runtime directory, e.g. ``/run/user/1000``) when
    set to an absolute path, else None. Not checked here: the embedded server verifies that the
    directory it creates inside is private before using it. Not one of :data:`VARIABLES`: the
    user's session sets it, not the deployment."""
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


def dask_scheduler() -> str | None:
    """``$CORR_PIPELINE_DASK_SCHEDULER`` (a scheduler address such as ``tls://host:8786``), or
    None: the products then run on threads in the step's process."""
    return read(ENV_DASK_SCHEDULER)


def dask_tls_files() -> dict[str, Path | None]:
    """The files a ``tls://`` Dask scheduler is reached with: ``ca_file`` (the certificate
    authority that signed the scheduler's and workers' certificates), ``cert`` and ``key``
    (this client's), from ``$CORR_PIPELINE_DASK_TLS_CA_FILE`` / ``_CERT`` / ``_KEY``; None where
    unset."""
    return {
        "ca_file": read(ENV_DASK_TLS_CA_FILE),
        "cert": read(ENV_DASK_TLS_CERT),
        "key": read(ENV_DASK_TLS_KEY),
    }


def prices_table() -> str:
    """``$CORR_PIPELINE_PRICES_TABLE`` (raw text, parsed by :mod:`corr_pipeline.db.price_source`)
    or :data:`DEFAULT_PRICES_TABLE`."""
    return read(ENV_PRICES_TABLE)


def prices_columns() -> str:
    """``$CORR_PIPELINE_PRICES_COLUMNS`` (raw text) or :data:`DEFAULT_PRICES_COLUMNS`."""
    return read(ENV_PRICES_COLUMNS)


def prices_timezone() -> str:
    """``$CORR_PIPELINE_PRICES_TIMEZONE`` (raw text) or :data:`DEFAULT_PRICES_TIMEZONE`."""
    return read(ENV_PRICES_TIMEZONE)


def calendar_name() -> str:
    """``$CORR_PIPELINE_CALENDAR`` or :data:`DEFAULT_CALENDAR` (checked by
    :mod:`corr_pipeline.sessions`, which knows the calendars)."""
    return read(ENV_CALENDAR)


def schedule_delay_minutes() -> int:
    """``$CORR_PIPELINE_SCHEDULE_DELAY_MINUTES`` (whole minutes, 0 to 1440) or
    :data:`DEFAULT_SCHEDULE_DELAY_MINUTES`."""
    return read(ENV_SCHEDULE_DELAY)


def sensor_min_share() -> float:
    """``$CORR_PIPELINE_SENSOR_MIN_SHARE`` (in (0, 1]) or :data:`DEFAULT_SENSOR_MIN_SHARE`: the
    prices sensor requests a session's snapshot once this share of the symbols priced on the
    previous trade date have a price on the session."""
    return read(ENV_SENSOR_MIN_SHARE)


def sensor_cutoff_minutes() -> int:
    """``$CORR_PIPELINE_SENSOR_CUTOFF_MINUTES`` (whole minutes, 0 to 2880) or
    :data:`DEFAULT_SENSOR_CUTOFF_MINUTES`: ... or once this many minutes have passed since the
    session's close, however complete the day is."""
    return read(ENV_SENSOR_CUTOFF_MINUTES)


def freshness_hours() -> float:
    """``$CORR_PIPELINE_FRESHNESS_HOURS`` (hours, > 0 and <= 72) or
    :data:`DEFAULT_FRESHNESS_HOURS`: the freshness check on ``snapshot_publication`` fails when
    the latest session has no publication this many hours after its close + the schedule
    delay."""
    return read(ENV_FRESHNESS_HOURS)
