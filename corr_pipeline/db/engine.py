"""Which PostgreSQL to talk to, and SQLAlchemy engines for it.

Two modes:

1. ``$CORR_PIPELINE_DATABASE_URL`` is set: that server is used as is
   (``postgresql://`` and ``postgres://`` are normalised to the psycopg 3 driver,
   ``postgresql+psycopg://``).
2. Otherwise the **embedded PostgreSQL** in ``$CORR_PIPELINE_HOME/pgdata`` is started, or
   attached to if it is already running (:mod:`corr_pipeline.db.embedded`: a private Unix
   socket, no TCP, shared by local processes, stopped when the last one is done). It serves a
   database named ``corr_pipeline`` (created on first use).

Credentials never appear in messages: every URL that is logged or put into an exception goes
through :func:`redact_url`, and connection failures are re-raised as
:class:`DatabaseUnavailableError` without the driver exception chained to it.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from corr_pipeline import settings
from corr_pipeline.db import embedded
from corr_pipeline.db.embedded import (
    EMBEDDED_DATABASE,
    EMBEDDED_SERVER_SETTINGS,
    EMBEDDED_USER,
    EmbeddedServer,
    embedded_server,
    start_embedded_server,
)
from corr_pipeline.db.errors import DatabaseUnavailableError

__all__ = [
    "EMBEDDED_DATABASE",
    "EMBEDDED_SERVER_SETTINGS",
    "EMBEDDED_USER",
    "DatabaseUnavailableError",
    "EmbeddedServer",
    "database_url",
    "describe_url",
    "dispose_engines",
    "embedded_database_url",
    "embedded_server",
    "get_engine",
    "normalize_url",
    "redact_url",
    "release_embedded_server",
    "start_embedded_server",
]

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}


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


def release_embedded_server(pgdata: Path | None = None) -> None:
    """Give up this process's handle on the embedded server in ``pgdata`` (default home/pgdata).

    Cached engines are disposed first. The server stops if no other live process uses it
    (the same happens automatically at interpreter exit).
    """
    dispose_engines()
    embedded.release_embedded_server(pgdata)


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
    embedded.ensure_database(server, database)
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
