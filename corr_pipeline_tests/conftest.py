"""Shared test fixtures: an isolated home directory and a real PostgreSQL.

- Every test session gets its own ``CORR_PIPELINE_HOME`` and ``DAGSTER_HOME`` in a temporary
  directory, and ``CORR_PIPELINE_DATABASE_URL`` from the caller's shell is removed, so tests never
  touch the user's ``./.corr_pipeline`` or their real database. ``CORR_PIPELINE_ENV_FILE=off``:
  no ``corr-pipeline`` command a test runs, in-process or not, applies or writes the checkout's
  ``.env`` (``corr-pipeline demo`` writes one there); the tests of the ``.env`` rules ask for
  ``env_files_apply`` and use project roots of their own under ``tmp_path``.
- Programs a test starts begin with SIGINT at its default even when the session was started
  with SIGINT ignored, as ``cmd &`` in a script or ``nohup ... &`` starts it
  (``children_start_with_default_sigint``), so a test's Ctrl-C reaches them.
- ``database_url`` (session): ``$CORR_PIPELINE_TEST_DATABASE_URL`` if set, otherwise an embedded
  PostgreSQL started in a temporary directory (stopped and deleted at session end). With
  pytest-xdist every worker gets its own database (its own embedded server, or a database named
  ``<db>_<worker>`` created on the test server), so ``clean_db`` in one worker never empties
  tables another worker is using. The URL is exported as ``CORR_PIPELINE_DATABASE_URL`` so
  subprocesses (the CLI, Dagster's multiprocess executor) reach the same database.
- ``engine`` (session): SQLAlchemy engine with the schema created through the migrations
  (:func:`corr_pipeline.db.migrate.upgrade` to the newest revision; ~40 ms, once per worker).
- ``clean_db`` (function): ``engine`` after truncating every table.
- ``new_database`` (function): a factory of new empty databases on the test server, each
  dropped after the test (migration tests).
- ``pg_parent_dir`` (function): an empty directory for a test's own embedded server (see below).

Embedded servers live in ``tempfile.mkdtemp`` directories, not under pytest's ``tmp_path``: when
run as root, the embedded server runs PostgreSQL as the unprivileged ``pgserver`` user, which must
traverse the parents of its data directory, and every pytest session start resets
``/tmp/pytest-of-<user>`` to mode 0700 -- so a concurrent pytest run on the same machine would
make a server under ``tmp_path`` unable to (re)start ("could not open pg_control: Permission
denied").
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from corr_pipeline import settings
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.migrate import upgrade
from corr_pipeline.db.schema import truncate_all

pytest_plugins = ["corr_pipeline_tests.fixtures.price_source"]  # its `market` fixture


def _xdist_worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "")


@pytest.fixture(scope="session", autouse=True)
def isolated_home() -> Iterator[Path]:
    """A fresh CORR_PIPELINE_HOME / DAGSTER_HOME for the whole session (autouse), outside
    pytest's tmp tree (see the module docstring); deleted at the end."""
    home = Path(tempfile.mkdtemp(prefix="corr_pipeline_test_home_"))
    dagster_home = settings.ensure_dir(home / "dagster_home")
    # the store's memory area (store/memory.py) of this session's runs: a directory of its own
    # on the same memory file system, removed at the end
    shm = settings.memory_dir()
    memory = Path(tempfile.mkdtemp(prefix="corr_pipeline_test_", dir=shm)) if shm else None
    with pytest.MonkeyPatch.context() as mp:
        if memory is not None:
            mp.setenv(settings.ENV_MEMORY_DIR, str(memory))
        mp.setenv(settings.ENV_HOME, str(home))
        mp.setenv(settings.ENV_ENV_FILE, "off")
        mp.setenv("DAGSTER_HOME", str(dagster_home))
        mp.delenv(settings.ENV_DATABASE_URL, raising=False)
        mp.delenv(settings.ENV_STORE_DIR, raising=False)
        try:
            yield home
        finally:
            db_engine.release_embedded_server(home / "pgdata")  # if a test started one there
            shutil.rmtree(home, ignore_errors=True)
            if memory is not None:
                shutil.rmtree(memory, ignore_errors=True)


@pytest.fixture
def env_files_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the tests of the project's ``.env`` itself: ``CORR_PIPELINE_ENV_FILE`` unset for the
    test and the commands it starts, so a ``.env`` in a project root applies again. Such a test
    runs its commands in a project root of its own (under ``tmp_path``), never the checkout's."""
    monkeypatch.delenv(settings.ENV_ENV_FILE, raising=False)


def _sigint_ignored(_signum: int, _frame: FrameType | None) -> None:
    """SIGINT in a session started with SIGINT ignored: still ignored (nothing happens)."""


@pytest.fixture(scope="session", autouse=True)
def children_start_with_default_sigint() -> Iterator[None]:
    """Programs the tests start get SIGINT at its default however the session was started
    (autouse). A shell starts a background job (``cmd &`` in a script, ``nohup ... &``) with
    SIGINT ignored; an ignored signal stays ignored across ``exec``, and Python then keeps
    ignoring it, so a test's Ctrl-C (SIGINT to a program it started) would do nothing. This
    process goes on ignoring SIGINT, through a handler that does nothing: a caught signal is
    reset to its default by ``exec``, so every program started from here begins as a terminal's
    foreground program does. (xdist workers inherit the ignored SIGINT from the controller, which
    runs no tests, and do the same.)"""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, _sigint_ignored)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


#: The deployment settings a test may set for itself (where runs read and write: never run
#: config), restored after each test.
DEPLOYMENT_SETTINGS = (
    settings.ENV_STORE_DIR,
    settings.ENV_PRICES_TABLE,
    settings.ENV_PRICES_COLUMNS,
    settings.ENV_PRICES_TIMEZONE,
    settings.ENV_DASK_SCHEDULER,
    settings.ENV_MEMORY_DIR,
)


@pytest.fixture(autouse=True)
def deployment_settings_restored() -> Iterator[None]:
    """Put back the :data:`DEPLOYMENT_SETTINGS` a test changed (autouse)."""
    saved = {name: os.environ.get(name) for name in DEPLOYMENT_SETTINGS}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _per_worker_database(url: str, worker: str) -> str:
    """Create (if missing) and return ``<db>_<worker>`` on the server of ``url``."""
    parsed = make_url(db_engine.normalize_url(url))
    name = f"{parsed.database or 'postgres'}_{worker}"
    admin = sa.create_engine(parsed, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).first()
            if not exists:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return parsed.set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(isolated_home: Path) -> Iterator[str]:
    """URL of the test database (see module docstring); exported to subprocesses."""
    external = os.environ.get(settings.ENV_TEST_DATABASE_URL, "").strip()
    pgdata: Path | None = None
    if external:
        url = db_engine.normalize_url(external)
        worker = _xdist_worker()
        if worker:
            url = _per_worker_database(url, worker)
    else:
        pg_parent = Path(tempfile.mkdtemp(prefix="corr_pipeline_test_pg_"))
        pgdata = pg_parent / "pgdata"
        url = db_engine.start_embedded_server(pgdata).url()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(settings.ENV_DATABASE_URL, url)
        try:
            yield url
        finally:
            db_engine.dispose_engines()
            if pgdata is not None:
                db_engine.release_embedded_server(pgdata)
                shutil.rmtree(pgdata.parent, ignore_errors=True)


@pytest.fixture
def pg_parent_dir() -> Iterator[Path]:
    """A fresh directory outside pytest's tmp tree for ``pgdata`` of a test's own embedded
    server (see the module docstring); deleted afterwards. Release the server first."""
    parent = Path(tempfile.mkdtemp(prefix="corr_pipeline_test_pg_"))
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
def engine(database_url: str) -> sa.Engine:
    """Engine on the test database, its schema created by the migrations (newest revision)."""
    eng = db_engine.get_engine(database_url)
    upgrade(eng)
    return eng


@pytest.fixture
def clean_db(engine: sa.Engine) -> sa.Engine:
    """``engine`` with every table of the schema emptied before the test."""
    truncate_all(engine)
    return engine


@pytest.fixture
def new_database(database_url: str) -> Iterator[Callable[[], str]]:
    """A factory: each call creates an empty database on the test server and returns its URL;
    every one is dropped (connections and all) after the test."""
    admin = sa.create_engine(make_url(database_url), isolation_level="AUTOCOMMIT")
    created: list[str] = []

    def create() -> str:
        name = f"corr_scratch_{_xdist_worker() or 'main'}_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        created.append(name)
        return make_url(database_url).set(database=name).render_as_string(hide_password=False)

    try:
        yield create
    finally:
        with admin.connect() as conn:
            for name in created:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
