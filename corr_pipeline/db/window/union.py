"""Several sessions' windows from one read of their union (a backfill): :func:`read_windows`
and :func:`load_returns_windows` (see :mod:`corr_pipeline.db.window`)."""

from __future__ import annotations

import bisect
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    DAY_ELEM,
    ReturnsWindow,
    decode_elements,
    pivot_closes,
    rows_of_offsets,
    select_symbols,
)
from corr_pipeline.db.window.sql import (
    WINDOW_WORK_MEM,
    earliest_sql,
    grouped_sql,
    union_dates_sql,
)


@dataclass
class _UnionPivot:
    """The union of the windows, pivoted once (:func:`load_returns_windows`): ``returns``
    float32 ``(U - 1) × N`` over the ``U`` union dates (a row spanning a gap between two runs
    of the union is never used); the symbols with a row in the union; per symbol and date
    whether it has a row (``(N, U)`` bool, so a window's symbols are those with a row inside
    it: a quarter of the running counts' int32 memory, which the range holds for the whole
    run); per date the running count of rows and of bad prices."""

    symbols: list[str]
    returns: np.ndarray
    present: np.ndarray
    rows_cum: np.ndarray
    bad_cum: np.ndarray


def _pivot_union(
    grouped: list[tuple], dates: list[dt.date], where: str, source: PriceSource
) -> _UnionPivot:
    pivot = pivot_closes(grouped, dates, where, source)  # as one window's (bit for bit)
    null_offset, null_counts = decode_elements([row[3] for row in grouped], DAY_ELEM, where)
    null_col = np.repeat(pivot.column_of_fetched, null_counts)
    null_row = rows_of_offsets(null_offset, dates, where)
    symbols, col_index, row_index = pivot.symbols, pivot.col_index, pivot.row_index
    close_values, returns = pivot.close_values, pivot.returns
    shape = (len(symbols), len(dates))
    present = np.zeros(shape, dtype=np.bool_)
    present[col_index, row_index] = True
    present[null_col, null_row] = True  # a row with a NULL price puts its symbol in the window
    bad = ~(np.isfinite(close_values) & (close_values > 0))
    nulls_per_date = np.bincount(null_row, minlength=shape[1])
    rows_per_date = np.bincount(row_index, minlength=shape[1]) + nulls_per_date
    bad_per_date = np.bincount(row_index[bad], minlength=shape[1]) + nulls_per_date
    return _UnionPivot(
        symbols=symbols,
        returns=returns,
        present=present,
        rows_cum=np.concatenate(([0], np.cumsum(rows_per_date))),
        bad_cum=np.concatenate(([0], np.cumsum(bad_per_date))),
    )


def load_returns_windows(
    engine: sa.Engine,
    days: Sequence[dt.date | str],
    *,
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
    suspect_screen: SuspectScreen = DEFAULT_SCREEN,
) -> dict[dt.date, ReturnsWindow | WindowError]:
    """Every window of :func:`read_windows` (same arguments), built at once: ``{day: window or
    WindowError}``, the distinct days ascending. A long range holds all its windows in memory
    (``K`` float32 ``L × N`` matrices); :meth:`UnionWindows.window` builds one at a time."""
    union = read_windows(
        engine,
        days,
        lookback_days=lookback_days,
        min_history_days=min_history_days,
        source=source,
        session=session,
        suspect_screen=suspect_screen,
    )
    return {day: union.window(day) for day in union.days}


@dataclass
class UnionWindows:
    """The windows of several snapshot dates read at once (:func:`read_windows`): ``days`` (the
    distinct dates, ascending) and, per day, its window built on demand by :meth:`window` from
    the union pivot (or the :class:`WindowError` it raised)."""

    days: list[dt.date]
    errors: dict[dt.date, WindowError]
    spans: dict[dt.date, tuple[int, int]]
    scanned: list[dt.date]
    union: _UnionPivot | None
    union_row: np.ndarray
    min_history_days: int
    suspect_screen: SuspectScreen
    source: PriceSource
    resolved: str
    notes: tuple[str, ...]
    shared: dict[str, float]
    read_s: float
    union_s: float

    def window(self, day: dt.date | str) -> ReturnsWindow | WindowError:
        """The window of ``day`` (one of :attr:`days`), identical in every field but
        ``timings`` to :func:`load_returns_window`'s, or the :class:`WindowError` it raises."""
        d = as_iso_date(day, "snapshot date", WindowError)
        if d in self.errors:
            return self.errors[d]
        if d not in self.spans:
            raise KeyError(f"{d} is not one of the days read ({len(self.days)} days)")
        assert self.union is not None  # a day with a span has its rows in the union
        t4 = time.perf_counter()
        start, stop = self.spans[d]
        dates = self.scanned[start:stop]
        a = int(self.union_row[start])
        b = a + len(dates)  # union rows a..b-1
        union = self.union
        columns = np.flatnonzero(union.present[:, a:b].any(axis=1))
        try:
            returns, symbols, dropped, drop_counts, suspects = select_symbols(
                union.returns[a : b - 1][:, columns],
                [union.symbols[j] for j in columns],
                dates,
                d,
                self.min_history_days,
                self.suspect_screen,
            )
        except WindowError as error:
            return error
        pivot_s = self.union_s + time.perf_counter() - t4
        return ReturnsWindow(
            returns=returns,
            symbols=symbols,
            dates=dates,
            as_of_trade_date=dates[-1],
            dropped=dropped,
            bad_prices=int(union.bad_cum[b] - union.bad_cum[a]),
            n_price_rows=int(union.rows_cum[b] - union.rows_cum[a]),
            timings={**self.shared, "pivot_s": pivot_s, "total_s": self.read_s + pivot_s},
            drop_counts=drop_counts,
            source=self.resolved,
            source_notes=self.notes,
            suspects=suspects,
        )


def read_windows(
    engine: sa.Engine,
    days: Sequence[dt.date | str],
    *,
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
    suspect_screen: SuspectScreen = DEFAULT_SCREEN,
) -> UnionWindows:
    """The windows of several snapshot dates (a backfill's sessions) in one read: for each of
    ``days`` (any order, duplicates allowed; dates or ISO strings), what
    :func:`load_returns_window` gives for it with the same arguments (``session``: every day
    is a session of the calendar) — its
    :class:`ReturnsWindow`, identical in every field but ``timings`` (returns bit for bit), or
    the :class:`WindowError` it would raise (no trade date ``<= D``, too few dates, every symbol
    dropped), as a value: :meth:`UnionWindows.window`; ``suspect_screen`` as there.

    One REPEATABLE READ, read-only transaction, whatever the number of days: the catalog check,
    ONE loose index scan of the dates (from the last date ``<= max(days)`` down to the first
    date of the earliest day's window: every distinct date in between is read once, ``K + L``
    probes for ``K`` consecutive sessions) and ONE grouped per-symbol query over the union of
    the windows (the date ranges of its runs, one for consecutive sessions), which also returns
    the day offsets of NULL prices so that each window counts its own. The union is pivoted and
    its returns computed once; each window takes its rows and the columns of the symbols with
    at least one row (even a bad or NULL price) in its own dates, and counts its own rows and
    bad prices, when it is asked for. No price is read when no day has a usable window; the
    earliest date is read only when no day has any.

    Raises :class:`WindowError` for invalid arguments (as :func:`load_returns_window`, and an
    unparseable day) before touching the database, and
    :class:`~corr_pipeline.db.price_source.PriceSourceError` for an unusable source or two
    prices for one symbol and date anywhere in the union (the whole call fails).

    ``timings`` of each window: the shared phases recorded whole (``source_s``, ``dates_s``
    and ``query_s`` as one window's, for the whole read), ``pivot_s`` = its share of the union
    pivot (split evenly) + its own selection, ``total_s`` = the shared read + its ``pivot_s``.

    Memory, with ``U <= K + L + 1`` union dates (consecutive sessions) and ``N`` symbols: the
    union pivot holds ``U × N`` float64 closes, a bool presence, an int32 running count and
    float32 returns (~17 bytes per cell, ~0.85 MB per 100 dates at N = 500, ~41 MB at N =
    24,000; plus, while they run, the float64 temporaries of :func:`returns_from_closes`, as
    for one window), the fetched blobs ~12 bytes per row, the server's hash aggregate ~``U /
    (L + 1)`` times one window's (``work_mem`` :data:`WINDOW_WORK_MEM`); then one window
    (float32 ``L × N``) per :meth:`UnionWindows.window` call, as long as its caller keeps it.
    """
    check_arguments(lookback_days, min_history_days)
    if isinstance(days, str | dt.date):
        raise WindowError(f"days must be a sequence of dates, got {days!r}")
    wanted = sorted({as_iso_date(day, "snapshot date", WindowError) for day in days})
    t0 = time.perf_counter()
    read = _UnionRead(resolved=str(source))
    if wanted:
        n_dates = int(lookback_days) + 1
        _read_union(engine, read, wanted, n_dates, min_history_days, session, source)
    read_s = time.perf_counter() - t0
    union: _UnionPivot | None = None
    union_s = 0.0
    if read.spans:
        t3 = time.perf_counter()
        dates = read.union_dates
        where = f"{source_name(source)} windows {dates[0]}..{dates[-1]}"
        union = _pivot_union(read.grouped, dates, where, source)
        read.grouped = []
        union_s = (time.perf_counter() - t3) / len(read.spans)
    return UnionWindows(
        days=wanted,
        errors=read.errors,
        spans=read.spans,
        scanned=read.scanned,
        union=union,
        union_row=np.cumsum(read.in_union) - 1,  # scanned position -> union row
        min_history_days=min_history_days,
        suspect_screen=suspect_screen,
        source=source,
        resolved=read.resolved,
        notes=read.notes,
        shared=read.shared,
        read_s=read_s,
        union_s=union_s,
    )


@dataclass
class _UnionRead:
    """What :func:`_read_union` read: the source as resolved, the dates scanned, each day's
    window span or error, the union's dates (and which scanned dates they are), the grouped
    rows and the seconds of the shared phases."""

    resolved: str
    notes: tuple[str, ...] = ()
    scanned: list[dt.date] = field(default_factory=list)
    spans: dict[dt.date, tuple[int, int]] = field(default_factory=dict)
    errors: dict[dt.date, WindowError] = field(default_factory=dict)
    in_union: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    union_dates: list[dt.date] = field(default_factory=list)
    grouped: list[tuple] = field(default_factory=list)
    shared: dict[str, float] = field(default_factory=dict)


def _read_union(
    engine: sa.Engine,
    read: _UnionRead,
    wanted: list[dt.date],
    n_dates: int,
    min_history_days: int,
    session: bool,
    source: PriceSource,
) -> None:
    """The one read-only transaction of :func:`read_windows` (its docstring), into ``read``."""
    t0 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        src = resolve_price_source(conn, source)
        read.resolved, read.notes = src.describe(), src.notes
        read.shared["source_s"] = time.perf_counter() - t0
        with driver_connection(conn).cursor() as cur:
            cur.execute(
                union_dates_sql(src),
                {**src.params(), "lo": wanted[0], "hi": wanted[-1], "n": n_dates},
            )
            scanned = read.scanned = sorted(row[0] for row in cur.fetchall())
            read.shared["dates_s"] = time.perf_counter() - t0
            # a day without any date <= it means the scan ran out: scanned[0] is the earliest
            earliest: dt.date | None = scanned[0] if scanned else None
            if not scanned:
                cur.execute(earliest_sql(src), src.params())
                earliest = cur.fetchone()[0]
            read.spans, read.errors = _spans(
                wanted, scanned, earliest, n_dates, min_history_days, session, source
            )
            read.in_union = np.zeros(len(scanned), dtype=np.bool_)
            for start, stop in read.spans.values():
                read.in_union[start:stop] = True
            union_pos = np.flatnonzero(read.in_union)
            read.union_dates = [scanned[i] for i in union_pos]
            if read.spans:
                t1 = time.perf_counter()
                cur.execute(f"SET LOCAL work_mem = '{WINDOW_WORK_MEM}'")
                runs = _runs_of_dates(union_pos, scanned)
                params = {**src.params(), "a": read.union_dates[0]}
                for i, (lo, hi) in enumerate(runs):
                    params[f"a{i}"], params[f"b{i}"] = lo, hi
                cur.execute(grouped_sql(src, len(runs)), params, binary=True)
                read.grouped = cur.fetchall()
                read.shared["query_s"] = time.perf_counter() - t1
        conn.rollback()  # read-only: nothing to commit


def _spans(
    wanted: list[dt.date],
    scanned: list[dt.date],
    earliest: dt.date | None,
    n_dates: int,
    min_history_days: int,
    session: bool,
    source: PriceSource,
) -> tuple[dict[dt.date, tuple[int, int]], dict[dt.date, WindowError]]:
    """Per wanted day, its window ``scanned[start:stop]`` (the last ``n_dates`` dates ``<=``
    it), or the :class:`WindowError` :func:`~corr_pipeline.db.window.load_returns_window`
    would raise for it."""
    spans: dict[dt.date, tuple[int, int]] = {}
    errors: dict[dt.date, WindowError] = {}
    for d in wanted:
        stop = bisect.bisect_right(scanned, d)
        start = max(0, stop - n_dates)
        if stop == 0:
            errors[d] = no_dates_error(d, earliest, source)
        elif stale := stale_error(d, scanned[start:stop], session, source):
            errors[d] = stale
        elif error := too_few_dates_error(d, scanned[start:stop], min_history_days):
            errors[d] = error
        else:
            spans[d] = (start, stop)
    return spans, errors


def _runs_of_dates(union_pos: np.ndarray, scanned: list[dt.date]) -> list[tuple[dt.date, dt.date]]:
    """The first and last date of each run of consecutive scanned positions of the union."""
    breaks = np.flatnonzero(np.diff(union_pos) > 1)
    run_first = [union_pos[0], *union_pos[breaks + 1]]
    run_last = [*union_pos[breaks], union_pos[-1]]
    return [(scanned[lo], scanned[hi]) for lo, hi in zip(run_first, run_last, strict=True)]
