"""The price window and the returns matrix (SPEC §2), read from ``prices`` (or another configured
price source) without per-row Python.

``load_returns_window(engine, D, lookback_days=L, min_history_days=m)``:

* **window dates**: the last ``L + 1`` distinct ``trade_date``s ``<= D`` in ``prices`` (all of them
  if fewer exist); ``as_of_trade_date`` is the last one, so a weekend/holiday ``D`` snapshots the
  previous session.
* **closes**: ``C[t, j]`` for window date ``t`` and symbol ``j`` (every symbol with at least one
  row in the window, sorted by code point); missing rows are NaN, and a NaN, infinite or
  non-positive close is a *bad price*: counted (``bad_prices``) and treated as missing.
* **returns**: ``R[t, j] = ln(C[t+1, j] / C[t, j])`` (float64, then cast to float32) where both
  closes are good, else NaN; no forward fill. ``T = len(dates) - 1`` rows.
* **kept symbols**: at least ``min_history_days`` finite returns and non-zero variance of those
  returns (``max != min`` over the float32 values: exact, no rounding threshold). Others are
  reported in ``dropped`` as ``(symbol, reason)``.

Query plan (two statements in one REPEATABLE READ, read-only transaction, so they see one
consistent snapshot of ``prices`` even while an import commits):

1. window dates by a *loose index scan* of ``ix_prices_trade_date`` (a recursive CTE hopping from
   one distinct date to the previous one: ``L + 1`` index probes, ~3 ms, instead of reading all
   ``N × (L + 1)`` index entries as ``SELECT DISTINCT ... ORDER BY ... LIMIT`` does, ~0.9 s);
2. one row per symbol, aggregated by the server::

       SELECT symbol,
              string_agg(int4send(trade_date - first), ''::bytea),   -- int4 day offsets
              string_agg(float8send(close), ''::bytea)               -- float8 closes
       FROM prices WHERE trade_date >= first AND trade_date < last + 1 GROUP BY symbol

   fetched in binary: each blob is the group's big-endian values back to back (``int4send`` /
   ``float8send`` are the types' binary encodings), so the ``N`` blobs of each column are joined
   and decoded by one ``np.frombuffer`` each. The two aggregates of one group consume the group's
   rows in the same order, so element ``i`` of both belongs to the same row (neither input is
   ever NULL: ``string_agg`` would skip it; a length mismatch is detected). Unlike
   ``array_send(array_agg(...))``, whose elements carry a 4-byte length each, that is 8 + 4
   bytes per row instead of 16, and a ``postgres_fdw`` foreign table ships the pushed-down
   aggregate as hex ``bytea`` instead of text arrays of decimal floats. Symbols are sorted in
   Python (code-point order, independent of the database collation) and the closes pivoted
   with ``np.searchsorted`` (day → window row) and fancy indexing.

Why not ``COPY ... TO STDOUT``: it delivers one message per row, millions at N = 24,000, whose
consumption in psycopg costs many times the client CPU of the per-symbol aggregate, which moves
the per-row work into the server's C code (the server's CPU is about the same either way).
``work_mem`` is raised for this transaction only (:data:`WINDOW_WORK_MEM`) so
the hash aggregate stays in memory (~400 MB at that size) instead of spilling to disk.

Memory in this process at N = 24,000, L = 252: the fetched blobs ≈ 70 MB, closes float64 ≈
49 MB, returns float64 ≈ 49 MB then float32 ≈ 24 MB.

**Another price source** (:mod:`corr_pipeline.db.price_source`: a team's table, view or
foreign table with its own names): the same two statements, with the relation and the columns
quoted as identifiers, the symbol read as ``text`` (grouped byte-wise: ``COLLATE "C"`` is
added for a nondeterministic collation only), the price
as ``float8`` (a NULL price is a bad price, counted like NaN: left out of both blobs by a
``FILTER`` and counted in a third column), and a ``timestamp`` trade-date column turned into a
date as that module says, while the range conditions stay on the raw column (``col <
start of the next day``) so its index serves the loose scan. The source is resolved against
the catalog at the start of the transaction; two rows for one (symbol, date) are refused.

**Several sessions at once** (a backfill): ``load_returns_windows(engine, days, ...)`` returns,
for each day, exactly what ``load_returns_window`` gives for it (or the :class:`WindowError`
it would raise, as a value), from ONE dates scan and ONE grouped query over the union of the
windows in one transaction; each window is then sliced from the union pivot (see its
docstring for the plan and the memory).
"""

from __future__ import annotations

import bisect
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa
from psycopg import sql

from corr_pipeline.db.bulk import driver_connection
from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.price_source import (
    NATIVE_PRICES,
    PriceSource,
    PriceSourceError,
    ResolvedPriceSource,
    resolve_price_source,
)
from corr_pipeline.db.prices_import import MAX_SYMBOL_CHARS, symbol_problem

__all__ = [
    "ReturnsWindow",
    "StaleSessionError",
    "WindowError",
    "load_returns_window",
    "UnionWindows",
    "load_returns_windows",
    "read_windows",
    "returns_from_closes",
]

#: ``work_mem`` for the window transaction (SET LOCAL): the per-symbol hash aggregate needs
#: ~400 MB at N = 24,000 × 253 dates; the server default (4 MB) would spill it to disk.
WINDOW_WORK_MEM = "1GB"

#: Elements of the aggregated blobs: ``int4send`` day offsets and ``float8send`` prices.
_DAY_ELEM = np.dtype(">i4")
_CLOSE_ELEM = np.dtype(">f8")


#: Why a symbol in the window was not kept (SPEC §2): the keys of ``ReturnsWindow.drop_counts``.
TOO_FEW_RETURNS = "too_few_returns"
ZERO_VARIANCE = "zero_variance"


class WindowError(ValueError):
    """The window cannot be built (no data, too short, everything dropped, bad arguments)."""


class StaleSessionError(WindowError):
    """A session's window was asked for before any price dated that session exists: its
    snapshot would be an earlier session's under a later date (SPEC §2). ``session`` and
    ``latest`` (the latest trade date on or before it) say which."""

    def __init__(self, session: dt.date, latest: dt.date, what: str) -> None:
        super().__init__(
            f"no price dated {session} in {what} yet (the latest trade date on or before it is "
            f"{latest}): session {session} cannot be snapshotted before its prices are in; "
            "nothing is published"
        )
        self.session = session
        self.latest = latest


def _stale_error(
    d: dt.date, dates: Sequence[dt.date], session: bool, source: PriceSource
) -> StaleSessionError | None:
    """The error of a session ``d`` (``session``) whose window ``dates`` does not end on it."""
    if session and dates and dates[-1] != d:
        return StaleSessionError(d, dates[-1], _what(source))
    return None


@dataclass(frozen=True, eq=False)
class ReturnsWindow:
    """The returns matrix of one snapshot (SPEC §2).

    ``returns``: float32 ``T × N`` (C-contiguous), NaN where missing or touching a bad price;
    ``symbols``: the ``N`` kept symbols, ascending by code point (column order of ``returns``);
    ``dates``: the ``T + 1`` window trade dates (ascending; returns row ``t`` is
    ``dates[t] -> dates[t + 1]``); ``as_of_trade_date`` = ``dates[-1]``;
    ``dropped``: ``(symbol, reason in words)`` for symbols present in the window but not kept;
    ``drop_counts``: how many were dropped for each reason (:data:`TOO_FEW_RETURNS`,
    :data:`ZERO_VARIANCE`);
    ``bad_prices``: number of rows in the window whose close is NaN, infinite or <= 0;
    ``n_price_rows``: rows read; ``timings``: seconds per phase (for asset metadata);
    ``source``: the price source read (``table prices (symbol, trade_date, close)``, ...) and
    ``source_notes``: advice about it that did not stop the load (e.g. no date index).
    """

    returns: np.ndarray
    symbols: list[str]
    dates: list[dt.date]
    as_of_trade_date: dt.date
    dropped: list[tuple[str, str]]
    bad_prices: int
    n_price_rows: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    drop_counts: dict[str, int] = field(default_factory=dict)
    source: str = ""
    source_notes: tuple[str, ...] = ()

    @property
    def n_returns(self) -> int:
        """``T``, the number of return rows."""
        return int(self.returns.shape[0])


def returns_from_closes(closes: np.ndarray) -> np.ndarray:
    """Float32 ``T × N`` returns from a ``(T + 1) × N`` float64 close matrix (SPEC §2).

    ``R[t, j] = ln(C[t+1, j] / C[t, j])`` computed in float64 where both closes are finite and
    > 0, else NaN (a missing row is passed as NaN); a ratio that over/underflows float64 (never
    for real prices) gives NaN too, so ``R`` holds no infinities. Cast to float32 at the end.
    """
    good = np.isfinite(closes) & (closes > 0)
    clean = np.where(good, closes, np.nan)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        r64 = np.log(clean[1:] / clean[:-1])
    r64[~np.isfinite(r64)] = np.nan
    return np.ascontiguousarray(r64, dtype=np.float32)


def _dates_sql(src: ResolvedPriceSource) -> sql.Composable:
    """Window dates by a loose index scan of the trade-date column (see the module docstring):
    the last date ``<= %(d)s``, then each previous distinct date, ``%(n)s`` of them."""
    col, p_col = src.column_sql(src.source.trade_date), src.column_sql(src.source.trade_date, "p")
    next_day = sql.SQL("(%(d)s::date + 1)")
    return sql.SQL(
        """
WITH RECURSIVE d(trade_date) AS (
    (SELECT {day} FROM {rel} WHERE {col} < {upper} ORDER BY {col} DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT {p_day} FROM {rel} p WHERE {p_col} < {p_upper}
            ORDER BY {p_col} DESC LIMIT 1)
    FROM d WHERE d.trade_date IS NOT NULL
)
SELECT trade_date FROM d WHERE trade_date IS NOT NULL LIMIT %(n)s
"""
    ).format(
        rel=src.relation_sql(),
        col=col,
        day=src.day_sql(col),
        upper=src.day_start_sql(next_day),
        p_col=p_col,
        p_day=src.day_sql(p_col),
        p_upper=src.day_start_sql(sql.SQL("d.trade_date")),
    )


def _union_dates_sql(src: ResolvedPriceSource) -> sql.Composable:
    """The dates of every window whose snapshot date lies in ``%(lo)s..%(hi)s``: the loose
    index scan of :func:`_dates_sql` from the last date ``<= %(hi)s`` down, one distinct date
    per probe, until ``%(n)s`` dates ``<= %(lo)s`` have been read (or none are left). So every
    distinct date from the first window's start to the last window's end is read once."""
    col, p_col = src.column_sql(src.source.trade_date), src.column_sql(src.source.trade_date, "p")
    return sql.SQL(
        """
WITH RECURSIVE d(trade_date, k) AS (
    (SELECT {day}, CASE WHEN {day} <= %(lo)s::date THEN 1 ELSE 0 END
     FROM {rel} WHERE {col} < {upper} ORDER BY {col} DESC LIMIT 1)
    UNION ALL
    SELECT s.trade_date, d.k + CASE WHEN s.trade_date <= %(lo)s::date THEN 1 ELSE 0 END
    FROM d CROSS JOIN LATERAL (
        SELECT (SELECT {p_day} FROM {rel} p WHERE {p_col} < {p_upper}
                ORDER BY {p_col} DESC LIMIT 1) AS trade_date) s
    WHERE d.trade_date IS NOT NULL AND d.k < %(n)s
)
SELECT trade_date FROM d WHERE trade_date IS NOT NULL
"""
    ).format(
        rel=src.relation_sql(),
        col=col,
        day=src.day_sql(col),
        upper=src.day_start_sql(sql.SQL("(%(hi)s::date + 1)")),
        p_col=p_col,
        p_day=src.day_sql(p_col),
        p_upper=src.day_start_sql(sql.SQL("d.trade_date")),
    )


def _grouped_sql(src: ResolvedPriceSource, n_runs: int = 0) -> sql.Composable:
    """One row per symbol of the window ``%(a)s..%(b)s``: the symbol, its day offsets and its
    prices as header-stripped binary arrays (see the module docstring), and its NULL prices.

    ``n_runs > 0`` (:func:`load_returns_windows`): the rows of the date ranges
    ``%(a0)s..%(b0)s``, ``%(a1)s..%(b1)s``, ... (offsets still from ``%(a)s``), and the fourth
    column holds the day offsets of the NULL-price rows (a blob like the second) instead of
    their count, so that each window of the union counts its own."""
    col = src.column_sql(src.source.trade_date)
    symbol_not_null = (
        sql.SQL(" AND {} IS NOT NULL").format(src.column_sql(src.source.symbol))
        if src.symbol.nullable
        else sql.SQL("")
    )
    price = src.price_sql()
    day_offset = sql.SQL("int4send({} - %(a)s::date)").format(src.day_sql(col))
    days_filter: sql.Composable
    null_prices: sql.Composable
    if src.price.nullable:
        # a NULL price: no element in either blob (string_agg skips NULL, the FILTER keeps the
        # day blob aligned), counted in the fourth column as a bad price
        days_filter = sql.SQL(" FILTER (WHERE {} IS NOT NULL)").format(price)
        null_prices = (
            sql.SQL("string_agg({}, ''::bytea) FILTER (WHERE {} IS NULL)").format(day_offset, price)
            if n_runs
            else sql.SQL("count(*) - count({})").format(price)
        )
    else:
        days_filter = sql.SQL("")
        null_prices = sql.SQL("NULL::bytea" if n_runs else "0::int8")

    def day_range(lo: str, hi: str) -> sql.Composable:
        return sql.SQL("{col} >= {lower} AND {col} < {upper}").format(
            col=col,
            lower=src.day_start_sql(sql.SQL(f"%({lo})s::date")),
            upper=src.day_start_sql(sql.SQL(f"(%({hi})s::date + 1)")),
        )

    where = (
        sql.SQL("({})").format(
            sql.SQL(" OR ").join(
                sql.SQL("({})").format(day_range(f"a{i}", f"b{i}")) for i in range(n_runs)
            )
        )
        if n_runs
        else day_range("a", "b")
    )
    return sql.SQL(
        """
SELECT {symbol},
       string_agg({day_offset}, ''::bytea){days_filter},
       string_agg(float8send({price}), ''::bytea),
       {null_prices}
FROM {rel}
WHERE {where}{symbol_not_null}
GROUP BY 1
"""
    ).format(
        symbol=src.symbol_sql(),
        day_offset=day_offset,
        price=price,
        days_filter=days_filter,
        null_prices=null_prices,
        rel=src.relation_sql(),
        where=where,
        symbol_not_null=symbol_not_null,
    )


def _earliest_sql(src: ResolvedPriceSource) -> sql.Composable:
    col = src.column_sql(src.source.trade_date)
    return sql.SQL("SELECT {} FROM {}").format(
        src.day_sql(sql.SQL("min({})").format(col)), src.relation_sql()
    )


def _decode_elements(
    blobs: list[bytes | None], elem: np.dtype, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, counts)`` from the aggregated blobs (one per symbol, ``elem`` values back to
    back)."""
    present = [b or b"" for b in blobs]  # NULL: a symbol whose prices in the window are all NULL
    counts = np.fromiter((len(b) for b in present), dtype=np.int64, count=len(present))
    if np.any(counts % elem.itemsize):
        raise RuntimeError(f"{what}: unexpected binary layout from PostgreSQL")
    counts //= elem.itemsize
    return np.frombuffer(b"".join(present), dtype=elem), counts


def _refuse_duplicates(
    col_index: np.ndarray,
    row_index: np.ndarray,
    shape: tuple[int, int],
    symbols: list[str],
    dates: list[dt.date],
    source: PriceSource,
) -> None:
    """Raise :class:`PriceSourceError` if two rows share a (symbol, trade date): the pivot would
    keep whichever the server aggregated last. One boolean per cell (N x dates bytes)."""
    if not col_index.size:
        return
    filled = np.zeros(shape, dtype=np.bool_)
    filled[col_index, row_index] = True
    n_cells = int(np.count_nonzero(filled))
    del filled
    if n_cells == col_index.size:
        return
    flat = col_index * shape[1] + row_index
    values, counts = np.unique(flat, return_counts=True)
    first = int(values[np.argmax(counts > 1)])
    symbol, day = symbols[first // shape[1]], dates[first % shape[1]]
    raise PriceSourceError(
        f"price source {source}: {col_index.size - n_cells} duplicate row(s) in the window "
        f"{dates[0]}..{dates[-1]}, e.g. symbol {symbol!r} on {day}: one price per symbol and "
        "trade date is needed (a timestamp column must hold one value per day)"
    )


def _rows_of_offsets(day_offset: np.ndarray, dates: list[dt.date], where: str) -> np.ndarray:
    """The row in ``dates`` of each day offset from ``dates[0]`` (a lookup table: the offsets
    span at most a few years of days); an offset that is not one of the dates is an error."""
    offsets = np.array([(x - dates[0]).days for x in dates], dtype=np.int64)
    row_of_offset = np.full(int(offsets[-1]) + 1, -1, dtype=np.int64)
    row_of_offset[offsets] = np.arange(len(dates))
    if not day_offset.size:
        return np.zeros(0, dtype=np.int64)
    if day_offset.min() < 0 or day_offset.max() > offsets[-1]:
        raise RuntimeError(f"{where}: a row's trade_date lies outside the window")
    row_index = row_of_offset[day_offset.astype(np.intp)]
    if row_index.min() < 0:
        raise RuntimeError(f"{where}: a row's trade_date is not one of the window dates")
    return row_index


def _sorted_columns(fetched_symbols: list[str], where: str) -> tuple[list[str], np.ndarray]:
    """The symbols in code-point order and the column of each fetched symbol; WindowError when
    one breaks the import's symbol rules (SPEC §1, :func:`corr_pipeline.db.prices_import.
    symbol_problem`: at most 64 characters, no control or invisible characters, no surrounding
    whitespace), checked before any matrix is built (a symbol of megabytes would make the
    publication's tables gigabytes)."""
    for symbol in fetched_symbols:
        problem = (
            f"a symbol of {len(symbol):,} characters (at most {MAX_SYMBOL_CHARS})"
            if len(symbol) > MAX_SYMBOL_CHARS
            else symbol_problem(symbol)
        )
        if problem is not None:
            raise WindowError(f"{where}: {problem}; fix it in the price source")
    order = sorted(range(len(fetched_symbols)), key=fetched_symbols.__getitem__)
    column_of_fetched = np.empty(len(order), dtype=np.int64)
    column_of_fetched[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    return [fetched_symbols[i] for i in order], column_of_fetched


def _check_arguments(lookback_days: int, min_history_days: int) -> None:
    if isinstance(lookback_days, bool) or not isinstance(lookback_days, int | np.integer):
        raise WindowError(f"lookback_days must be an integer, got {lookback_days!r}")
    if isinstance(min_history_days, bool) or not isinstance(min_history_days, int | np.integer):
        raise WindowError(f"min_history_days must be an integer, got {min_history_days!r}")
    if lookback_days < 1:
        raise WindowError(f"lookback_days must be >= 1, got {lookback_days}")
    if min_history_days < 2:
        raise WindowError(
            f"min_history_days must be >= 2 (a variance needs two returns), got {min_history_days}"
        )


def _what(source: PriceSource) -> str:
    return "prices" if source.is_native else f"the price source {source.relation_name}"


def _no_dates_error(d: dt.date, earliest: dt.date | None, source: PriceSource) -> WindowError:
    """No trade date ``<= d``: the source is empty (``earliest`` None) or starts after ``d``."""
    if earliest is None:
        table = "the prices table" if source.is_native else _what(source)
        return WindowError(f"no prices at all: {table} is empty (snapshot date {d})")
    return WindowError(
        f"no prices on or before the snapshot date {d} "
        f"(the earliest trade_date in {_what(source)} is {earliest})"
    )


def _too_few_dates_error(
    d: dt.date, dates: list[dt.date], min_history_days: int
) -> WindowError | None:
    n_returns = len(dates) - 1
    if n_returns >= min_history_days:
        return None
    return WindowError(
        f"only {len(dates)} trade date(s) on or before {d} ({dates[0]}..{dates[-1]}), "
        f"i.e. {n_returns} returns; min_history_days={min_history_days} needs at "
        f"least {min_history_days + 1} trade dates"
    )


def _select_symbols(
    returns_all: np.ndarray,
    all_symbols: list[str],
    dates: list[dt.date],
    d: dt.date,
    min_history_days: int,
) -> tuple[np.ndarray, list[str], list[tuple[str, str]], dict[str, int]]:
    """The kept columns of ``returns_all`` (float32, one column per symbol with a row in the
    window), the kept symbols, ``dropped`` and ``drop_counts`` (SPEC §2); raises
    :class:`WindowError` when every symbol is dropped."""
    finite_count = np.isfinite(returns_all).sum(axis=0)
    # fmax/fmin ignore NaN; an all-NaN column gives -inf/+inf (and is "too few" anyway)
    col_max = np.fmax.reduce(returns_all, axis=0, initial=-np.inf)
    col_min = np.fmin.reduce(returns_all, axis=0, initial=np.inf)
    enough = finite_count >= min_history_days
    varies = col_max != col_min
    keep = enough & varies
    dropped: list[tuple[str, str]] = []
    for j in np.flatnonzero(~keep):
        if not enough[j]:
            reason = (
                f"too few finite returns ({int(finite_count[j])} < "
                f"min_history_days={min_history_days})"
            )
        else:
            reason = "zero variance (constant returns over the window)"
        dropped.append((all_symbols[j], reason))
    if not keep.any():
        n_all, n_few = len(all_symbols), int((~enough).sum())
        raise WindowError(
            f"every one of the {n_all} symbols with prices in the window {dates[0]}..{dates[-1]} "
            f"(snapshot date {d}) was dropped: {n_few} with fewer than "
            f"min_history_days={min_history_days} finite returns, {n_all - n_few} with zero "
            "variance"
        )
    drop_counts = {
        TOO_FEW_RETURNS: int((~enough).sum()),
        ZERO_VARIANCE: int((enough & ~varies).sum()),
    }
    returns = np.ascontiguousarray(returns_all[:, keep])
    return returns, [all_symbols[j] for j in np.flatnonzero(keep)], dropped, drop_counts


def load_returns_window(
    engine: sa.Engine,
    snapshot_date: dt.date | str,
    *,
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
) -> ReturnsWindow:
    """Build the SPEC §2 window and returns matrix for snapshot date ``D = snapshot_date``,
    reading ``source`` (default: the project's ``prices`` table). ``session``: ``D`` is a
    session of the configured calendar, so its window must end on ``D``; without a price dated
    ``D``, :class:`StaleSessionError` (naming the latest trade date) before any price is read.
    Otherwise (a weekend or holiday ``D``) the window ends on the last trade date before it.

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
    _check_arguments(lookback_days, min_history_days)
    d = as_iso_date(snapshot_date, "snapshot date", WindowError)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        src = resolve_price_source(conn, source)
        timings["source_s"] = time.perf_counter() - t0
        pg = driver_connection(conn)
        with pg.cursor() as cur:
            cur.execute(_dates_sql(src), {**src.params(), "d": d, "n": int(lookback_days) + 1})
            dates = sorted(row[0] for row in cur.fetchall())
            timings["dates_s"] = time.perf_counter() - t0
            if not dates:
                cur.execute(_earliest_sql(src), src.params())
                raise _no_dates_error(d, cur.fetchone()[0], source)
            stale = _stale_error(d, dates, session, source)
            if stale is not None:
                raise stale
            too_few = _too_few_dates_error(d, dates, min_history_days)
            if too_few is not None:
                raise too_few
            first, last = dates[0], dates[-1]
            t1 = time.perf_counter()
            cur.execute(f"SET LOCAL work_mem = '{WINDOW_WORK_MEM}'")
            cur.execute(_grouped_sql(src), {**src.params(), "a": first, "b": last}, binary=True)
            grouped = cur.fetchall()
            timings["query_s"] = time.perf_counter() - t1
        conn.rollback()  # read-only: nothing to commit

    t3 = time.perf_counter()
    where = f"{_what(source)} window {first}..{last}"
    day_offset, counts = _decode_elements([row[1] for row in grouped], _DAY_ELEM, where)
    close_values, close_counts = _decode_elements([row[2] for row in grouped], _CLOSE_ELEM, where)
    null_prices = sum(int(row[3]) for row in grouped)
    all_symbols, column_of_fetched = _sorted_columns([row[0] for row in grouped], where)
    del grouped
    if not np.array_equal(counts, close_counts):
        raise RuntimeError(f"{where}: day and close arrays differ in length")
    n_rows = int(day_offset.size) + null_prices
    col_index = np.repeat(column_of_fetched, counts)
    row_index = _rows_of_offsets(day_offset, dates, where)
    n_all = len(all_symbols)
    _refuse_duplicates(col_index, row_index, (n_all, len(dates)), all_symbols, dates, source)
    # scatter symbol-major (each symbol's values land in one contiguous row), transpose after
    closes_t = np.full((n_all, len(dates)), np.nan, dtype=np.float64)
    close_values = close_values.astype(np.float64)
    closes_t[col_index, row_index] = close_values
    bad_prices = int((~(np.isfinite(close_values) & (close_values > 0))).sum()) + null_prices
    del day_offset, row_index, col_index, close_values
    returns_all = returns_from_closes(closes_t.T)
    del closes_t
    returns, symbols, dropped, drop_counts = _select_symbols(
        returns_all, all_symbols, dates, d, min_history_days
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
    )


@dataclass
class _UnionPivot:
    """The union of the windows, pivoted once (:func:`load_returns_windows`): ``returns``
    float32 ``(U - 1) × N`` over the ``U`` union dates (a row spanning a gap between two runs
    of the union is never used); the symbols with a row in the union; per symbol and date the
    running count of its rows (``(N, U + 1)`` int32, so a window's symbols are those whose
    count grows inside it); per date the running count of rows and of bad prices."""

    symbols: list[str]
    returns: np.ndarray
    present_cum: np.ndarray
    rows_cum: np.ndarray
    bad_cum: np.ndarray


def _pivot_union(
    grouped: list[tuple], dates: list[dt.date], where: str, source: PriceSource
) -> _UnionPivot:
    day_offset, counts = _decode_elements([row[1] for row in grouped], _DAY_ELEM, where)
    close_values, close_counts = _decode_elements([row[2] for row in grouped], _CLOSE_ELEM, where)
    null_offset, null_counts = _decode_elements([row[3] for row in grouped], _DAY_ELEM, where)
    symbols, column_of_fetched = _sorted_columns([row[0] for row in grouped], where)
    if not np.array_equal(counts, close_counts):
        raise RuntimeError(f"{where}: day and close arrays differ in length")
    col_index = np.repeat(column_of_fetched, counts)
    row_index = _rows_of_offsets(day_offset, dates, where)
    null_col = np.repeat(column_of_fetched, null_counts)
    null_row = _rows_of_offsets(null_offset, dates, where)
    shape = (len(symbols), len(dates))
    _refuse_duplicates(col_index, row_index, shape, symbols, dates, source)
    closes_t = np.full(shape, np.nan, dtype=np.float64)
    close_values = close_values.astype(np.float64)
    closes_t[col_index, row_index] = close_values
    returns = returns_from_closes(closes_t.T)  # the same layout as one window's (bit for bit)
    del closes_t
    present = np.zeros(shape, dtype=np.bool_)
    present[col_index, row_index] = True
    present[null_col, null_row] = True  # a row with a NULL price puts its symbol in the window
    present_cum = np.zeros((shape[0], shape[1] + 1), dtype=np.int32)
    np.cumsum(present, axis=1, dtype=np.int32, out=present_cum[:, 1:])
    del present
    bad = ~(np.isfinite(close_values) & (close_values > 0))
    nulls_per_date = np.bincount(null_row, minlength=shape[1])
    rows_per_date = np.bincount(row_index, minlength=shape[1]) + nulls_per_date
    bad_per_date = np.bincount(row_index[bad], minlength=shape[1]) + nulls_per_date
    return _UnionPivot(
        symbols=symbols,
        returns=returns,
        present_cum=present_cum,
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
        columns = np.flatnonzero(union.present_cum[:, b] > union.present_cum[:, a])
        try:
            returns, symbols, dropped, drop_counts = _select_symbols(
                union.returns[a : b - 1][:, columns],
                [union.symbols[j] for j in columns],
                dates,
                d,
                self.min_history_days,
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
        )


def read_windows(
    engine: sa.Engine,
    days: Sequence[dt.date | str],
    *,
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
) -> UnionWindows:
    """The windows of several snapshot dates (a backfill's sessions) in one read: for each of
    ``days`` (any order, duplicates allowed; dates or ISO strings), what
    :func:`load_returns_window` gives for it with the same arguments (``session``: every day
    is a session of the calendar) — its
    :class:`ReturnsWindow`, identical in every field but ``timings`` (returns bit for bit), or
    the :class:`WindowError` it would raise (no trade date ``<= D``, too few dates, every symbol
    dropped), as a value: :meth:`UnionWindows.window`.

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
    _check_arguments(lookback_days, min_history_days)
    if isinstance(days, str | dt.date):
        raise WindowError(f"days must be a sequence of dates, got {days!r}")
    wanted = sorted({as_iso_date(day, "snapshot date", WindowError) for day in days})
    n_dates = int(lookback_days) + 1
    errors: dict[dt.date, WindowError] = {}
    spans: dict[dt.date, tuple[int, int]] = {}  # day -> its window scanned[start:stop]
    shared: dict[str, float] = {}
    grouped: list[tuple] = []
    scanned: list[dt.date] = []
    union_dates: list[dt.date] = []
    in_union = np.zeros(0, dtype=np.bool_)
    resolved: str = str(source)
    notes: tuple[str, ...] = ()
    t0 = time.perf_counter()
    if wanted:
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            conn.execute(sa.text("SET TRANSACTION READ ONLY"))
            src = resolve_price_source(conn, source)
            resolved, notes = src.describe(), src.notes
            shared["source_s"] = time.perf_counter() - t0
            pg = driver_connection(conn)
            with pg.cursor() as cur:
                cur.execute(
                    _union_dates_sql(src),
                    {**src.params(), "lo": wanted[0], "hi": wanted[-1], "n": n_dates},
                )
                scanned = sorted(row[0] for row in cur.fetchall())
                shared["dates_s"] = time.perf_counter() - t0
                # a day without any date <= it means the scan ran out: scanned[0] is the earliest
                earliest: dt.date | None = scanned[0] if scanned else None
                if not scanned:
                    cur.execute(_earliest_sql(src), src.params())
                    earliest = cur.fetchone()[0]
                for d in wanted:
                    stop = bisect.bisect_right(scanned, d)
                    start = max(0, stop - n_dates)
                    if stop == 0:
                        errors[d] = _no_dates_error(d, earliest, source)
                    elif stale := _stale_error(d, scanned[start:stop], session, source):
                        errors[d] = stale
                    elif error := _too_few_dates_error(d, scanned[start:stop], min_history_days):
                        errors[d] = error
                    else:
                        spans[d] = (start, stop)
                in_union = np.zeros(len(scanned), dtype=np.bool_)
                for start, stop in spans.values():
                    in_union[start:stop] = True
                union_pos = np.flatnonzero(in_union)
                union_dates = [scanned[i] for i in union_pos]
                if spans:
                    breaks = np.flatnonzero(np.diff(union_pos) > 1)  # runs of consecutive dates
                    run_first = [union_pos[0], *union_pos[breaks + 1]]
                    run_last = [*union_pos[breaks], union_pos[-1]]
                    params = {**src.params(), "a": union_dates[0]}
                    for i, (lo, hi) in enumerate(zip(run_first, run_last, strict=True)):
                        params[f"a{i}"], params[f"b{i}"] = scanned[lo], scanned[hi]
                    t1 = time.perf_counter()
                    cur.execute(f"SET LOCAL work_mem = '{WINDOW_WORK_MEM}'")
                    cur.execute(_grouped_sql(src, len(run_first)), params, binary=True)
                    grouped = cur.fetchall()
                    shared["query_s"] = time.perf_counter() - t1
            conn.rollback()  # read-only: nothing to commit
    read_s = time.perf_counter() - t0
    union: _UnionPivot | None = None
    union_s = 0.0
    if spans:
        t3 = time.perf_counter()
        where = f"{_what(source)} windows {union_dates[0]}..{union_dates[-1]}"
        union = _pivot_union(grouped, union_dates, where, source)
        del grouped
        union_s = (time.perf_counter() - t3) / len(spans)
    return UnionWindows(
        days=wanted,
        errors=errors,
        spans=spans,
        scanned=scanned,
        union=union,
        union_row=np.cumsum(in_union) - 1,  # scanned position -> union row
        min_history_days=min_history_days,
        source=source,
        resolved=resolved,
        notes=notes,
        shared=shared,
        read_s=read_s,
        union_s=union_s,
    )
