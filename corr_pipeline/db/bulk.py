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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


#: Per-column SELECT expressions used when loading from a text staging table in strict mode:
#: a value that fails a rule becomes NULL, which the NOT NULL columns of ``prices`` reject, and
#: a value that does not parse fails its cast. Either way the statement errors and nothing loads.
STRICT_TEXT_EXPRESSIONS = {
    "symbol": "CASE WHEN s.symbol <> '' AND s.symbol = btrim(s.symbol, E' \\t') THEN s.symbol END",
    "trade_date": (
        "CASE WHEN s.trade_date ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN s.trade_date::date END"
    ),
    "close": "s.close::double precision",
}
_CAST_EXPRESSIONS = {
    "symbol": "s.symbol",
    "trade_date": "s.trade_date::date",
    "close": "s.close::double precision",
}


@dataclass(frozen=True)
class LoadCounts:
    """Rows written by :func:`load_prices_from_staging`.

    inserted: new (symbol, trade_date) keys; updated: existing keys whose close was overwritten;
    bad_closes: *written* rows whose close is non-positive, NaN or infinite (SPEC §1: accepted,
    counted, turned into NaN returns downstream). With ``skip_unchanged`` the rows left alone are
    in neither count.
    """

    inserted: int
    updated: int
    bad_closes: int


def load_prices_from_staging(
    conn: sa.Connection,
    staging: str,
    *,
    upsert: bool = True,
    skip_unchanged: bool = False,
    strict_text: bool = False,
) -> LoadCounts:
    """Insert the rows of ``staging(symbol, trade_date, close)`` into ``prices`` in one statement.

    - ``upsert=True``: ``ON CONFLICT (symbol, trade_date) DO UPDATE SET close = EXCLUDED.close``;
      ``xmax = 0`` on a RETURNING row tells an insert from an update. Without ``skip_unchanged``
      a key that appears twice in ``staging`` always raises
      ``psycopg.errors.CardinalityViolation`` ("ON CONFLICT DO UPDATE command cannot affect row a
      second time"): the first copy inserts or updates the row, the second hits a row this very
      statement wrote.
    - ``skip_unchanged=True`` (with ``upsert``): rows whose key exists with the same close
      (``IS NOT DISTINCT FROM``, so NaN = NaN) are filtered out by an anti-join before the
      insert, so re-loading known data costs a read instead of a new row version and two index
      entries per row. The caller must have checked that ``staging`` has no repeated key (a
      repeat of an unchanged row would be filtered out instead of raising).
    - ``upsert=False``: a plain INSERT (the fastest); any key already in ``prices`` or repeated
      in ``staging`` raises ``psycopg.errors.UniqueViolation``. Use it when the keys are new.
    - ``strict_text=True``: the staging columns are raw text checked by
      :data:`STRICT_TEXT_EXPRESSIONS` (non-empty symbol without surrounding whitespace, ISO
      ``YYYY-MM-DD`` date); violations raise ``psycopg.errors.NotNullViolation`` or a cast error.
      Otherwise the columns are typed or plain-cast.

    Runs in the caller's transaction; on error the caller's transaction (or savepoint) must be
    rolled back, nothing of this statement remains.
    """
    expressions = STRICT_TEXT_EXPRESSIONS if strict_text else _CAST_EXPRESSIONS
    conflict = (
        "ON CONFLICT (symbol, trade_date) DO UPDATE SET close = EXCLUDED.close" if upsert else ""
    )
    where = ""
    if upsert and skip_unchanged:
        where = (
            "WHERE NOT EXISTS (SELECT 1 FROM prices AS p WHERE p.symbol = s.symbol "
            f"AND p.trade_date = {expressions['trade_date']} "
            f"AND p.close IS NOT DISTINCT FROM {expressions['close']})"
        )
    statement = sql.SQL(
        """
        WITH loaded AS (
            INSERT INTO prices (symbol, trade_date, close)
            SELECT {symbol}, {trade_date}, {close} FROM {staging} AS s
            {where}
            {conflict}
            RETURNING (xmax = 0) AS inserted, close
        )
        SELECT count(*) FILTER (WHERE inserted),
               count(*) FILTER (WHERE NOT inserted),
               count(*) FILTER (WHERE NOT (close > 0 AND close < 'Infinity'::double precision))
        FROM loaded
        """
    ).format(
        staging=_table_identifier(staging),
        where=sql.SQL(where),  # type: ignore[arg-type]
        conflict=sql.SQL(conflict),  # type: ignore[arg-type]
        **{name: sql.SQL(expr) for name, expr in expressions.items()},  # type: ignore[arg-type]
    )
    dbapi = driver_connection(conn)
    with dbapi.cursor() as cursor:
        cursor.execute(statement)
        row = cursor.fetchone()
    return LoadCounts(inserted=int(row[0]), updated=int(row[1]), bad_closes=int(row[2]))


def upsert_prices_from_staging(conn: sa.Connection, staging: str) -> tuple[int, int]:
    """Upsert ``staging(symbol, trade_date, close)`` (typed or text) into ``prices``; return
    ``(inserted, updated)``. See :func:`load_prices_from_staging` (``upsert=True``)."""
    counts = load_prices_from_staging(conn, staging, upsert=True)
    return counts.inserted, counts.updated


@dataclass(frozen=True)
class _IndexDefinition:
    name: str
    index_def: str  # CREATE [UNIQUE] INDEX ... (pg_get_indexdef)
    constraint_def: str | None  # PRIMARY KEY (...) / UNIQUE (...) when constraint-backed


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def prices_indexes_deferred_if_empty(
    conn: sa.Connection, *, index_memory: str = "512MB"
) -> Iterator[bool]:
    """Bulk-load helper: when ``prices`` is empty, drop its indexes (primary key included) for
    the body and rebuild them afterwards; yields whether it did.

    Building a B-tree over loaded rows is 2-3x cheaper than maintaining it row by row
    (PostgreSQL manual, "Populating a Database"). The table is locked ``ACCESS EXCLUSIVE`` for
    the rest of the transaction (nobody sees it without its indexes) and emptiness is re-checked
    under the lock. Indexes keep their names and definitions. When ``prices`` has rows, or
    another table has a foreign key to it, nothing is dropped and the body runs as is (yields
    False). If the body raises, nothing is rebuilt: the caller must roll back the transaction
    or a savepoint taken before entering, which restores the indexes. Rebuilding the primary key
    raises ``psycopg.errors.UniqueViolation`` if the body loaded a key twice.
    """
    dbapi = driver_connection(conn)
    empty = dbapi.execute("SELECT NOT EXISTS (SELECT 1 FROM prices)").fetchone()[0]
    referenced = dbapi.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint "
        "WHERE confrelid = 'prices'::regclass AND contype = 'f')"
    ).fetchone()[0]
    if not empty or referenced:
        yield False
        return
    dbapi.execute("LOCK TABLE prices IN ACCESS EXCLUSIVE MODE")
    if not dbapi.execute("SELECT NOT EXISTS (SELECT 1 FROM prices)").fetchone()[0]:
        yield False  # someone loaded rows between the check and the lock
        return
    rows = dbapi.execute(
        """
        SELECT ci.relname, pg_get_indexdef(i.indexrelid), pg_get_constraintdef(c.oid)
        FROM pg_index i
        JOIN pg_class ci ON ci.oid = i.indexrelid
        LEFT JOIN pg_constraint c
               ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
              AND c.contype IN ('p', 'u', 'x')
        WHERE i.indrelid = 'prices'::regclass
        ORDER BY i.indisprimary DESC, ci.relname
        """
    ).fetchall()
    indexes = [
        _IndexDefinition(name, index_def, constraint) for name, index_def, constraint in rows
    ]
    for index in indexes:
        if index.constraint_def is not None:
            dbapi.execute(f"ALTER TABLE prices DROP CONSTRAINT {_quote_ident(index.name)}")
        else:
            dbapi.execute(f"DROP INDEX {_quote_ident(index.name)}")
    yield True
    dbapi.execute(f"SET LOCAL maintenance_work_mem = '{index_memory}'")
    for index in indexes:
        if index.constraint_def is not None:
            dbapi.execute(
                f"ALTER TABLE prices ADD CONSTRAINT {_quote_ident(index.name)} "
                f"{index.constraint_def}"
            )
        else:
            dbapi.execute(index.index_def)


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
