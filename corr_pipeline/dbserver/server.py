"""Starting, sharing and releasing the embedded PostgreSQL of a data directory: the public entry
points of :mod:`corr_pipeline.dbserver`."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.dbserver import owned_files
from corr_pipeline.dbserver.accounts import run_as, server_account
from corr_pipeline.dbserver.datadir import (
    EMBEDDED_DATABASE,
    EMBEDDED_USER,
    check_data_dir,
    init_data_dir,
    write_managed_config,
)
from corr_pipeline.dbserver.directories import (
    SOCKET_PORT,
    binaries_for,
    grant_traversal,
    prepare_binaries,
)
from corr_pipeline.dbserver.errors import DatabaseUnavailableError
from corr_pipeline.dbserver.locks import has_users, start_lock, take_users_lock
from corr_pipeline.dbserver.postmaster import (
    PidFile,
    postmaster_process,
    remove_socket_dir,
    running_server,
    start_postmaster,
    stop_postmaster,
)
from corr_pipeline.dbserver.watchdog import ensure_watchdog

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedServer:
    """An embedded PostgreSQL this process holds a handle on."""

    pgdata: Path
    socket_dir: Path
    port: int
    pid: int
    bin_path: Path
    #: OS account the server runs as when we are root (``pgserver``); None: this process's.
    os_user: str | None

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def url(self, database: str = EMBEDDED_DATABASE) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of ``database`` on this server, over the Unix socket."""
        from sqlalchemy.engine import URL

        return URL.create(
            "postgresql+psycopg",
            username=EMBEDDED_USER,
            port=self.port,
            database=database,
            query={"host": str(self.socket_dir)},
        ).render_as_string(hide_password=False)

    def run_tool(self, tool: str, *args: str, timeout: float = 120.0) -> str:
        """Run one of the server's programs (``pg_ctl``, ``psql``, ``pg_dump``, ...) as the
        server's OS account; its output, or ``subprocess.CalledProcessError``."""
        code, output = run_as(self.bin_path / tool, args, server_account(), timeout=timeout)
        if code != 0:
            raise subprocess.CalledProcessError(code, [tool, *args], output)
        return output


@dataclass
class _Handle:
    server: EmbeddedServer
    users_fd: int


_thread_lock = threading.RLock()
_handles: dict[Path, _Handle] = {}


def ensure_database(server: EmbeddedServer, database: str) -> None:
    """Create ``database`` on ``server`` if it does not exist (concurrent callers are fine)."""
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(
            host=str(server.socket_dir),
            port=server.port,
            user=EMBEDDED_USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=30,
        ) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
                return
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass  # another process created it between our check and our CREATE
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL in {server.pgdata} runs but refused a connection on "
            f"{server.socket_path}: {' '.join(str(exc).split())}"
        ) from None


@contextlib.contextmanager
def _no_links(pgdata: Path) -> Iterator[None]:
    """A link where the data directory should hold a plain file stops start-up in one line."""
    try:
        yield
    except owned_files.NotAPlainFileError as exc:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL data directory {pgdata} holds a link where a plain file "
            f"belongs ({exc.strerror}): not used; remove the link, or the data directory"
        ) from None


def start_embedded_server(pgdata: Path | None = None) -> EmbeddedServer:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata`` (default ``home/pgdata``).

    Idempotent per process; the handle is held until :func:`release_embedded_server` or the
    process's end. Raises :class:`DatabaseUnavailableError` (one line, saying what to do) when the
    server cannot be started or attached to.
    """
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _thread_lock:
        existing = _handles.get(pgdata)
        if existing is not None:
            return existing.server
        settings.ensure_dir(pgdata.parent)
        account = server_account()
        with start_lock(pgdata), _no_links(pgdata):
            bin_path = binaries_for(pgdata)
            grant_traversal(pgdata, account)
            prepare_binaries(bin_path, account)
            init_data_dir(pgdata, bin_path, account)
            check_data_dir(pgdata, account)
            pid_file = running_server(pgdata, account)
            if pid_file is None:
                write_managed_config(pgdata, account)
                pid_file = start_postmaster(pgdata, bin_path, account)
            users_fd = take_users_lock(pgdata)
            try:
                ensure_watchdog(pgdata)
            except (OSError, subprocess.SubprocessError) as exc:
                logger.warning("embedded PostgreSQL: could not start its watchdog: %s", exc)
        assert pid_file.pid is not None and pid_file.socket_dir is not None
        server = EmbeddedServer(
            pgdata=pgdata,
            socket_dir=pid_file.socket_dir,
            port=pid_file.port or SOCKET_PORT,
            pid=pid_file.pid,
            bin_path=bin_path,
            os_user=account.name,
        )
        _handles[pgdata] = _Handle(server, users_fd)
    try:
        ensure_database(server, EMBEDDED_DATABASE)
    except DatabaseUnavailableError:
        release_embedded_server(pgdata)
        raise
    logger.info(
        "embedded PostgreSQL (pid %s): data %s, socket %s, database %s",
        server.pid,
        server.pgdata,
        server.socket_path,
        EMBEDDED_DATABASE,
    )
    return server


def release_embedded_server(pgdata: Path | None = None) -> None:
    """Give up this process's handle on the embedded server in ``pgdata`` (default
    ``home/pgdata``); the server stops if no other process uses it (the same happens
    automatically at interpreter exit, and through the watchdog when a process dies)."""
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _thread_lock:
        handle = _handles.pop(pgdata, None)
    if handle is None:
        return
    os.close(handle.users_fd)
    if not pgdata.is_dir():
        return
    with start_lock(pgdata):
        if has_users(pgdata):
            return
        pid_file = PidFile.read(pgdata)
        proc = postmaster_process(pgdata, pid_file)
        if pid_file is None or proc is None:
            return
        stop_postmaster(proc, pgdata, "its last user is done")
        remove_socket_dir(pid_file.socket_dir, pgdata)


def embedded_server() -> EmbeddedServer | None:
    """The embedded server this process holds for the current home, if any."""
    handle = _handles.get(settings.pgdata_dir().expanduser().resolve())
    return handle.server if handle is not None else None


def _release_all() -> None:
    for pgdata in list(_handles):
        try:
            release_embedded_server(pgdata)
        except Exception as exc:  # at exit: report, never raise
            logger.warning("embedded PostgreSQL in %s: %s", pgdata, exc)


atexit.register(_release_all)
