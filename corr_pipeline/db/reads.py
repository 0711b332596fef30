"""Small reads other layers need (SQLAlchemy Core): the extent and trade dates of the price
source; the published snapshot dates and the matrix-store versions each one pins (retention,
SPEC §8).

The price reads use the project's ``prices`` table by default, or the ``source`` they are given
(a :class:`~corr_pipeline.db.price_source.PriceSource`, resolved against the catalog first, so a
misconfigured source raises :class:`~corr_pipeline.db.price_source.PriceSourceError`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa

from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource, resolve_price_source
from corr_pipeline.db.schema import snapshots

__all__ = [
    "PricesExtent",
    "count_trade_dates",
    "latest_trade_date",
    "prices_extent",
    "published_dates",
    "published_matrix_versions",
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


def published_matrix_versions(engine: sa.Engine) -> dict[dt.date, dict[str, dict[str, str]] | None]:
    """Every published ``snapshot_date`` (oldest first) with the matrix-store versions its
    snapshot pins (``snapshots.matrix_versions``, ``{asset: {array: version}}``; None when it
    recorded none), read in one statement."""
    statement = sa.select(snapshots.c.snapshot_date, snapshots.c.matrix_versions).order_by(
        snapshots.c.snapshot_date
    )
    with engine.connect() as conn:
        return {
            day: (None if versions is None else {str(a): dict(v) for a, v in versions.items()})
            for day, versions in conn.execute(statement)
        }


def published_dates(engine: sa.Engine, *, before: dt.date | str | None = None) -> list[dt.date]:
    """Published ``snapshot_date`` values (oldest first), only those ``< before`` when given."""
    statement = sa.select(snapshots.c.snapshot_date).order_by(snapshots.c.snapshot_date)
    if before is not None:
        statement = statement.where(snapshots.c.snapshot_date < as_iso_date(before, "before"))
    with engine.connect() as conn:
        return list(conn.execute(statement).scalars())
