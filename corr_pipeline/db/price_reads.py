"""Reads of the price source (SQLAlchemy Core): its extent and trade dates, and how complete one
session's prices are (:func:`session_prices`, for the sensor that starts a snapshot when the day's
prices are in). They use the project's ``prices`` table by default, or the ``source`` they are
given (a :class:`~corr_pipeline.db.price_source.PriceSource`, resolved against the catalog first,
so a misconfigured source raises :class:`~corr_pipeline.db.price_source.PriceSourceError`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by

from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource, resolve_price_source

__all__ = [
    "PricesExtent",
    "SessionPrices",
    "count_trade_dates",
    "latest_trade_date",
    "nth_trade_date",
    "prices_extent",
    "session_prices",
    "trade_dates",
]


@dataclass(frozen=True)
class PricesExtent:
    """What the price source holds: row count, distinct symbols, first and last ``trade_date``
    (``None`` when it is empty)."""

    rows: int
    symbols: int
    first: dt.date | None
    last: dt.date | None


def prices_extent(engine: sa.Engine, source: PriceSource = NATIVE_PRICES) -> PricesExtent:
    """Row count, distinct symbols and date range of the price source, in one statement."""
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        raw_date = src.raw_date_column(table)
        statement = sa.select(
            sa.func.count(),
            sa.func.count(sa.distinct(src.symbol_expr(table))),
            src.day_expr(sa.func.min(raw_date)),
            src.day_expr(sa.func.max(raw_date)),
        ).select_from(table)
        rows, symbols, first, last = conn.execute(statement).one()
    return PricesExtent(rows=int(rows), symbols=int(symbols), first=first, last=last)


def latest_trade_date(engine: sa.Engine, source: PriceSource = NATIVE_PRICES) -> dt.date | None:
    """The last trade date of the price source; ``None`` when it is empty."""
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        last: dt.date | None = conn.execute(
            sa.select(src.day_expr(sa.func.max(src.raw_date_column(table)))).select_from(table)
        ).scalar_one()
    return last


def count_trade_dates(
    engine: sa.Engine,
    on_or_before: dt.date | str,
    limit: int,
    source: PriceSource = NATIVE_PRICES,
) -> int:
    """How many distinct trade dates the price source has on or before ``on_or_before``,
    counting at most the ``limit`` latest ones (so the answer is ``min(limit, all of them)``).

    ``on_or_before`` is a date or an ISO ``YYYY-MM-DD`` string (ValueError otherwise).
    """
    day = as_iso_date(on_or_before, "on_or_before")
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        raw_date = src.raw_date_column(table)
        trade_date = src.day_expr(raw_date).label("trade_date")
        window = (
            sa.select(trade_date)
            .distinct()
            .where(raw_date < src.day_start_expr(day + dt.timedelta(days=1)))
            .order_by(trade_date.desc())
            .limit(int(limit))
            .subquery("w")
        )
        return int(conn.execute(sa.select(sa.func.count()).select_from(window)).scalar_one())


def nth_trade_date(
    engine: sa.Engine, n: int, source: PriceSource = NATIVE_PRICES
) -> dt.date | None:
    """The ``n``-th distinct trade date of the price source, counting from its first (``n = 1``:
    the first date); ``None`` when it has fewer than ``n``. The first snapshot date whose window
    of ``L + 1`` trade dates is full is on or after ``nth_trade_date(engine, L + 1)``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        trade_date = src.day_expr(src.raw_date_column(table)).label("trade_date")
        day: dt.date | None = conn.execute(
            sa.select(trade_date).distinct().order_by(trade_date).offset(n - 1).limit(1)
        ).scalar_one_or_none()
    return day


def trade_dates(
    engine: sa.Engine, first: dt.date, last: dt.date, source: PriceSource = NATIVE_PRICES
) -> list[dt.date]:
    """The distinct trade dates ``first <= d <= last`` of the price source, ascending (an index
    range on the trade-date column when it is indexed)."""
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        raw_date = src.raw_date_column(table)
        trade_date = src.day_expr(raw_date).label("trade_date")
        statement = (
            sa.select(trade_date)
            .distinct()
            .where(
                raw_date >= src.day_start_expr(first),
                raw_date < src.day_start_expr(last + dt.timedelta(days=1)),
            )
            .order_by(trade_date)
        )
        return list(conn.execute(statement).scalars())


@dataclass(frozen=True)
class SessionPrices:
    """How complete the prices of one session are, and a fingerprint of them.

    ``previous`` is the last trade date of the source before ``session`` (None when there is
    none); ``previous_symbols`` the symbols with a non-NULL price that day, ``carried`` how many
    of them also have one on ``session``, ``symbols`` how many have one on ``session``.
    ``fingerprint`` changes whenever a row of ``session`` is added, removed or changes its
    price: ``<rows>-<md5 of the rows, sorted>``, or ``0`` when there are none."""

    session: dt.date
    previous: dt.date | None
    symbols: int
    previous_symbols: int
    carried: int
    fingerprint: str

    @property
    def completeness(self) -> float:
        """``carried / previous_symbols``; with no previous trade date, 1.0 when ``session`` has
        prices, else 0.0."""
        if self.previous_symbols:
            return self.carried / self.previous_symbols
        return 1.0 if self.symbols else 0.0


def session_prices(
    engine: sa.Engine, session: dt.date | str, source: PriceSource = NATIVE_PRICES
) -> SessionPrices:
    """:class:`SessionPrices` of ``session`` in the price source: three short statements, each
    an index range on the trade-date column (when it is indexed)."""
    day = as_iso_date(session, "session")
    with engine.connect() as conn:
        src = resolve_price_source(conn, source)
        table = src.table_clause()
        raw_date = src.raw_date_column(table)
        symbol = src.symbol_expr(table)
        price = table.c[src.source.price]

        def on(d: dt.date) -> sa.ColumnElement[bool]:
            return sa.and_(
                raw_date >= src.day_start_expr(d),
                raw_date < src.day_start_expr(d + dt.timedelta(days=1)),
            )

        previous: dt.date | None = conn.execute(
            sa.select(src.day_expr(sa.func.max(raw_date)))
            .select_from(table)
            .where(raw_date < src.day_start_expr(day))
        ).scalar_one()
        row_text = sa.func.concat_ws(
            "\t", symbol, sa.cast(raw_date, sa.Text), sa.cast(sa.cast(price, sa.Float), sa.Text)
        )
        rows, digest = conn.execute(
            sa.select(
                sa.func.count(),
                sa.func.md5(
                    sa.func.string_agg(row_text, aggregate_order_by(sa.literal("\n"), row_text))
                ),
            )
            .select_from(table)
            .where(on(day))
        ).one()
        today = (
            sa.select(symbol.label("s")).distinct().where(on(day), price.is_not(None)).subquery("t")
        )
        symbols = int(conn.execute(sa.select(sa.func.count()).select_from(today)).scalar_one())
        previous_symbols = carried = 0
        if previous is not None:
            before = (
                sa.select(symbol.label("s"))
                .distinct()
                .where(on(previous), price.is_not(None))
                .subquery("p")
            )
            previous_symbols, carried = conn.execute(
                sa.select(sa.func.count(), sa.func.count(today.c.s)).select_from(
                    before.outerjoin(today, before.c.s == today.c.s)
                )
            ).one()
    return SessionPrices(
        session=day,
        previous=previous,
        symbols=symbols,
        previous_symbols=int(previous_symbols),
        carried=int(carried),
        fingerprint=f"{int(rows)}-{digest}" if rows else "0",
    )
