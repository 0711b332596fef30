"""The returns matrix of a window (SPEC §2): the fetched blobs decoded and pivoted, the returns
of the closes, and the kept symbols."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np

from corr_pipeline.compute.suspect import SuspectScreen, SuspectSymbol, find_suspects
from corr_pipeline.db.price_source import PriceSource, PriceSourceError
from corr_pipeline.db.prices_import import MAX_SYMBOL_CHARS, symbol_problem
from corr_pipeline.db.window.errors import WindowError

#: Elements of the aggregated blobs: ``int4send`` day offsets and ``float8send`` prices.
DAY_ELEM = np.dtype(">i4")
CLOSE_ELEM = np.dtype(">f8")


#: Why a symbol in the window was not kept (SPEC §2): the keys of ``ReturnsWindow.drop_counts``.
TOO_FEW_RETURNS = "too_few_returns"
ZERO_VARIANCE = "zero_variance"
SUSPECT_PRICES = "suspect_prices"


@dataclass(frozen=True, eq=False)
class ReturnsWindow:
    """The returns matrix of one snapshot (SPEC §2).

    ``returns``: float32 ``T × N`` (C-contiguous), NaN where missing or touching a bad price;
    ``symbols``: the ``N`` kept symbols, ascending by code point (column order of ``returns``);
    ``dates``: the ``T + 1`` window trade dates (ascending; returns row ``t`` is
    ``dates[t] -> dates[t + 1]``); ``as_of_trade_date`` = ``dates[-1]``;
    ``dropped``: ``(symbol, reason in words)`` for symbols present in the window but not kept;
    ``drop_counts``: how many were dropped for each reason (:data:`TOO_FEW_RETURNS`,
    :data:`ZERO_VARIANCE`, :data:`SUSPECT_PRICES`);
    ``suspects``: the symbols that pass the keep rule but whose prices are suspect (SPEC §2:
    too many zero returns, or a too large ``|R|``), with both figures, in symbol order; kept
    unless the screen drops them (then also in ``dropped``, with that reason);
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
    suspects: list[SuspectSymbol] = field(default_factory=list)

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


def decode_elements(
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


def refuse_duplicates(
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


def rows_of_offsets(day_offset: np.ndarray, dates: list[dt.date], where: str) -> np.ndarray:
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


def sorted_columns(fetched_symbols: list[str], where: str) -> tuple[list[str], np.ndarray]:
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


def select_symbols(
    returns_all: np.ndarray,
    all_symbols: list[str],
    dates: list[dt.date],
    d: dt.date,
    min_history_days: int,
    screen: SuspectScreen,
) -> tuple[np.ndarray, list[str], list[tuple[str, str]], dict[str, int], list[SuspectSymbol]]:
    """The kept columns of ``returns_all`` (float32, one column per symbol with a row in the
    window), the kept symbols, ``dropped`` (in symbol order), ``drop_counts`` and the suspect
    symbols (SPEC §2: among those the keep rule keeps, by ``screen``; dropped too when
    ``screen.drop``); raises :class:`WindowError` when every symbol is dropped."""
    finite_count = np.isfinite(returns_all).sum(axis=0)
    # fmax/fmin ignore NaN; an all-NaN column gives -inf/+inf (and is "too few" anyway)
    col_max = np.fmax.reduce(returns_all, axis=0, initial=-np.inf)
    col_min = np.fmin.reduce(returns_all, axis=0, initial=np.inf)
    enough = finite_count >= min_history_days
    varies = col_max != col_min
    keep = enough & varies
    kept_columns = np.flatnonzero(keep)
    suspect_mask, suspects = find_suspects(
        returns_all[:, kept_columns], [all_symbols[j] for j in kept_columns], screen
    )
    suspect = np.zeros_like(keep)
    suspect[kept_columns[suspect_mask]] = True
    reason_of = {s.symbol: s.reason for s in suspects}
    if screen.drop:
        keep &= ~suspect
    dropped: list[tuple[str, str]] = []
    for j in np.flatnonzero(~keep):
        if not enough[j]:
            reason = (
                f"too few finite returns ({int(finite_count[j])} < "
                f"min_history_days={min_history_days})"
            )
        elif not varies[j]:
            reason = "zero variance (constant returns over the window)"
        else:
            reason = f"suspect prices (drop_suspect): {reason_of[all_symbols[j]]}"
        dropped.append((all_symbols[j], reason))
    n_suspect_dropped = int(suspect.sum()) if screen.drop else 0
    if not keep.any():
        n_all, n_few = len(all_symbols), int((~enough).sum())
        raise WindowError(
            f"every one of the {n_all} symbols with prices in the window {dates[0]}..{dates[-1]} "
            f"(snapshot date {d}) was dropped: {n_few} with fewer than "
            f"min_history_days={min_history_days} finite returns, "
            f"{n_all - n_few - n_suspect_dropped} with zero variance"
            + (f", {n_suspect_dropped} with suspect prices" if n_suspect_dropped else "")
        )
    drop_counts = {
        TOO_FEW_RETURNS: int((~enough).sum()),
        ZERO_VARIANCE: int((enough & ~varies).sum()),
        SUSPECT_PRICES: n_suspect_dropped,
    }
    returns = np.ascontiguousarray(returns_all[:, keep])
    symbols = [all_symbols[j] for j in np.flatnonzero(keep)]
    return returns, symbols, dropped, drop_counts, suspects


@dataclass
class Pivot:
    """The grouped rows of a read pivoted: the ``symbols`` (code-point order), the returns of
    the closes (float32 ``(dates − 1) × N``, :func:`returns_from_closes`), and per price row
    (NULL prices aside) its column, its date row and its close (float64)."""

    symbols: list[str]
    returns: np.ndarray
    col_index: np.ndarray
    row_index: np.ndarray
    close_values: np.ndarray
    column_of_fetched: np.ndarray


def pivot_closes(
    grouped: list[tuple], dates: list[dt.date], where: str, source: PriceSource
) -> Pivot:
    """Decode the symbols, day offsets and closes of ``grouped`` (the grouped query's rows),
    refuse two rows for one symbol and date, scatter the closes symbol-major (each symbol's
    values land in one contiguous row) and take the returns of the transpose."""
    day_offset, counts = decode_elements([row[1] for row in grouped], DAY_ELEM, where)
    close_values, close_counts = decode_elements([row[2] for row in grouped], CLOSE_ELEM, where)
    symbols, column_of_fetched = sorted_columns([row[0] for row in grouped], where)
    if not np.array_equal(counts, close_counts):
        raise RuntimeError(f"{where}: day and close arrays differ in length")
    col_index = np.repeat(column_of_fetched, counts)
    row_index = rows_of_offsets(day_offset, dates, where)
    shape = (len(symbols), len(dates))
    refuse_duplicates(col_index, row_index, shape, symbols, dates, source)
    closes_t = np.full(shape, np.nan, dtype=np.float64)
    close_values = close_values.astype(np.float64)
    closes_t[col_index, row_index] = close_values
    returns = returns_from_closes(closes_t.T)
    return Pivot(symbols, returns, col_index, row_index, close_values, column_of_fetched)
