"""Small reads of the ``prices`` table (SQLAlchemy Core): its extent and its trade dates."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa

from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.schema import prices

__all__ = ["PricesExtent", "count_trade_dates", "latest_trade_date", "prices_extent"]


@dataclass(frozen=True)
class PricesExtent:
    """What ``prices`` holds: row count, distinct symbols, first and last ``trade_date``
    (``None`` when the table is empty)."""

    rows: int
    symbols: int
    first: dt.date | None
    last: dt.date | None


def prices_extent(engine: sa.Engine) -> PricesExtent:
    """Row count, distinct symbols and date range of ``prices``, in one statement."""
    statement = sa.select(
        sa.func.count(),
        sa.func.count(sa.distinct(prices.c.symbol)),
        sa.func.min(prices.c.trade_date),
        sa.func.max(prices.c.trade_date),
    ).select_from(prices)
    with engine.connect() as conn:
        rows, symbols, first, last = conn.execute(statement).one()
    return PricesExtent(rows=int(rows), symbols=int(symbols), first=first, last=last)


def latest_trade_date(engine: sa.Engine) -> dt.date | None:
    """``max(trade_date)`` of ``prices``; ``None`` when the table is empty."""
    with engine.connect() as conn:
        last: dt.date | None = conn.execute(
            sa.select(sa.func.max(prices.c.trade_date))
        ).scalar_one()
    return last


def count_trade_dates(engine: sa.Engine, on_or_before: dt.date | str, limit: int) -> int:
    """How many distinct ``trade_date`` values ``prices`` has on or before ``on_or_before``,
    counting at most the ``limit`` latest ones (so the answer is ``min(limit, all of them)``).

    ``on_or_before`` is a date or an ISO ``YYYY-MM-DD`` string (ValueError otherwise).
    """
    day = as_iso_date(on_or_before, "on_or_before")
    window = (
        sa.select(prices.c.trade_date)
        .distinct()
        .where(prices.c.trade_date <= day)
        .order_by(prices.c.trade_date.desc())
        .limit(int(limit))
        .subquery("w")
    )
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(window)).scalar_one())
