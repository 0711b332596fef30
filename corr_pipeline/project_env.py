"""The project's ``.env`` file: read as Dagster reads it, applied as Dagster applies it.

Dagster's commands load ``.env`` from the directory they are started in (``dagster dev``,
``dagster-webserver``, ``dagster-daemon``, ``dagster job ...``) or from the project root (``dg
dev``, ``dg launch``, ``dg list defs``, and every code server and run worker of a ``dg``
project), and its values *replace* the ones already in the environment
(``dagster._cli.utils._inject_local_env_file``, ``DagsterInstance.inject_env_vars``). The
``corr-pipeline`` command applies the same file with the same precedence
(:func:`env_file_applied`), so that a value in ``.env`` means the same thing to the command line
and to the UI; ``corr-pipeline demo`` writes its first partition there (:func:`write_env_value`).
It applies only in the project root (a directory with the project's ``dagster.yaml`` and
``pyproject.toml``), only when the file is the user's own and nobody else may write it, and only
its ``CORR_PIPELINE_*`` and ``DAGSTER_*`` keys; ``corr-pipeline ui``, whose processes load
code, does not start at all while the file holds other keys (``strict``). With
``CORR_PIPELINE_ENV_FILE=off`` in the environment no ``.env`` is applied or written
(:func:`env_file_in_use`): the environment alone configures the commands (the test-suite runs so).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from corr_pipeline import privacy

ENV_FILE_NAME = ".env"
PROJECT_MARKERS = ("dagster.yaml", "pyproject.toml")
#: ``off``: the ``corr-pipeline`` commands neither apply nor write the project's ``.env``.
#: Read here, from the environment only (this module is below :mod:`corr_pipeline.settings`,
#: whose table lists it as ``CORR_PIPELINE_ENV_FILE``).
ENV_FILE_SWITCH = "CORR_PIPELINE_ENV_FILE"


def env_file() -> Path:
    """The project's ``.env``: ``./.env`` in the current directory (the repository root, where the
    docs run ``dg`` and ``corr-pipeline``)."""
    return Path.cwd() / ENV_FILE_NAME


def is_project_root(directory: Path) -> bool:
    """True when ``directory`` holds the project's ``dagster.yaml`` and ``pyproject.toml`` (the
    repository root, or a copy of it): the directory Dagster is started from."""
    return all((directory / name).is_file() for name in PROJECT_MARKERS)


def env_file_in_use() -> Path | None:
    """The ``.env`` the ``corr-pipeline`` commands apply and ``corr-pipeline demo`` writes:
    :func:`env_file` when the current directory is the project root (:func:`is_project_root`)
    and ``$CORR_PIPELINE_ENV_FILE`` is not ``off``; None otherwise. ValueError naming the
    variable for a value other than ``off`` (blank is unset)."""
    raw = os.environ.get(ENV_FILE_SWITCH, "").strip()
    if raw and raw.lower() != "off":
        raise ValueError(
            f"{ENV_FILE_SWITCH}={raw!r} must be off (apply no .env) or unset (the project's .env)"
        )
    if raw or not is_project_root(Path.cwd()):
        return None
    return env_file()


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
        problem = privacy.untrusted_reason(path, st)
        if problem is not None:
            what, fix = problem
            if st.st_uid != os.geteuid():
                fix = "remove it, or run from a project directory of your own"
            raise EnvFileError(f"{path} {what}: not applied; {fix}")
        text = handle.read()
    return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}


def env_file_settings(values: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(applied, ignored)``: the keys of ``values`` with a prefix of
    :data:`ENV_FILE_KEY_PREFIXES`, and the names of the others (sorted)."""
    applied = {k: v for k, v in values.items() if k.startswith(ENV_FILE_KEY_PREFIXES)}
    return applied, sorted(set(values) - set(applied))


@contextlib.contextmanager
def env_file_applied(path: Path | None = None, *, strict: bool = False) -> Iterator[dict[str, str]]:
    """Apply ``path`` (default: :func:`env_file_in_use`: the project's ``.env``, none outside the
    project root or with ``CORR_PIPELINE_ENV_FILE=off``) to ``os.environ`` with Dagster's
    precedence (the file's values replace the environment's), yield what was applied, and
    restore the whole environment afterwards: a command run in-process (e.g. by the tests)
    leaves nothing behind, neither the file's values nor what the command itself exported (the
    demo's first partition, the embedded database's URL). Only the project's and Dagster's keys
    apply (:func:`env_file_settings`; a warning names the others, or with ``strict``
    :class:`EnvFileError` does, before anything is applied); :class:`EnvFileError` for a file
    that is not the user's own (:func:`env_file_values`)."""
    path = path or env_file_in_use()
    if path is None:
        values: dict[str, str] = {}
    else:
        values, ignored = env_file_settings(env_file_values(path))
        if ignored and strict:
            raise EnvFileError(
                f"{path} sets {', '.join(ignored)}: only "
                f"{'* and '.join(ENV_FILE_KEY_PREFIXES)}* settings may be there; move the others "
                "out of the file (export them in your shell if you need them) and start again"
            )
        if ignored:
            import logging

            logging.getLogger(__name__).warning(
                "%s: not applied: %s (only %s* settings are)",
                path,
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
