"""Bulk loading helpers shared by the CSV import and the synthetic universe loader.

Rows go into PostgreSQL with ``COPY ... FROM STDIN`` (psycopg 3) into a staging table inside the
caller's transaction, then one ``INSERT ... SELECT ... ON CONFLICT`` moves them into ``prices``.
Everything happens on the caller's SQLAlchemy connection, so a failure anywhere rolls back the
whole load (SPEC §1: load nothing from input that fails validation).

Typical use::

    with engine.begin() as conn:
        staging = create_prices_staging(conn)                 # typed TEMP table, dropped at commit
        copy_text(conn, staging, ["symbol", "trade_date", "close"], chunks)   # COPY text format
        inserted, updated = upsert_prices_from_staging(conn, staging)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from psycopg import sql

PRICE_COLUMNS = ("symbol", "trade_date", "close")


def driver_connection(conn: sa.Connection) -> Any:
    """The psycopg 3 connection under a SQLAlchemy connection (same transaction)."""
    dbapi = conn.connection.driver_connection
    if dbapi is None or not hasattr(dbapi, "cursor"):
        raise TypeError("expected a SQLAlchemy connection using the psycopg 3 driver")
    return dbapi


def _table_identifier(table_name: str) -> sql.Identifier:
    return sql.Identifier(*table_name.split("."))


def copy_text(
    conn: sa.Connection,
    table_name: str,
    columns: Sequence[str],
    chunks: Iterable[str | bytes],
    *,
    format: str = "text",
    options: str = "",
) -> int:
    """Stream ``chunks`` into ``table_name(columns)`` with ``COPY ... FROM STDIN``.

    ``chunks`` are pieces of the COPY payload in the given ``format`` (``text``: tab-separated
    fields, ``\\N`` for NULL, one row per ``\\n``-terminated line; ``csv``: RFC 4180). Chunk
    boundaries need not align with rows. ``options`` is appended verbatim inside ``WITH (...)``
    after the format (e.g. ``"HEADER true"``); it must be a constant, never user input.

    Runs in the caller's transaction. Returns the number of rows COPY reported.
    Raises psycopg errors (e.g. ``psycopg.errors.BadCopyFileFormat``) untouched: callers that
    want line numbers read them from ``exc.diag.context`` (see prices_import).
    """
    if format not in ("text", "csv"):
        raise ValueError(f"copy format must be 'text' or 'csv', got {format!r}")
    with_clause: sql.Composable = sql.SQL(format.upper())
    if options:
        with_clause = sql.SQL("{}, {}").format(with_clause, sql.SQL(options))
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT {})").format(
        _table_identifier(table_name),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        with_clause,
    )
    dbapi = driver_connection(conn)
    with dbapi.cursor() as cursor:
        with cursor.copy(statement) as copy:
            for chunk in chunks:
                if chunk:
                    copy.write(chunk)
        return int(cursor.rowcount)


def create_prices_staging(
    conn: sa.Connection, name: str = "prices_staging", *, typed: bool = True
) -> str:
    """Create a TEMP staging table ``name`` for price rows, dropped at commit; return its name.

    ``typed=True``: (symbol text, trade_date date, close double precision) for generated data.
    ``typed=False``: (line bigint identity, symbol text, trade_date text, close text) for raw CSV
    text that still has to be validated; ``line`` numbers the rows in COPY order starting at 1.
    """
    conn.execute(sa.text(f'DROP TABLE IF EXISTS pg_temp."{name}"'))
    if typed:
        body = "symbol text, trade_date date, close double precision"
    else:
        body = "line bigint GENERATED ALWAYS AS IDENTITY, symbol text, trade_date text, close text"
    conn.execute(sa.text(f'CREATE TEMP TABLE "{name}" ({body}) ON COMMIT DROP'))
    return name


def upsert_prices_from_staging(conn: sa.Connection, staging: str) -> tuple[int, int]:
    """Move every row of ``staging(symbol, trade_date, close)`` into ``prices``.

    New keys are inserted; existing keys whose close differs (``IS DISTINCT FROM``, so NaN = NaN)
    are updated; identical rows are left alone. Returns ``(inserted, updated)``; unchanged rows
    are ``rows - inserted - updated``. ``xmax = 0`` on a RETURNING row means it was inserted
    rather than updated. The staging columns may be text (they are cast) or already typed.

    The staging table must not hold the same (symbol, trade_date) twice (PostgreSQL raises
    "ON CONFLICT DO UPDATE command cannot affect row a second time" in most such cases; callers
    validate first). Runs in the caller's transaction.
    """
    statement = sql.SQL(
        """
        WITH upserted AS (
            INSERT INTO prices AS p (symbol, trade_date, close)
            SELECT s.symbol, s.trade_date::date, s.close::double precision FROM {} AS s
            ON CONFLICT (symbol, trade_date) DO UPDATE SET close = EXCLUDED.close
            WHERE p.close IS DISTINCT FROM EXCLUDED.close
            RETURNING (xmax = 0) AS inserted
        )
        SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted)
        FROM upserted
        """
    ).format(_table_identifier(staging))
    dbapi = driver_connection(conn)
    with dbapi.cursor() as cursor:
        cursor.execute(statement)
        row = cursor.fetchone()
    return int(row[0]), int(row[1])


def format_copy_text_value(value: object) -> str:
    """One field in COPY text format: ``\\N`` for None, escaped backslash/tab/newline/CR,
    floats with ``repr`` (round-trips float64 exactly; NaN/inf spelled as PostgreSQL reads them)."""
    if value is None:
        return "\\N"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = (
            text.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return text
