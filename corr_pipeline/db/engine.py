"""Which PostgreSQL to talk to, and SQLAlchemy engines for it.

Two modes:

1. ``$CORR_PIPELINE_DATABASE_URL`` is set: that server is used as is
   (``postgresql://`` and ``postgres://`` are normalised to the psycopg 3 driver,
   ``postgresql+psycopg://``).
2. Otherwise the **embedded PostgreSQL** in ``$CORR_PIPELINE_HOME/pgdata`` is started, or
   attached to if it is already running (:mod:`corr_pipeline.dbserver`: a private Unix
   socket, no TCP, shared by local processes, stopped when the last one is done). It serves a
   database named ``corr_pipeline`` (created on first use).

Credentials never appear in messages. URLs are parsed and rendered by SQLAlchemy only
(:func:`sqlalchemy.engine.make_url`, ``URL.render_as_string(hide_password=True)``), never taken
apart by hand: :func:`redact_url` is what a message may show, :func:`describe_url` the short
``host:port/database``. Driver messages are scrubbed of the password itself
(:func:`hide_secrets`), and connection failures are re-raised as
:class:`DatabaseUnavailableError` without the driver exception chained to it. A URL SQLAlchemy
cannot parse, or one where an unencoded ``@`` or ``/`` in the user name or password made it take
part of them for the host or the database, is refused without being shown.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from corr_pipeline import dbserver, settings
from corr_pipeline.dbserver import (
    EMBEDDED_DATABASE,
    EMBEDDED_SERVER_SETTINGS,
    EMBEDDED_USER,
    EmbeddedServer,
    embedded_server,
    start_embedded_server,
)
from corr_pipeline.dbserver.errors import DatabaseUnavailableError

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
    "hide_secrets",
    "libpq_connection",
    "normalize_url",
    "parse_url",
    "redact_url",
    "release_embedded_server",
    "secret_texts",
    "start_embedded_server",
]

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}


# --------------------------------------------------------------------------------------------
# URL helpers
# --------------------------------------------------------------------------------------------

HIDDEN = "***"
#: Query parameters libpq takes secrets from (``?password=...``).
SECRET_QUERY_KEYS = ("password", "sslpassword")
_ENCODING_HINT = (
    "percent-encode special characters of the user name and password: '@' as %40, ':' as %3A, "
    "'/' as %2F, '%' as %25, a space as %20"
)


def parse_url(url: str | URL) -> URL:
    """``url`` parsed by SQLAlchemy (:func:`~sqlalchemy.engine.make_url`).

    Raises ValueError, *without* any part of the URL in the message, when SQLAlchemy cannot
    parse it or when an unencoded ``@`` or ``/`` in the user name or password made it read part
    of them as the host or the database (``postgresql://u:p@ss@host/db`` has the host ``ss@host``):
    such a URL would put a piece of the password in messages and in the server's host name.
    """
    if isinstance(url, URL):
        parsed = url
    else:
        try:
            parsed = make_url(url.strip())
        except Exception:  # sqlalchemy.exc.ArgumentError and friends
            raise ValueError(
                "not a valid database URL (expected postgresql://user:password@host:port/database; "
                f"{_ENCODING_HINT}); it is not shown because it may contain a password"
            ) from None
    if "@" in (parsed.host or "") or "@" in (parsed.database or ""):
        raise ValueError(
            "not a valid database URL: an unencoded '@' or '/' in the user name or password "
            f"made part of them look like the host or the database; {_ENCODING_HINT} (the URL "
            "is not shown because it contains a password)"
        )
    return parsed


def _with_hidden_query(parsed: URL) -> URL:
    secret = {key: HIDDEN for key in SECRET_QUERY_KEYS if key in parsed.query}
    return parsed.update_query_dict(secret) if secret else parsed


def redact_url(url: str | URL | None) -> str:
    """What a message may show of ``url``: SQLAlchemy's rendering with the password hidden
    (``user:***@host``), ``?password=`` and ``?sslpassword=`` values too. A URL that
    :func:`parse_url` refuses is not shown at all."""
    if url is None:
        return "<none>"
    try:
        parsed = parse_url(url)
    except ValueError:
        return "<a database URL that cannot be parsed>"
    rendered = _with_hidden_query(parsed).render_as_string(hide_password=True)
    # render_as_string percent-encodes query values; show the placeholder as is
    return rendered.replace("=" + quote_plus(HIDDEN), "=" + HIDDEN)


def _password_forms(parsed: URL) -> list[str]:
    """The password (and query secrets) of ``parsed`` in every form a text may hold them:
    decoded, and percent-encoded as a user would type them or a renderer would write them."""
    secrets = [parsed.password] + [parsed.query.get(key) for key in SECRET_QUERY_KEYS]
    forms: set[str] = set()
    for secret in secrets:
        for value in secret if isinstance(secret, tuple) else (secret,):
            if value:
                text = str(value)
                forms.update({text, quote(text, safe=""), quote(text, safe=" +"), quote_plus(text)})
    return sorted(forms, key=len, reverse=True)


def secret_texts(*urls: str | URL | None) -> list[str]:
    """The passwords (and query secrets) of each of ``urls`` and of
    ``$CORR_PIPELINE_DATABASE_URL``, in every form a text may hold them (decoded or
    percent-encoded), longest first; a URL that cannot be parsed contributes nothing."""
    forms: set[str] = set()
    for url in (*urls, settings.database_url_from_env()):
        if url is None:
            continue
        try:
            parsed = url if isinstance(url, URL) else make_url(str(url).strip())
        except Exception:
            continue
        forms.update(_password_forms(parsed))
    return sorted(forms, key=len, reverse=True)


def hide_secrets(text: str, *urls: str | URL | None) -> str:
    """``text`` with the password of each of ``urls`` and of ``$CORR_PIPELINE_DATABASE_URL``
    replaced by ``***`` wherever it appears (decoded or percent-encoded, :func:`secret_texts`).
    A last line of defence for text we did not write (driver messages, the errors a run's
    events record): our own messages never contain a password."""
    for secret in secret_texts(*urls):
        text = text.replace(secret, HIDDEN)
    return text


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for plain ``postgresql://`` / ``postgres://`` URLs.

    Raises ValueError (never showing the password) for a URL :func:`parse_url` refuses or one
    that is not PostgreSQL's.
    """
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "postgres"):
        raise ValueError(
            f"corr_pipeline needs PostgreSQL, got a {backend!r} URL: {redact_url(parsed)}"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def libpq_connection(url: str | URL) -> tuple[str, dict[str, str]]:
    """``(uri, env)`` for a libpq program (``psql``, ``pg_dump``) to reach ``url``: the libpq URI
    (``postgresql://user@host:port/db?host=/socket/dir``, no driver, no password) and the
    environment that carries the password (``PGPASSWORD``), so that the password appears
    neither on a command line nor in messages."""
    parsed = parse_url(url)
    password = parsed.password
    if password is None and "password" in parsed.query:
        password = str(parsed.query["password"])
    plain = parsed._replace(drivername="postgresql", password=None).difference_update_query(
        list(parsed.query)
    )
    # libpq decodes %XX in query values but not "+" (SQLAlchemy's encoding of a space)
    query = "&".join(
        f"{quote(key, safe='')}={quote(str(value), safe='')}"
        for key, values in parsed.query.items()
        if key != "password"
        for value in (values if isinstance(values, tuple) else (values,))
    )
    env = {"PGPASSWORD": str(password)} if password is not None else {}
    uri = plain.render_as_string(hide_password=False)
    return (f"{uri}?{query}" if query else uri), env


def describe_url(url: str | URL) -> str:
    """Short human description ``host[:port]/database`` for messages (no credentials)."""
    try:
        parsed = parse_url(url)
    except ValueError:
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
    dbserver.release_embedded_server(pgdata)


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
    dbserver.ensure_database(server, database)
    return server.url(database)


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailableError:
    orig = getattr(exc, "orig", None) or exc
    detail = hide_secrets(" ".join(str(orig).split()), url)  # one line
    if len(detail) > 400:
        detail = detail[:400] + "..."
    env_url = settings.database_url_from_env()
    try:
        from_env = env_url is not None and normalize_url(env_url) == url
    except ValueError:
        from_env = False
    embedded = env_url is None and parse_url(url).host is None
    if from_env:
        fix = (
            f"check {settings.ENV_DATABASE_URL} (host, port, database, user, password) and that "
            "the server is running and reachable"
        )
    elif embedded:
        fix = (
            f"check that the embedded server in {settings.pgdata_dir()} is running "
            f"(its log is {settings.pgdata_dir() / 'log'})"
        )
    else:
        fix = (
            "check the database URL you configured (the postgres resource's database_url: host, "
            "port, database, user, password) and that the server is running and reachable"
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
