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

The functions read the environment on every call (no caching), so a process that changes the
environment (tests, the CLI) sees the change immediately.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "CORR_PIPELINE_HOME"
ENV_DATABASE_URL = "CORR_PIPELINE_DATABASE_URL"
ENV_STORE_DIR = "CORR_PIPELINE_STORE_DIR"
ENV_TEST_DATABASE_URL = "CORR_PIPELINE_TEST_DATABASE_URL"

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
