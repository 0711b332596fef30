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

How, and why it is exactly the brute-force scan (details and formulas in ``kernels``).
The scan goes over row blocks of leaders ``I``:

1. **Screen**: per product tile, one float32 GEMM of the tile's leaders stacked shifted by
   every lag (lags 1..L, and 0 when ``corr`` is not given; :func:`_shifted_leaders`) against
   all N laggers, turned at once into a rigorous *upper* and *lower*
   bound of every pair's improvement, valid for all lags together. No value is taken from the
   GEMM.
2. **Rows**: a leader's ``k_laggers`` best lie in its own row, which the block holds whole.
   The k-th largest lower bound of the row is a threshold no selected pair is below; the pairs
   whose upper bound reaches it are evaluated exactly (``kernels.pair_values``, a
   pure function of the pair) in decreasing order of their bound, stopping at the first bound
   strictly below the k-th exact improvement. A pair left out has k pairs strictly above it,
   so it is in no top-k: the row's top-k is final and exact.
3. **Columns**: each lagger keeps a running top-``k_leaders`` of lower bounds across blocks
   (its k-th value never exceeds the final k-th best improvement); the pairs whose upper bound
   reaches it are pooled (and dropped when it rises above them), and after the last block each
   lagger's pool is evaluated exactly in the same threshold order.

Top-k lists are ordered by (improvement desc, index asc), a total order, so ties go to the
smaller index whatever the order of evaluation. Every reported value comes from the exact
per-pair evaluation, so results are bit-identical for every block size and worker count; the
screen only decides which pairs need it.

On threads, with ``corr`` given and no q-value condition, step 1 takes its bounds from the
exact pass instead (``exact_pass.ExactPass.bound_block``: float64 products, bounds one or two
float32 units apart), which counts the pairs' p-values in the same pass; steps 2 and 3 are the
same.

Nothing of size N × N exists: per block the two bounds are b × N, the running lower bounds
N × k_leaders, the pool holds the few pairs that can still be selected, and the synchronous
correlation is read row block by row block (from the caller's — possibly memory-mapped —
matrix) or bounded from the lag-0 product and computed exactly for the evaluated pairs only.
Cost: one b × T × N product per lag (and lag 0 without ``corr``) per block, one bound per pair
for all lags, and the exact evaluation of the few pairs that can be selected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag import kernels as llk
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.standardize import Standardized
from corr_pipeline.compute.tiling import (
    GEMM_TILE,
    PRODUCT_COLUMNS,
    tiles_covering,
)
from corr_pipeline.compute.validation import (
    check_min_overlap,
    check_positive_int,
    check_returns,
    check_square_corr,
)
from corr_pipeline.compute.workers import available_cores, fresh_buffer, thread_buffer

LEAD_LAG_DTYPE = np.dtype(
    [
        ("leader", np.int32),
        ("lagger", np.int32),
        ("lag", np.int16),
        ("lagged_corr", np.float32),
        ("sync_corr", np.float32),
        ("improvement", np.float32),
        ("overlap", np.int32),
        ("p_value", np.float64),
        ("q_value", np.float64),
    ]
)
"""Columns of :func:`find_lead_lag_pairs`' result (SPEC §6, §9); ``p_value`` and ``q_value``
(SPEC §6 "Significance") are NaN until
:func:`~corr_pipeline.compute.lead_lag.significance.annotate` fills them."""

MAX_BLOCK_ROWS = 2 * GEMM_TILE
"""Default cap on the block height: the b × N arrays stay small and blocks align with tiles."""

_NO_SYNC = np.zeros((1, 1), dtype=np.float32)


def block_row_bytes(n_cols: int) -> int:
    """Per block row: the upper and lower bounds (4 + 4 bytes per pair), the synchronous
    correlation read from ``corr`` (4) and the pool mask and indices (≈ 4)."""
    return n_cols * (4 + 4 + 4 + 4)


def _top_k_arrays(rows: int, k: int) -> tuple[np.ndarray, ...]:
    """(improvement, index, best_corr, best_lag, best_overlap, sync), rows × k, empty."""
    return (
        np.full((rows, k), -np.inf, dtype=np.float32),
        np.full((rows, k), -1, dtype=np.int64),
        np.zeros((rows, k), dtype=np.float32),
        np.zeros((rows, k), dtype=np.int16),
        np.zeros((rows, k), dtype=np.int32),
        np.zeros((rows, k), dtype=np.float32),
    )


def pair_records(top: tuple[np.ndarray, ...], owner_is_leader: bool, offset: int = 0) -> np.ndarray:
    """Result rows of the filled entries of a top-k table (rows = leaders or laggers)."""
    owner, slot = np.nonzero(top[1] >= 0)
    out = np.empty(owner.size, dtype=LEAD_LAG_DTYPE)
    other = top[1][owner, slot]
    out["leader"] = owner + offset if owner_is_leader else other
    out["lagger"] = other if owner_is_leader else owner
    out["improvement"] = top[0][owner, slot]
    out["lagged_corr"] = top[2][owner, slot]
    out["lag"] = top[3][owner, slot]
    out["overlap"] = top[4][owner, slot]
    out["sync_corr"] = top[5][owner, slot]
    out["p_value"] = np.nan
    out["q_value"] = np.nan
    return out


@dataclass(frozen=True)
class _Screen:
    """Everything the screen and the exact evaluation read, built once per call."""

    window: Standardized
    max_lag: int
    with_sync: bool
    min_overlap: int
    min_improvement: float
    extents: tuple[np.ndarray, ...]  # lo, hi, gaps, miss_ptr, miss_rows, miss_cols
    ragged_cols: np.ndarray
    lag_y: np.ndarray  # (3, N): dense leaders' lagger-side sums
    params: tuple
    data: tuple


def make_screen(
    window: Standardized,
    max_lag: int,
    with_sync: bool,
    min_overlap: int,
    min_improvement: float,
    bin_limit: int = N_BINS,
    data: tuple | None = None,
) -> _Screen:
    """What the scan reads; ``bin_limit``: a candidate's best lag has its p-value in a histogram
    bin at most this (``significance.candidate_bin_limit`` of ``max_q_value``; ``N_BINS``: no
    condition); ``data``: the window's ``kernels.pair_data`` when the caller holds it."""
    n_rows = window.n_rows
    lo, hi, gaps, miss_ptr, miss_rows, miss_cols, dense = llk.column_extents(window.present_t)
    end, end_sq = window.prefix[n_rows], window.prefix_sq[n_rows]
    lag_y = np.empty((3, window.n_cols))
    np.max(np.abs(end - window.prefix[1 : max_lag + 1]), axis=0, out=lag_y[0])
    lag_y[1] = end_sq - window.prefix_sq[max_lag]
    lag_y[2] = end_sq - window.prefix_sq[1]
    return _Screen(
        window=window,
        max_lag=max_lag,
        with_sync=with_sync,
        min_overlap=min_overlap,
        min_improvement=min_improvement,
        extents=(lo, hi, gaps, miss_ptr, miss_rows, miss_cols),
        ragged_cols=np.flatnonzero(~dense).astype(np.int64),
        lag_y=lag_y,
        params=(
            max_lag,
            min_overlap,
            FALLBACK_TAU,
            np.float32(min_improvement),
            with_sync,
            int(bin_limit),
        ),
        data=llk.pair_data(window) if data is None else data,
    )


def max_pool(n_cols: int, k: int) -> int:
    """Pooled column candidates kept before they are evaluated (a few tens of MB at most)."""
    return max(1 << 20, 16 * n_cols * k)


def _gemm_rounding(terms: int) -> float:
    """Bound ``γ`` on ``|fl(Σ a·b) − Σ a·b| / Σ|a·b|`` for ``terms`` float32 products, any order
    (``n·u / (1 − n·u)``, u = 2⁻²⁴), doubled for safety."""
    unit = 2.0**-24
    return 2.0 * terms * unit / (1.0 - terms * unit)


class ColumnPool:
    """The column selection across blocks: each lagger's running top-k of *lower* bounds and its
    exact top-k so far (the k-th value of either never exceeds the final k-th best improvement),
    and the pooled pairs whose upper bound reaches both; evaluated exactly after the last block,
    or whenever the pool exceeds ``max_pool`` pairs (so it stays O(N·k) whatever the data).

    ``floor`` (per lagger, optional): a value known not to exceed the lagger's final k-th best
    improvement over *all* leaders (e.g. from leaders scanned elsewhere). Pairs whose upper bound
    is strictly below it are in no final top-k and are not pooled; the tables then hold, per
    lagger, the exact top-k among the pooled pairs, which contains every pair of the final
    top-k that this pool's leaders have."""

    def __init__(self, n_cols: int, k: int, max_pool: int, floor: np.ndarray | None = None) -> None:
        self.k = k
        self.max_pool = max_pool
        self.lower = np.full((n_cols, max(k, 1)), -np.inf, dtype=np.float32)
        self.top = _top_k_arrays(n_cols, max(k, 1))
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.floor = (
            np.full(n_cols, -np.inf, dtype=np.float32)
            if floor is None
            else np.asarray(floor, dtype=np.float32)
        )

    def _threshold(self) -> np.ndarray:
        return np.maximum(np.maximum(self.lower[:, -1], self.top[0][:, -1]), self.floor)

    def add_block(
        self,
        start: int,
        upper: np.ndarray,
        lower: np.ndarray,
        sync: np.ndarray | None,
        screen: _Screen,
        pool,
    ) -> None:
        n_cols = upper.shape[1]
        step = max(64, -(-n_cols // (4 * available_cores())))
        found = list(
            pool.map(
                lambda lo: llk.fold_columns(
                    lo, min(lo + step, n_cols), lower, upper, self.lower, self.top[0], self.floor
                ),
                range(0, n_cols, step),
            )
        )
        rows = np.concatenate([part[0] for part in found])
        laggers = np.concatenate([part[1] for part in found])
        syncs = sync[rows, laggers] if sync is not None else np.full(rows.size, np.nan, np.float32)
        self.parts.append((rows + start, laggers, upper[rows, laggers], syncs))
        self._prune()
        if self.parts[0][0].size > self.max_pool:
            self._evaluate(screen, pool)

    def _prune(self) -> None:
        """Drop pooled pairs whose bound fell strictly below their lagger's threshold."""
        leaders, laggers, upper, syncs = (np.concatenate(a) for a in zip(*self.parts, strict=True))
        keep = upper >= self._threshold()[laggers]
        self.parts = [(leaders[keep], laggers[keep], upper[keep], syncs[keep])]

    def _evaluate(self, screen: _Screen, pool) -> None:
        """Evaluate the pool into the exact top-k tables (threshold order) and empty it."""
        n_cols = self.lower.shape[0]
        self._prune()
        leaders, laggers, upper, syncs = self.parts[0]
        self.parts = []
        order = np.lexsort((leaders, -upper.astype(np.float64), laggers))
        leaders, laggers, upper, syncs = (
            leaders[order].astype(np.int64),
            laggers[order].astype(np.int64),
            upper[order],
            syncs[order],
        )
        starts = np.searchsorted(laggers, np.arange(n_cols + 1))
        step = max(64, -(-n_cols // (8 * available_cores())))
        list(
            pool.map(
                lambda lo: llk.select_columns(
                    lo,
                    min(lo + step, n_cols),
                    starts,
                    leaders,
                    laggers,
                    upper,
                    syncs,
                    screen.params,
                    screen.data,
                    self.top,
                ),
                range(0, n_cols, step),
            )
        )

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The pooled pairs not evaluated yet, pruned: (leaders, laggers, upper, syncs)."""
        if not self.parts:
            empty = np.empty(0, dtype=np.float32)
            return np.empty(0, np.int32), np.empty(0, np.int32), empty, empty.copy()
        self._prune()
        leaders, laggers, upper, syncs = self.parts[0]
        return leaders, laggers, upper, syncs

    def take(
        self, leaders: np.ndarray, laggers: np.ndarray, upper: np.ndarray, syncs: np.ndarray
    ) -> None:
        """Pool pairs screened elsewhere (their upper bounds and synchronous correlations,
        NaN when ``corr`` is not given), e.g. by the blocks of other processes."""
        self.parts.append((leaders, laggers, upper, syncs))

    def select(self, screen: _Screen, pool) -> np.ndarray:
        if self.parts:
            self._evaluate(screen, pool)
        return pair_records(self.top, owner_is_leader=False)


def _shifted_leaders(window: Standardized, tile_start: int, first_lag: int, max_lag: int):
    """The leaders of one tile shifted down by each lag: ``S[ℓ − first_lag, i, u] = Z[u − ℓ, i]``
    (0 for ``u < ℓ``), so that one product ``S · Z`` gives every lag's
    ``Σ_{t < T−ℓ} Z[t, i]·Z[t + ℓ, j]`` (the added terms are exact zeros)."""
    n_rows = window.n_rows
    rows = window.z_t[tile_start : min(tile_start + GEMM_TILE, window.n_cols)]
    shifted = np.zeros((max_lag + 1 - first_lag, rows.shape[0], n_rows), dtype=np.float32)
    for lag in range(first_lag, max_lag + 1):
        shifted[lag - first_lag, :, lag:] = rows[:, : n_rows - lag]
    return shifted


def _screen_block(
    start: int, stop: int, corr: np.ndarray | None, screen: _Screen, pool, empty=fresh_buffer
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper and lower improvement bounds (b × N float32, −inf where none) of leaders
    [start, stop), and the block's rows of ``corr`` (a 1 × 1 dummy when it is not given), in
    arrays from ``empty(name, shape, dtype)`` (fresh ones, or a thread's reused buffers:
    :func:`~corr_pipeline.compute.workers.thread_buffer`)."""
    window = screen.window
    n_rows, n_cols = window.n_rows, window.n_cols
    height = stop - start
    sync_block = _NO_SYNC
    if corr is not None:
        sync_block = empty("lead-lag-sync", (height, n_cols), np.float32)
        np.copyto(sync_block, corr[start:stop])
    upper = empty("lead-lag-upper", (height, n_cols), np.float32)
    lower = empty("lead-lag-lower", (height, n_cols), np.float32)
    first_lag = 0 if screen.with_sync else 1
    params = (
        screen.with_sync,
        screen.max_lag,
        screen.min_overlap,
        screen.min_improvement,
        _gemm_rounding(n_rows),
        FALLBACK_TAU * llk.TAU_SCREEN_FACTOR,
        screen.params[5],
    )
    arrays = (
        window.z,
        window.z_t,
        window.prefix,
        window.prefix_sq,
        window.prefix_t,
        window.prefix_sq_t,
        *screen.extents,
        screen.ragged_cols,
        screen.lag_y,
    )

    tiles = tiles_covering(start, stop)
    shifted = {
        tile_start: _shifted_leaders(window, tile_start, first_lag, screen.max_lag)
        for tile_start, _ in tiles
    }

    def screen_item(item: tuple[int, int, int]) -> None:
        tile_start, col0, col1 = item
        leaders = shifted[tile_start]
        products = thread_buffer(
            "lead-lag-products", (screen.max_lag + 1, leaders.shape[1], col1 - col0), np.float32
        )
        np.matmul(
            leaders.reshape(-1, n_rows),
            window.z[:, col0:col1],
            out=products[first_lag:].reshape(-1, col1 - col0),
        )
        llk.screen_tile(
            products,
            (
                tile_start,
                max(start, tile_start),
                min(stop, tile_start + leaders.shape[1]),
                start,
                col0,
            ),
            params,
            arrays,
            (upper, lower, sync_block),
        )

    items = [
        (tile_start, col0, min(col0 + PRODUCT_COLUMNS, n_cols))
        for tile_start, _ in tiles
        for col0 in range(0, n_cols, PRODUCT_COLUMNS)
    ]
    list(pool.map(screen_item, items))  # list() re-raises a worker's error
    return upper, lower, sync_block


def check_lead_lag_args(
    R: np.ndarray,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float,
    corr: np.ndarray | None,
    max_q_value: float = 1.0,
) -> None:
    """Raise on arguments :func:`find_lead_lag_pairs` does not accept."""
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
    if not 0.0 < max_q_value <= 1.0:
        raise ValueError(f"max_q_value must lie in (0, 1], got {max_q_value}")
    if corr is not None:
        check_square_corr(corr)
        if corr.shape[0] != n_cols:
            raise ValueError(f"corr is {corr.shape[0]} × {corr.shape[1]} but R has N = {n_cols}")


def scan_block(
    start: int,
    stop: int,
    corr: np.ndarray | None,
    screen: _Screen,
    k_rows: int,
    pool,
    columns: ColumnPool,
    empty=fresh_buffer,
    bounds: Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
) -> np.ndarray:
    """Screen leaders [start, stop), select their rows' top-k (returned as result rows) and
    pool their column candidates (``empty``: as :func:`_screen_block`'s). ``bounds(start,
    stop)``, when given, stands in for the screen: any ``(upper, lower, sync_block)`` that
    bound every pair's exact improvement as :func:`_screen_block`'s do (e.g. the exact pass's,
    ``exact_pass.ExactPass.bound_block``)."""
    height = stop - start
    if bounds is None:
        upper, lower, sync_block = _screen_block(start, stop, corr, screen, pool, empty)
    else:
        upper, lower, sync_block = bounds(start, stop)
    rows = np.empty(0, dtype=LEAD_LAG_DTYPE)
    if k_rows > 0:
        top = _top_k_arrays(height, k_rows)
        step = max(1, -(-height // (4 * available_cores())))
        list(
            pool.map(
                lambda lo: llk.select_rows(
                    lo,
                    min(lo + step, height),
                    start,
                    upper,
                    lower,
                    sync_block,
                    screen.with_sync,
                    screen.params,
                    screen.data,
                    top,
                ),
                range(0, height, step),
            )
        )
        rows = pair_records(top, owner_is_leader=True, offset=start)
    if columns.k > 0:
        columns.add_block(start, upper, lower, None if corr is None else sync_block, screen, pool)
    return rows


def union_sorted(pairs: np.ndarray) -> np.ndarray:
    """Each ordered pair once, sorted by improvement desc, then leader, then lagger."""
    order = np.lexsort((pairs["lagger"], pairs["leader"], -pairs["improvement"].astype(np.float64)))
    pairs = pairs[order]
    if pairs.size:
        same = (pairs["leader"][1:] == pairs["leader"][:-1]) & (
            pairs["lagger"][1:] == pairs["lagger"][:-1]
        )
        pairs = pairs[np.concatenate([[True], ~same])]
    return pairs
