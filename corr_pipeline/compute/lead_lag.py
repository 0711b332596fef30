"""Lead-lag pairs over lags 1..L: an exact, screened scan in O(block × N) memory (SPEC §6).

Definitions (SPEC §6). For ``ℓ = 1 .. max_lag``

    lagged[ℓ][i, j] = pairwise-complete Pearson corr of (R[t, i], R[t + ℓ, j]), t = 0 .. T−1−ℓ

(NaN below ``min_overlap`` or on zero variance). For ``i != j``: the best lag
``ℓ*`` maximises the finite ``|lagged[ℓ][i, j]|`` (ties to the smaller ℓ);
``improvement = |lagged[ℓ*][i, j]| − |corr[i, j]|`` (NaN corr counts as 0);
``(i, j)`` is a candidate iff a finite lag exists and ``improvement > min_improvement``.
Selection: every symbol ``s`` keeps its ``k_laggers`` best candidates ``(s, j)``
and its ``k_leaders`` best candidates ``(i, s)`` (largest improvement, ties to
the smaller index); the result is their union, sorted by improvement desc,
then leader, then lagger.

How, and why it is exactly the brute-force scan (details and formulas in ``lead_lag_kernels``).
The scan goes over row blocks of leaders ``I``:

1. **Screen**: per product tile, one float32 GEMM per lag (and lag 0 when ``corr`` is not
   given) of ``I`` against all N laggers, turned at once into a rigorous *upper bound* of every
   pair's improvement (a bound on ``|lagged|`` from the product, the interval sums and the
   worst case of the gaps, less a lower bound on ``|sync|``). No value is taken from the GEMM.
2. **Rows**: a leader's ``k_laggers`` best lie in its own row, which the block holds whole.
   Its pairs are evaluated exactly (``lead_lag_kernels.evaluate_pair``, a pure function of the
   pair) in two passes — the k best bounds first, then every pair whose bound is not strictly
   below the k-th exact improvement found so far. A pair left out has k evaluated pairs
   strictly above it, so it is in no top-k: the row's top-k is final and exact.
3. **Columns**: a lagger's ``k_leaders`` best are kept in a running N × ``k_leaders`` table
   across blocks; the block's evaluated pairs are merged in, then every pair whose bound is not
   strictly below the lagger's k-th kept value is evaluated and merged. Lists are ordered by
   (improvement desc, index asc), a total order, so ties go to the smaller index whatever the
   order of arrival, and the table after the last block is the exact column selection.

Every reported value comes from the exact per-pair evaluation, so results are bit-identical
for every block size and worker count; the screen only decides which pairs need it.

Nothing of size N × N exists: per block the bound and the evaluated pairs' values are b × N,
the running table is N × k_leaders, and the synchronous correlation is read row block by row
block (from the caller's — possibly memory-mapped — matrix) or bounded from the lag-0 product
and computed exactly for the evaluated pairs only. Cost: one b × T × N product per lag (and
lag 0 without ``corr``) per block, a few flops per pair and lag for the bound, and the exact
evaluation of the few pairs that can be selected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute import lead_lag_kernels as llk
from corr_pipeline.compute.correlation import Progress
from corr_pipeline.compute.kernels import FALLBACK_TAU
from corr_pipeline.compute.standardize import Standardized, make_side, standardize
from corr_pipeline.compute.tiling import (
    DEFAULT_WORKING_MEMORY_MB,
    GEMM_TILE,
    PRODUCT_COLUMNS,
    block_rows_for,
    row_blocks,
    tiles_covering,
)
from corr_pipeline.compute.validation import (
    check_min_overlap,
    check_positive_int,
    check_returns,
    check_square_corr,
)
from corr_pipeline.compute.workers import available_cores, worker_pool

LEAD_LAG_DTYPE = np.dtype(
    [
        ("leader", np.int32),
        ("lagger", np.int32),
        ("lag", np.int16),
        ("lagged_corr", np.float32),
        ("sync_corr", np.float32),
        ("improvement", np.float32),
        ("overlap", np.int32),
    ]
)
"""Columns of :func:`find_lead_lag_pairs`' result (SPEC §6, §9)."""

MAX_BLOCK_ROWS = 2 * GEMM_TILE
"""Default cap on the block height: the b × N arrays stay small and blocks align with tiles."""

_NO_SYNC = np.zeros((1, 1), dtype=np.float32)


@dataclass
class _BlockScan:
    """Exact values of the evaluated pairs of leaders ``[start, start + b)`` (b × N each)."""

    start: int
    improvement: np.ndarray  # float32, NaN where not evaluated, -inf for non-candidates
    best_corr: np.ndarray  # float32, signed
    best_lag: np.ndarray  # int16
    best_overlap: np.ndarray  # int32
    sync: np.ndarray  # float32, signed, NaN allowed

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.improvement, self.best_corr, self.best_lag, self.best_overlap, self.sync)

    def rows_of(self, leaders: np.ndarray, laggers: np.ndarray) -> np.ndarray:
        """The result rows for evaluated pairs (global leader, lagger) of this block."""
        local = leaders - self.start
        out = np.empty(leaders.size, dtype=LEAD_LAG_DTYPE)
        out["leader"] = leaders
        out["lagger"] = laggers
        out["lag"] = self.best_lag[local, laggers]
        out["lagged_corr"] = self.best_corr[local, laggers]
        out["sync_corr"] = self.sync[local, laggers]
        out["improvement"] = self.improvement[local, laggers]
        out["overlap"] = self.best_overlap[local, laggers]
        return out


def _block_row_bytes(n_cols: int) -> int:
    """Per block row: the bound and the evaluated values (4 + 4 + 4 + 2 + 4 + 4 bytes per pair)
    and the synchronous correlation read from ``corr`` (4)."""
    return n_cols * (4 + 4 + 4 + 2 + 4 + 4 + 4)


@dataclass(frozen=True)
class _Screen:
    """Everything the screen and the exact evaluation read, built once per call."""

    window: Standardized
    max_lag: int
    with_sync: bool
    min_overlap: int
    min_improvement: float
    gamma: np.ndarray  # (L+1,) float64: GEMM rounding bound per lag
    intervals: tuple[np.ndarray, ...]  # lo_a, hi_a, gaps_a, lo_b, hi_b, gaps_b
    largest: tuple[np.ndarray, ...]  # top1, top2, top1_t, top2_t, last1, last2
    params: tuple
    data: tuple


def _make_screen(
    window: Standardized, max_lag: int, with_sync: bool, min_overlap: int, min_improvement: float
) -> _Screen:
    n_rows = window.n_rows
    full = make_side(window, 0, n_rows)  # the whole window's interior gaps (CSR)
    intervals = llk.lag_intervals(window.present_t, window.prefix_count_t, max_lag)
    top1, top2, last1, last2 = llk.largest_sums(window.z_t, llk.GAP_DEPTH)
    unit = 2.0**-24
    terms = n_rows - np.arange(max_lag + 1, dtype=np.float64)
    lo_a, hi_a, _, lo_b, hi_b, _ = intervals
    return _Screen(
        window=window,
        max_lag=max_lag,
        with_sync=with_sync,
        min_overlap=min_overlap,
        min_improvement=min_improvement,
        gamma=2.0 * terms * unit / (1.0 - terms * unit),
        intervals=intervals,
        largest=(
            top1,
            top2,
            np.ascontiguousarray(top1.T),
            np.ascontiguousarray(top2.T),
            last1,
            last2,
        ),
        params=(max_lag, min_overlap, FALLBACK_TAU, np.float32(min_improvement), with_sync),
        data=(
            window.z_t,
            window.present_t,
            window.raw_t,
            window.prefix_t,
            window.prefix_sq_t,
            window.prefix_count_t,
            full.gap_ptr,
            full.gap_rows,
            lo_a,
            hi_a,
            lo_b,
            hi_b,
        ),
    )


def find_lead_lag_pairs(
    R: np.ndarray,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
    corr: np.ndarray | None = None,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    block_rows: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """Lead-lag pairs of the columns of ``R`` per SPEC §6 (see the module docstring).

    Parameters
    ----------
    R : float32 (T, N) returns, NaN where missing.
    max_lag : lags 1 .. max_lag are scanned (1 <= max_lag < T).
    k_leaders, k_laggers : per symbol, how many best leaders of it / laggers of it to keep (>= 0).
    min_overlap : minimum common finite rows for any correlation (2 <= min_overlap <= T).
    min_improvement : a pair is a candidate iff its improvement is strictly above this.
    corr : the synchronous correlation (N × N float32, e.g. a read-only memory map);
        computed for the pairs that need it when not given.
    working_memory_mb, block_rows : block sizing; the result does not depend on them.
    progress : ``progress(blocks_done, blocks_total)`` after each block.

    Returns a structured array with fields ``leader, lagger, lag, lagged_corr,
    sync_corr, improvement, overlap`` (:data:`LEAD_LAG_DTYPE`), leader/lagger being
    column indices of ``R``, sorted by improvement desc, then leader, then lagger.
    """
    check_returns(R)
    n_rows, n_cols = R.shape
    check_positive_int(max_lag, "max_lag")
    if max_lag >= n_rows:
        raise ValueError(f"max_lag must be < T = {n_rows}, got {max_lag}")
    check_positive_int(k_leaders, "k_leaders", minimum=0)
    check_positive_int(k_laggers, "k_laggers", minimum=0)
    check_min_overlap(min_overlap, n_rows)
    if not np.isfinite(min_improvement):
        raise ValueError(f"min_improvement must be finite, got {min_improvement}")
    if corr is not None:
        check_square_corr(corr)
        if corr.shape[0] != n_cols:
            raise ValueError(f"corr is {corr.shape[0]} × {corr.shape[1]} but R has N = {n_cols}")

    k_rows = min(k_laggers, max(n_cols - 1, 0))
    k_cols = min(k_leaders, max(n_cols - 1, 0))
    column_values = np.full((n_cols, max(k_cols, 1)), -np.inf, dtype=np.float32)
    column_rows = np.full((n_cols, max(k_cols, 1)), -1, dtype=np.int64)
    column_pairs: list[np.ndarray] = []
    row_pairs: list[np.ndarray] = []

    row_bytes = _block_row_bytes(n_cols)
    if block_rows is None:
        block_rows = min(block_rows_for(row_bytes, working_memory_mb, n_cols), MAX_BLOCK_ROWS)
    blocks = row_blocks(n_cols, row_bytes, working_memory_mb, block_rows=block_rows)
    with worker_pool() as pool:
        window = standardize(R, pool)
        screen = _make_screen(window, max_lag, corr is None, min_overlap, min_improvement)
        for done, (start, stop) in enumerate(blocks, start=1):
            if k_rows > 0 or k_cols > 0:
                scan = _scan_block(
                    start, stop, corr, screen, k_rows, k_cols, pool, column_values, column_rows
                )
                if k_rows > 0:
                    row_pairs.append(scan[1])
                if k_cols > 0:
                    column_pairs.append(_column_candidates(scan[0], column_rows))
            if progress is not None:
                progress(done, len(blocks))

    selected = row_pairs + [_final_column_selection(column_pairs, column_rows)]
    return _union_sorted(np.concatenate(selected) if selected else np.empty(0, LEAD_LAG_DTYPE))


def _scan_block(
    start: int,
    stop: int,
    corr: np.ndarray | None,
    screen: _Screen,
    k_rows: int,
    k_cols: int,
    pool,
    column_values: np.ndarray,
    column_rows: np.ndarray,
) -> tuple[_BlockScan, np.ndarray]:
    """Screen leaders [start, stop), select their rows' top-k and fold them into the column
    tables; returns the block's evaluated values and its row selection."""
    window = screen.window
    n_rows, n_cols = window.n_rows, window.n_cols
    height = stop - start
    sync_block = _NO_SYNC if corr is None else np.array(corr[start:stop], dtype=np.float32)
    bound = np.empty((height, n_cols), dtype=np.float32)
    scan = _BlockScan(
        start,
        improvement=np.full((height, n_cols), np.nan, dtype=np.float32),
        best_corr=np.empty((height, n_cols), dtype=np.float32),
        best_lag=np.empty((height, n_cols), dtype=np.int16),
        best_overlap=np.empty((height, n_cols), dtype=np.int32),
        sync=sync_block if corr is not None else np.empty((height, n_cols), dtype=np.float32),
    )
    first_lag = 0 if screen.with_sync else 1

    def screen_item(item: tuple[int, int, int]) -> None:
        tile_start, col0, col1 = item
        tile_stop = min(tile_start + GEMM_TILE, n_cols)
        products = np.empty(
            (screen.max_lag + 1, tile_stop - tile_start, col1 - col0), dtype=np.float32
        )
        for lag in range(first_lag, screen.max_lag + 1):
            np.matmul(
                window.z_t[tile_start:tile_stop, : n_rows - lag],
                window.z[lag:, col0:col1],
                out=products[lag],
            )
        llk.screen_tile(
            products,
            screen.with_sync,
            screen.max_lag,
            tile_start,
            max(start, tile_start),
            min(stop, tile_stop),
            start,
            col0,
            bound,
            sync_block,
            screen.min_overlap,
            screen.min_improvement,
            screen.gamma,
            FALLBACK_TAU * llk.TAU_SCREEN_FACTOR,
            window.prefix,
            window.prefix_sq,
            window.prefix_t,
            window.prefix_sq_t,
            *screen.intervals,
            *screen.largest,
        )

    items = [
        (tile_start, col0, min(col0 + PRODUCT_COLUMNS, n_cols))
        for tile_start, _ in tiles_covering(start, stop)
        for col0 in range(0, n_cols, PRODUCT_COLUMNS)
    ]
    list(pool.map(screen_item, items))  # list() re-raises a worker's error

    row_values = np.full((height, max(k_rows, 1)), -np.inf, dtype=np.float32)
    row_index = np.full((height, max(k_rows, 1)), -1, dtype=np.int64)
    args = (screen.params, screen.data, sync_block, scan.arrays)
    if k_rows > 0:
        step = max(1, -(-height // (4 * available_cores())))
        list(
            pool.map(
                lambda lo: llk.select_rows(
                    lo, min(lo + step, height), start, bound, *args, row_values, row_index
                ),
                range(0, height, step),
            )
        )
    if k_cols > 0:
        step = max(32, -(-n_cols // (4 * available_cores())))
        list(
            pool.map(
                lambda lo: llk.select_columns(
                    lo, min(lo + step, n_cols), start, bound, *args, column_values, column_rows
                ),
                range(0, n_cols, step),
            )
        )
    local, slot = np.nonzero(row_index >= 0)
    return scan, scan.rows_of(local + start, row_index[local, slot])


def _column_candidates(scan: _BlockScan, column_rows: np.ndarray) -> np.ndarray:
    """Rows of this block that are in a lagger's running top-k (may be displaced later)."""
    in_block = (column_rows >= scan.start) & (column_rows < scan.start + scan.improvement.shape[0])
    laggers, slot = np.nonzero(in_block)
    return scan.rows_of(column_rows[laggers, slot], laggers)


def _final_column_selection(column_pairs: list[np.ndarray], column_rows: np.ndarray) -> np.ndarray:
    """Keep the recorded candidates that are still in their lagger's final top-k."""
    if not column_pairs:
        return np.empty(0, dtype=LEAD_LAG_DTYPE)
    candidates = np.concatenate(column_pairs)
    n_cols = column_rows.shape[0]
    laggers = np.flatnonzero(column_rows.ravel() >= 0) // column_rows.shape[1]
    final_keys = column_rows[column_rows >= 0].astype(np.int64) * n_cols + laggers
    keys = candidates["leader"].astype(np.int64) * n_cols + candidates["lagger"]
    return candidates[np.isin(keys, final_keys)]


def _union_sorted(pairs: np.ndarray) -> np.ndarray:
    """Each ordered pair once, sorted by improvement desc, then leader, then lagger."""
    order = np.lexsort((pairs["lagger"], pairs["leader"], -pairs["improvement"].astype(np.float64)))
    pairs = pairs[order]
    if pairs.size:
        same = (pairs["leader"][1:] == pairs["leader"][:-1]) & (
            pairs["lagger"][1:] == pairs["lagger"][:-1]
        )
        pairs = pairs[np.concatenate([[True], ~same])]
    return pairs
