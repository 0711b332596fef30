"""One snapshot date's window: :func:`load_returns_window` (see :mod:`corr_pipeline.db.window`)."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute.suspect import DEFAULT_SCREEN, SuspectScreen
from corr_pipeline.db.bulk import driver_connection
from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource, resolve_price_source
from corr_pipeline.db.window.errors import (
    WindowError,
    check_arguments,
    no_dates_error,
    source_name,
    stale_error,
    too_few_dates_error,
)
from corr_pipeline.db.window.returns import (
    ReturnsWindow,
    pivot_closes,
    select_symbols,
)
from corr_pipeline.db.window.sql import WINDOW_WORK_MEM, dates_sql, earliest_sql, grouped_sql


def load_returns_window(
    engine: sa.Engine,
    snapshot_date: dt.date | str,
    *,
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
    suspect_screen: SuspectScreen = DEFAULT_SCREEN,
) -> ReturnsWindow:
    """Build the SPEC §2 window and returns matrix for snapshot date ``D = snapshot_date``,
    reading ``source`` (default: the project's ``prices`` table). ``session``: ``D`` is a
    session of the configured calendar, so its window must end on ``D``; without a price dated
    ``D``, :class:`StaleSessionError` (naming the latest trade date) before any price is read.
    Otherwise (a weekend or holiday ``D``) the window ends on the last trade date before it.
    ``suspect_screen``: the thresholds of the suspect prices (SPEC §2, ``ReturnsWindow.suspects``)
    and whether suspect symbols are dropped.

    The source is checked against the catalog first, in the same read-only transaction
    (:func:`~corr_pipeline.db.price_source.resolve_price_source`): a missing relation or column,
    or an unusable type, raises :class:`~corr_pipeline.db.price_source.PriceSourceError` (one
    line) before any price is read; so do two prices for one symbol and trade date in the
    window (a source without a unique key, or intraday timestamps), which would make the result
    depend on the row order.

    Raises :class:`WindowError` when no trade date ``<= D`` exists, when the window holds fewer
    than ``min_history_days`` returns, when every symbol is dropped, or for invalid arguments
    (``lookback_days >= 1``, ``min_history_days >= 2``). The ``min_overlap <= min_history_days
    <= lookback_days`` constraint is the caller's configuration check.
    """
    check_arguments(lookback_days, min_history_days)
    d = as_iso_date(snapshot_date, "snapshot date", WindowError)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        src = resolve_price_source(conn, source)
        timings["source_s"] = time.perf_counter() - t0
        pg = driver_connection(conn)
        with pg.cursor() as cur:
            cur.execute(dates_sql(src), {**src.params(), "d": d, "n": int(lookback_days) + 1})
            dates = sorted(row[0] for row in cur.fetchall())
            timings["dates_s"] = time.perf_counter() - t0
            if not dates:
                cur.execute(earliest_sql(src), src.params())
                raise no_dates_error(d, cur.fetchone()[0], source)
            stale = stale_error(d, dates, session, source)
            if stale is not None:
                raise stale
            too_few = too_few_dates_error(d, dates, min_history_days)
            if too_few is not None:
                raise too_few
            first, last = dates[0], dates[-1]
            t1 = time.perf_counter()
            cur.execute(f"SET LOCAL work_mem = '{WINDOW_WORK_MEM}'")
            cur.execute(grouped_sql(src), {**src.params(), "a": first, "b": last}, binary=True)
            grouped = cur.fetchall()
            timings["query_s"] = time.perf_counter() - t1
        conn.rollback()  # read-only: nothing to commit

    t3 = time.perf_counter()
    where = f"{source_name(source)} window {first}..{last}"
    null_prices = sum(int(row[3]) for row in grouped)
    pivot = pivot_closes(grouped, dates, where, source)
    del grouped
    n_rows = int(pivot.row_index.size) + null_prices
    close_values = pivot.close_values
    bad_prices = int((~(np.isfinite(close_values) & (close_values > 0))).sum()) + null_prices
    returns_all, all_symbols = pivot.returns, pivot.symbols
    del pivot, close_values  # the per-row arrays: only the returns are needed from here
    returns, symbols, dropped, drop_counts, suspects = select_symbols(
        returns_all, all_symbols, dates, d, min_history_days, suspect_screen
    )
    timings["pivot_s"] = time.perf_counter() - t3
    timings["total_s"] = time.perf_counter() - t0
    return ReturnsWindow(
        returns=returns,
        symbols=symbols,
        dates=list(dates),
        as_of_trade_date=last,
        dropped=dropped,
        bad_prices=bad_prices,
        n_price_rows=n_rows,
        timings=timings,
        drop_counts=drop_counts,
        source=src.describe(),
        source_notes=src.notes,
        suspects=suspects,
    )
