"""The selection of the lead-lag scan (SPEC §6) from bounds of every pair's improvement, in
O(block × N) memory.

Definitions (SPEC §6). For ``ℓ = 1 .. max_lag`` and the scanned series ``X`` (the returns, or
their market residuals)

    lagged[ℓ][i, j] = pairwise-complete Pearson corr of (X[t, i], X[t + ℓ, j]), t = 0 .. T−1−ℓ

(NaN below ``min_overlap`` or on zero variance). For ``i != j``: the best lag ``ℓ*`` maximises
the finite ``|lagged[ℓ][i, j]|`` (ties to the smaller ℓ); ``improvement = |lagged[ℓ*][i, j]| −
|sync[i, j]|`` (NaN sync counts as 0); ``(i, j)`` is a candidate iff a finite lag exists,
``improvement > min_improvement`` and its q-value is at most ``max_q_value``. Selection: every
symbol ``s`` keeps its ``k_laggers`` best candidates ``(s, j)`` and its ``k_leaders`` best
candidates ``(i, s)`` (largest improvement, ties to the smaller index); the result is their
union, sorted by improvement desc, then leader, then lagger.

How, and why it is exactly the brute-force scan. The scan goes over blocks of leaders; for
each, the sweep (:mod:`.sweep`) gives rigorous *upper* and *lower* bounds of every pair's
improvement, valid for all lags together (no value is taken from them):

1. **Rows**: a leader's ``k_laggers`` best lie in its own row, which the block holds whole.
   The k-th largest lower bound of the row is a threshold no selected pair is below; the pairs
   whose upper bound reaches it are evaluated exactly (``kernels.pair_values``, a pure function
   of the pair) in decreasing order of their bound, stopping at the first bound strictly below
   the k-th exact improvement. A pair left out has k pairs strictly above it, so it is in no
   top-k: the row's top-k is final and exact.
2. **Columns**: each lagger keeps a running top-``k_leaders`` of lower bounds across blocks
   (its k-th value never exceeds the final k-th best improvement); the pairs whose upper bound
   reaches it are pooled (and dropped when it rises above them), and after the last block each
   lagger's pool is evaluated exactly in the same threshold order (:class:`ColumnPool`).

Top-k lists are ordered by (improvement desc, index asc), a total order, so ties go to the
smaller index whatever the order of evaluation. Every reported value comes from the exact
per-pair evaluation, so results are the same for every block size, worker count and stripe;
the bounds only decide which pairs need it.

Nothing of size N × N exists: per block the two bounds are b × N, the running lower bounds
N × k_leaders, the pool holds the few pairs that can still be selected, and the synchronous
correlation is read row block by row block (from the caller's — possibly memory-mapped —
matrix) or bounded from the lag-0 product and computed exactly for the evaluated pairs only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag import kernels as llk
from corr_pipeline.compute.lead_lag.kernels import pair_data
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.standardize import Standardized
from corr_pipeline.compute.tiling import GEMM_TILE
from corr_pipeline.compute.validation import (
    check_min_overlap,
    check_positive_int,
    check_returns,
    check_square_corr,
)
from corr_pipeline.compute.workers import available_cores

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
        ("reverse_lag", np.int16),
        ("reverse_lagged_corr", np.float32),
        ("reverse_q_value", np.float64),
    ]
)
"""Columns of :func:`find_lead_lag_pairs`' result (SPEC §6, §9). ``p_value``, ``q_value`` and the
reverse direction (the ordered pair ``(lagger, leader)``: its best lag, 0 without one, its
lagged correlation and q-value, NaN without one) are filled in by
:func:`~corr_pipeline.compute.lead_lag.significance.annotate`."""

MAX_BLOCK_ROWS = 2 * GEMM_TILE
"""Default cap on the block height: the b × N arrays stay small and blocks align with tiles."""


@dataclass(frozen=True)
class Evaluation:
    """What the exact per-pair evaluation reads: ``kernels.pair_values``' ``params``
    (max_lag, min_overlap, tau, min_improvement as float32, with_sync, bin_limit) and the
    window's ``kernels.pair_data``."""

    params: tuple
    data: tuple

    @property
    def with_sync(self) -> bool:
        return bool(self.params[4])


def make_evaluation(
    window: Standardized,
    max_lag: int,
    with_sync: bool,
    min_overlap: int,
    min_improvement: float,
    bin_limit: int = N_BINS,
    data: tuple | None = None,
) -> Evaluation:
    """The :class:`Evaluation` of a call; ``with_sync``: the synchronous correlation is computed
    per pair (``corr`` not given); ``bin_limit``: a candidate's best lag has its p-value in a
    histogram bin at most this (``significance.candidate_bin_limit`` of ``max_q_value``;
    ``N_BINS``: no condition); ``data``: the window's ``kernels.pair_data`` when the caller
    holds it."""
    return Evaluation(
        params=(
            max_lag,
            min_overlap,
            FALLBACK_TAU,
            np.float32(min_improvement),
            with_sync,
            int(bin_limit),
        ),
        data=pair_data(window) if data is None else data,
    )


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


def pair_records(
    top: tuple[np.ndarray, ...], owner_is_leader: bool, owners: np.ndarray | None = None
) -> np.ndarray:
    """Result rows of the filled entries of a top-k table whose rows are the leaders
    ``owners`` (``owner_is_leader``) or the laggers ``0 .. N − 1``."""
    owner, slot = np.nonzero(top[1] >= 0)
    out = np.zeros(owner.size, dtype=LEAD_LAG_DTYPE)
    other = top[1][owner, slot]
    owner_index = owner if owners is None else owners[owner]
    out["leader"] = owner_index if owner_is_leader else other
    out["lagger"] = other if owner_is_leader else owner_index
    out["improvement"] = top[0][owner, slot]
    out["lagged_corr"] = top[2][owner, slot]
    out["lag"] = top[3][owner, slot]
    out["overlap"] = top[4][owner, slot]
    out["sync_corr"] = top[5][owner, slot]
    for name in ("p_value", "q_value", "reverse_lagged_corr", "reverse_q_value"):
        out[name] = np.nan
    return out


def max_pool(n_cols: int, k: int) -> int:
    """Pooled column candidates kept before they are evaluated (a few tens of MB at most)."""
    return max(1 << 20, 16 * n_cols * k)


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
        leaders: np.ndarray,
        upper: np.ndarray,
        lower: np.ndarray,
        sync: np.ndarray | None,
        evaluation: Evaluation,
        pool,
    ) -> None:
        """Fold a block's bounds (rows: ``leaders``) in and pool its column candidates."""
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
        self.parts.append((leaders[rows], laggers, upper[rows, laggers], syncs))
        self._prune()
        if self.parts[0][0].size > self.max_pool:
            self._evaluate(evaluation, pool)

    def _prune(self) -> None:
        """Drop pooled pairs whose bound fell strictly below their lagger's threshold."""
        leaders, laggers, upper, syncs = (np.concatenate(a) for a in zip(*self.parts, strict=True))
        keep = upper >= self._threshold()[laggers]
        self.parts = [(leaders[keep], laggers[keep], upper[keep], syncs[keep])]

    def _evaluate(self, evaluation: Evaluation, pool) -> None:
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
                    evaluation.params,
                    evaluation.data,
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
        """Pool pairs bounded elsewhere (their upper bounds and synchronous correlations,
        NaN when ``corr`` is not given), e.g. by the blocks of other processes."""
        self.parts.append((leaders, laggers, upper, syncs))

    def select(self, evaluation: Evaluation, pool) -> np.ndarray:
        """The exact top-k of every lagger (result rows)."""
        if self.parts:
            self._evaluate(evaluation, pool)
        return pair_records(self.top, owner_is_leader=False)


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
    leaders: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray, np.ndarray],
    given_sync: bool,
    evaluation: Evaluation,
    k_rows: int,
    pool,
    columns: ColumnPool,
) -> np.ndarray:
    """Select the rows' top-k of the block of ``leaders`` (returned as result rows) and pool
    their column candidates, from ``bounds = (upper, lower, sync_block)`` (each ``b × N``, the
    last the block's rows of ``corr`` when ``given_sync``): any bounds of every pair's exact
    improvement, such as :func:`~corr_pipeline.compute.lead_lag.sweep.block_bounds`'."""
    upper, lower, sync_block = bounds
    height = leaders.size
    rows = np.empty(0, dtype=LEAD_LAG_DTYPE)
    if k_rows > 0:
        top = _top_k_arrays(height, k_rows)
        step = max(1, -(-height // (4 * available_cores())))
        list(
            pool.map(
                lambda lo: llk.select_rows(
                    lo,
                    min(lo + step, height),
                    leaders,
                    upper,
                    lower,
                    sync_block,
                    evaluation.with_sync,
                    evaluation.params,
                    evaluation.data,
                    top,
                ),
                range(0, height, step),
            )
        )
        rows = pair_records(top, owner_is_leader=True, owners=leaders)
    if columns.k > 0:
        columns.add_block(
            leaders, upper, lower, sync_block if given_sync else None, evaluation, pool
        )
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
