"""Where the daily prices come from: the project's own ``prices`` table, or a team's table or view.

A :class:`PriceSource` names a relation and its three columns — symbol, trade date, price, in
that order — as SQL identifiers::

    PriceSource.parse("market.eod_prices", "ticker,dt,adj_close")

Names follow PostgreSQL's identifier rules (what ``parse_ident`` does): an unquoted name folds
to lower case (``Market.EOD`` is ``market.eod``), a double-quoted one keeps its case and may
hold any character (``"Market Data"."EOD Prices"``; inside quotes, ``""`` is one quote). A relation
is ``name`` (found on the ``search_path``) or ``schema.name``. The names are never pasted into
SQL as text: every statement quotes them as identifiers (``psycopg.sql.Identifier`` or
SQLAlchemy's ``quoted_name(..., quote=True)``), and values travel as bound parameters.

:func:`resolve_price_source` checks the source against the catalog, in one short read: the
relation exists (table, view, materialized view, foreign table or partitioned table) and may be
read, the three columns exist, may be read and have usable types —

- symbol: a string type (``text``, ``varchar``, ``char(n)``, ``name``, ``citext``; a domain over
  one of them); read as ``text`` (``char(n)`` loses its trailing blanks, as its own comparisons
  ignore them);
- trade date: ``date``, ``timestamp`` or ``timestamp with time zone``. A ``timestamp`` becomes
  its calendar date (``::date``: the date as written, whatever the session's time zone); a
  ``timestamp with time zone`` becomes its date in :attr:`PriceSource.timezone` (``UTC`` unless
  configured: ``(col AT TIME ZONE tz)::date``), never in the session's ``TimeZone``, so the
  same rows always give the same dates;
- price: ``double precision``, ``real``, ``numeric`` or an integer type, read as ``double
  precision`` (``numeric`` is converted by PostgreSQL, correctly rounded; a NULL price counts
  as a bad price, like NaN).

Anything else raises :class:`PriceSourceError` whose message is one line naming the source and
what is wrong. The resolved source (:class:`ResolvedPriceSource`) builds the expressions the
readers need: ``psycopg.sql`` fragments for the window query (:mod:`corr_pipeline.db.window`)
and SQLAlchemy Core expressions for the small reads (:mod:`corr_pipeline.db.price_reads`, the query
layer). Its relation is always qualified with the schema the catalog found, so a later change
of ``search_path`` cannot redirect a read. Nothing here writes: the source is read-only.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.sql.elements import quoted_name

from corr_pipeline import settings

__all__ = [
    "NATIVE_PRICES",
    "PriceSource",
    "PriceSourceError",
    "ResolvedPriceSource",
    "SYSTEM_SCHEMAS",
    "configured_price_source",
    "parse_identifiers",
    "resolve_price_source",
]

#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1); we refuse them instead.
MAX_IDENTIFIER_BYTES = 63

_UNQUOTED = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")

#: Base type names accepted for each column (after resolving domains).
DATE_TYPES = ("date", "timestamp", "timestamptz")
PRICE_TYPES = ("float8", "float4", "numeric", "int2", "int4", "int8")
#: pg_class.relkind -> what it is called in messages.
RELATION_KINDS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
}


class PriceSourceError(ValueError):
    """The configured price source is malformed, missing, unreadable or of unusable types; the
    message is one line naming the source and the problem. Not retried: fix the configuration
    or the database."""


def _quote(name: str) -> str:
    """``name`` as a double-quoted SQL identifier (for display and ``to_regclass``)."""
    return '"' + name.replace('"', '""') + '"'


def _display(name: str) -> str:
    """``name`` as one would type it: bare when that reads back as the same name, else quoted."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return _quote(name)


def parse_identifiers(text: str, separator: str, what: str) -> list[str]:
    """Split ``text`` into SQL identifiers separated by ``separator`` (``.`` or ``,``), with
    PostgreSQL's rules: unquoted names fold ASCII letters to lower case; ``"..."`` keeps its
    text (``""`` inside is one quote). Whitespace around names is ignored. Raises
    :class:`PriceSourceError` naming ``what`` for anything else."""
    names: list[str] = []
    i, n = 0, len(text)

    def fail(problem: str) -> PriceSourceError:
        return PriceSourceError(f"{what}={text!r}: {problem}")

    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            j, chars = i + 1, []
            while True:
                if j >= n:
                    raise fail("unterminated quoted identifier")
                if text[j] == '"':
                    if j + 1 < n and text[j + 1] == '"':
                        chars.append('"')
                        j += 2
                        continue
                    break
                chars.append(text[j])
                j += 1
            name = "".join(chars)
            if not name:
                raise fail('empty quoted identifier ("")')
            i = j + 1
        else:
            match = _UNQUOTED.match(text, i)
            if match is None:
                found = repr(text[i]) if i < n else "the end"
                raise fail(f"expected a name at position {i + 1}, found {found}")
            name = match.group(0).translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                                          "abcdefghijklmnopqrstuvwxyz"))  # fmt: skip
            i = match.end()
        if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise fail(f"name {_quote(name)} is longer than {MAX_IDENTIFIER_BYTES} bytes")
        names.append(name)
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return names
        if text[i] != separator:
            raise fail(f"expected {separator!r} or the end at position {i + 1}, found {text[i]!r}")
        i += 1


@dataclass(frozen=True)
class PriceSource:
    """A relation and its symbol, trade-date and price columns (names as stored in the catalog,
    already case-folded). ``schema=None`` means "found on the search_path". ``timezone`` turns a
    ``timestamp with time zone`` trade-date column into dates (unused otherwise)."""

    table: str = "prices"
    schema: str | None = None
    symbol: str = "symbol"
    trade_date: str = "trade_date"
    price: str = "close"
    timezone: str = settings.DEFAULT_PRICES_TIMEZONE

    @classmethod
    def parse(
        cls,
        table: str,
        columns: str,
        timezone: str = settings.DEFAULT_PRICES_TIMEZONE,
        *,
        names: tuple[str, str, str] = (
            settings.ENV_PRICES_TABLE,
            settings.ENV_PRICES_COLUMNS,
            settings.ENV_PRICES_TIMEZONE,
        ),
    ) -> PriceSource:
        """Parse the three settings (see the module docstring); ``names`` are what the messages
        call them (the environment variables by default, resource fields in Dagster)."""
        relation = parse_identifiers(table, ".", names[0])
        if len(relation) > 2:
            raise PriceSourceError(
                f"{names[0]}={table!r}: expected name or schema.name, got {len(relation)} parts"
            )
        cols = parse_identifiers(columns, ",", names[1])
        if len(cols) != 3:
            raise PriceSourceError(
                f"{names[1]}={columns!r}: expected 3 columns (symbol, trade date, price, in that "
                f"order), got {len(cols)}"
            )
        if len(set(cols)) != 3:
            raise PriceSourceError(f"{names[1]}={columns!r}: the 3 columns must be different")
        tz = timezone.strip()
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise PriceSourceError(
                f"{names[2]}={timezone!r} is not a time zone name (e.g. UTC, America/New_York)"
            ) from None
        return cls(
            table=relation[-1],
            schema=relation[0] if len(relation) == 2 else None,
            symbol=cols[0],
            trade_date=cols[1],
            price=cols[2],
            timezone=tz,
        )

    @property
    def relation_name(self) -> str:
        """The relation as one would type it (``market.eod_prices``, ``"Odd Name"``)."""
        name = _display(self.table)
        return f"{_display(self.schema)}.{name}" if self.schema is not None else name

    @property
    def is_native(self) -> bool:
        """True for the project's own ``prices`` table with its own columns (the default)."""
        return (
            self.table == "prices"
            and self.schema in (None, "public")
            and (self.symbol, self.trade_date, self.price) == ("symbol", "trade_date", "close")
        )

    def __str__(self) -> str:
        cols = ", ".join(_display(c) for c in (self.symbol, self.trade_date, self.price))
        return f"{self.relation_name} ({cols})"


#: The project's own table (SPEC §1), the default source.
NATIVE_PRICES = PriceSource()


def configured_price_source() -> PriceSource:
    """The source the environment configures (:func:`settings.prices_table`,
    :func:`settings.prices_columns`, :func:`settings.prices_timezone`); parsed, not yet checked
    against a database. Raises :class:`PriceSourceError` naming the variable."""
    return PriceSource.parse(
        settings.prices_table(), settings.prices_columns(), settings.prices_timezone()
    )


@dataclass(frozen=True)
class SourceColumn:
    """One resolved column: its name, its declared type (as ``format_type`` shows it), the base
    type name after domains, and whether it may hold NULL."""

    name: str
    declared: str
    base: str
    nullable: bool
    #: False for a nondeterministic collation (e.g. case-insensitive ICU), whose equality would
    #: merge distinct symbols: the window then groups them byte-wise (``COLLATE "C"``).
    deterministic: bool = True


def _identifier(*names: str) -> sql.Composable:
    """``"a"."b"`` as a fragment of a statement executed with parameters: each name quoted as
    PostgreSQL quotes an identifier (``"`` doubled, as ``sql.Identifier`` does) and every ``%``
    doubled, so that psycopg's placeholder parser gives it back as one ``%`` instead of reading
    a placeholder (``sql.Identifier`` leaves ``%`` alone: a name with ``%`` broke the query).
    Every statement built from these fragments is executed with :meth:`params`."""
    quoted = ".".join('"' + name.replace('"', '""') + '"' for name in names)
    return sql.SQL(quoted.replace("%", "%%"))


@dataclass(frozen=True)
class ResolvedPriceSource:
    """A :class:`PriceSource` checked against the catalog (see :func:`resolve_price_source`)."""

    source: PriceSource
    schema: str
    kind: str
    symbol: SourceColumn
    trade_date: SourceColumn
    price: SourceColumn
    #: Advice that does not stop a run (e.g. no index on the trade-date column).
    notes: tuple[str, ...] = field(default=())

    # ---- psycopg.sql fragments (the window query) -----------------------------------------

    def relation_sql(self) -> sql.Composable:
        return _identifier(self.schema, self.source.table)

    def column_sql(self, name: str, alias: str | None = None) -> sql.Composable:
        return _identifier(alias, name) if alias else _identifier(name)

    def day_sql(self, expr: sql.Composable) -> sql.Composable:
        """The trade date (``date``) of a trade-date value ``expr``; uses ``%(tz)s``."""
        if self.trade_date.base == "date":
            return expr
        if self.trade_date.base == "timestamp":
            return sql.SQL("({})::date").format(expr)
        return sql.SQL("({} AT TIME ZONE %(tz)s)::date").format(expr)

    def day_start_sql(self, day: sql.Composable) -> sql.Composable:
        """The first trade-date value of the date ``day`` (a date expression), in the column's
        own type, so ``col < day_start(d)`` is an index range condition on the raw column."""
        if self.trade_date.base == "date":
            return day
        if self.trade_date.base == "timestamp":
            return sql.SQL("({})::timestamp").format(day)
        return sql.SQL("(({})::timestamp AT TIME ZONE %(tz)s)").format(day)

    def symbol_sql(self, alias: str | None = None) -> sql.Composable:
        """The symbol as ``text``, grouped byte-wise: a deterministic collation's equality is
        byte equality already; a nondeterministic one gets ``COLLATE "C"``. (An explicit
        ``COLLATE`` would keep ``postgres_fdw`` from pushing the aggregate down, so it is only
        added where it changes the groups.)"""
        col = self.column_sql(self.source.symbol, alias)
        expr = col if self.symbol.base == "text" else sql.SQL("({})::text").format(col)
        if not self.symbol.deterministic:
            expr = sql.SQL('({} COLLATE "C")').format(expr)
        return expr

    def price_sql(self, alias: str | None = None) -> sql.Composable:
        """The price as ``double precision`` (NULL stays NULL: the window counts a NULL price as
        a bad price, like NaN, without ``coalesce``, which ``postgres_fdw`` would not push
        down)."""
        col = self.column_sql(self.source.price, alias)
        return col if self.price.base == "float8" else sql.SQL("({})::float8").format(col)

    def params(self) -> dict[str, Any]:
        """Bound parameters the fragments may use."""
        return {"tz": self.source.timezone}

    # ---- SQLAlchemy Core (small reads) ----------------------------------------------------

    def table_clause(self) -> sa.TableClause:
        """The relation as a SQLAlchemy table with the three columns, every name force-quoted."""
        return sa.table(
            quoted_name(self.source.table, quote=True),
            sa.column(quoted_name(self.source.symbol, quote=True)),
            sa.column(quoted_name(self.source.trade_date, quote=True)),
            sa.column(quoted_name(self.source.price, quote=True)),
            schema=quoted_name(self.schema, quote=True),
        )

    def symbol_expr(self, table: sa.TableClause) -> sa.ColumnElement[Any]:
        col = table.c[self.source.symbol]
        return col if self.symbol.base == "text" else sa.cast(col, sa.Text)

    def raw_date_column(self, table: sa.TableClause) -> sa.ColumnElement[Any]:
        return table.c[self.source.trade_date]

    def day_expr(self, expr: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """The trade date of a trade-date value (``expr`` may be ``min(col)``: monotone)."""
        if self.trade_date.base == "date":
            return expr
        if self.trade_date.base == "timestamp":
            return sa.cast(expr, sa.Date)
        return sa.cast(sa.func.timezone(self.source.timezone, expr), sa.Date)

    def day_start_expr(self, day: Any) -> sa.ColumnElement[Any]:
        """The first trade-date value of date ``day`` in the column's type (see
        :meth:`day_start_sql`)."""
        literal = sa.literal(day, sa.Date)
        if self.trade_date.base == "date":
            return literal
        start = sa.cast(literal, sa.DateTime)
        if self.trade_date.base == "timestamp":
            return start
        return sa.func.timezone(self.source.timezone, start)

    def describe(self) -> str:
        """``market.eod_prices (ticker, dt, adj_close)``, a view, ... for logs and metadata."""
        return f"{self.kind} {self.source}"


def _columns_statement() -> sa.TextClause:
    return sa.text(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
               a.atttypid, has_column_privilege(a.attrelid, a.attnum, 'SELECT'),
               coalesce((SELECT c.collisdeterministic FROM pg_collation c
                         WHERE c.oid = a.attcollation), true)
        FROM pg_attribute a
        WHERE a.attrelid = :oid AND a.attnum > 0 AND NOT a.attisdropped
        """
    )


def _base_type(conn: sa.Connection, type_oid: int) -> tuple[str, str]:
    """``(typname, typcategory)`` of ``type_oid`` after following domains to their base."""
    for _ in range(32):
        typname, category, typtype, base = conn.execute(
            sa.text(
                "SELECT typname, typcategory, typtype, typbasetype FROM pg_type WHERE oid = :oid"
            ),
            {"oid": type_oid},
        ).one()
        if typtype != "d":
            return str(typname), str(category)
        type_oid = int(base)
    raise PriceSourceError(f"type {type_oid}: domain chain too deep")  # pragma: no cover


#: Schemas whose relations are never a price source (``pg_authid`` and the like): the catalog
#: found on every search_path, and the SQL-standard views of it (``pg_toast*`` and ``pg_temp*``
#: are refused by prefix).
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")


def _lock_relation(
    conn: sa.Connection, oid: int, relkind: str, schema: str, source: PriceSource, where: str
) -> None:
    """Take the relation's ``ACCESS SHARE`` lock for the rest of the transaction, so that no
    ``CREATE OR REPLACE VIEW``, ``ALTER`` or ``DROP`` can change what the catalog checks found
    before the window is read; PriceSourceError if the name no longer means the relation checked
    (replaced in between). Skipped where ``LOCK`` does not apply (a foreign table) or is not
    allowed (a role with column privileges only): those read without the lock."""
    if (
        relkind == "f"
        or not conn.execute(
            sa.text("SELECT has_table_privilege(:oid, 'SELECT')"), {"oid": oid}
        ).scalar_one()
    ):
        return
    relation = sql.Identifier(schema, source.table)
    with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(relation))
    now = conn.execute(
        sa.text("SELECT to_regclass(:name)::oid"),
        {"name": f"{_quote(schema)}.{_quote(source.table)}"},
    ).scalar()
    if now is None or int(now) != oid:
        raise PriceSourceError(
            f"{where}: {source.relation_name} was replaced while it was checked: run again"
        )


def resolve_price_source(conn: sa.Connection, source: PriceSource) -> ResolvedPriceSource:
    """Check ``source`` against the catalog on ``conn`` (read-only catalog queries; see the
    module docstring) and return the resolved source, or raise :class:`PriceSourceError`."""
    where = f"price source {source}"
    found = _find_relation(conn, source, where)
    oid, schema, relkind = int(found[0]), str(found[1]), str(found[2])
    if schema in SYSTEM_SCHEMAS or schema.startswith(("pg_toast", "pg_temp")):
        raise PriceSourceError(
            f"{where}: {source.relation_name} is in the system schema {_display(schema)}, "
            "never a price source: name your own table or view"
        )
    kind = RELATION_KINDS.get(relkind)
    if kind is None:
        raise PriceSourceError(
            f"{where}: {source.relation_name} is not a table or view (relkind {relkind!r})"
        )
    if not conn.execute(
        sa.text("SELECT has_table_privilege(:oid, 'SELECT') OR has_any_column_privilege(:oid, "
                "'SELECT')"),
        {"oid": oid},
    ).scalar_one():  # fmt: skip
        raise PriceSourceError(f"{where}: no SELECT privilege on {kind} {source.relation_name}")
    _lock_relation(conn, oid, relkind, schema, source, where)
    rows = {str(r[0]): r for r in conn.execute(_columns_statement(), {"oid": oid})}

    column = partial(_column, conn, rows, f"{where}: {kind} {source.relation_name}", where)
    symbol = column(
        source.symbol,
        "symbol",
        "a string type (text, varchar, char)",
        lambda base, category: category == "S",
    )
    trade_date = column(
        source.trade_date,
        "trade date",
        "date, timestamp or timestamp with time zone",
        lambda base, category: base in DATE_TYPES,
    )
    price = column(
        source.price,
        "price",
        "numeric, double precision, real or an integer type",
        lambda base, category: base in PRICE_TYPES,
    )
    notes = _index_notes(conn, oid, relkind, kind, source)
    return ResolvedPriceSource(
        source=source,
        schema=schema,
        kind=kind,
        symbol=symbol,
        trade_date=trade_date,
        price=price,
        notes=notes,
    )


def _find_relation(conn: sa.Connection, source: PriceSource, where: str) -> sa.Row:
    """``(oid, schema, relkind)`` of the relation ``source`` names (its schema, else the
    search_path); :class:`PriceSourceError` naming what is missing."""
    if source.schema is not None:
        schema_oid = conn.execute(
            sa.text("SELECT oid FROM pg_namespace WHERE nspname = :s"), {"s": source.schema}
        ).scalar()
        if schema_oid is None:
            raise PriceSourceError(f"{where}: schema {_display(source.schema)} does not exist")
        qualified = f"{_quote(source.schema)}.{_quote(source.table)}"
    else:
        qualified = _quote(source.table)
    found = conn.execute(
        sa.text(
            """
            SELECT c.oid, n.nspname, c.relkind
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = to_regclass(:name)
            """
        ),
        {"name": qualified},
    ).first()
    if found is not None:
        return found
    if source.schema is None:
        path = conn.execute(sa.text("SELECT current_schemas(false)")).scalar_one()
        searched = ", ".join(path) or "(empty)"
        raise PriceSourceError(
            f"{where}: no table or view {source.relation_name} on the search_path ({searched})"
        )
    raise PriceSourceError(f"{where}: table or view {source.relation_name} does not exist")


def _column(
    conn: sa.Connection,
    rows: dict[str, Any],
    relation: str,
    where: str,
    name: str,
    role: str,
    accepted: str,
    ok: Callable[[str, str], bool],
) -> SourceColumn:
    """The column ``name`` of the relation (``rows``: its catalog rows by name; ``relation``:
    "price source ...: kind name") in the ``role`` of the symbol, trade date or price, whose
    base type and category ``ok`` accepts; :class:`PriceSourceError` saying what is wrong."""
    row = rows.get(name)
    if row is None:
        available = ", ".join(_display(c) for c in rows) or "none"
        raise PriceSourceError(
            f"{relation} has no column {_display(name)} "
            f"(the {role} column; its columns: {available})"
        )
    declared, nullable, type_oid, readable = str(row[1]), bool(row[2]), int(row[3]), row[4]
    deterministic = bool(row[5])
    if not readable:
        raise PriceSourceError(f"{where}: no SELECT privilege on column {_display(name)}")
    base, category = _base_type(conn, type_oid)
    if not ok(base, category):
        raise PriceSourceError(
            f"{where}: the {role} column {_display(name)} is {declared}; expected {accepted}"
        )
    return SourceColumn(
        name=name, declared=declared, base=base, nullable=nullable, deterministic=deterministic
    )


def _index_notes(
    conn: sa.Connection, oid: int, relkind: str, kind: str, source: PriceSource
) -> tuple[str, ...]:
    """Advice when a table (not a view) has no index leading with the trade-date column."""
    if relkind not in ("r", "p", "m"):
        return ()
    indexed = conn.execute(
        sa.text(
            """
            SELECT EXISTS (
                SELECT 1 FROM pg_index i JOIN pg_attribute a
                  ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = :oid AND a.attname = :col)
            """
        ),
        {"oid": oid, "col": source.trade_date},
    ).scalar_one()
    if indexed:
        return ()
    return (
        f"{kind} {source.relation_name} has no index leading with "
        f"{_display(source.trade_date)}: the window's date scan reads the table once per "
        f"window date (CREATE INDEX ON {source.relation_name} "
        f"({_display(source.trade_date)}) makes it a few index probes)",
    )
