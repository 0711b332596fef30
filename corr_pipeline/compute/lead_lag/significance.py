"""Significance of lead-lag pairs: Šidák p-values and Benjamini–Hochberg q-values (SPEC §6).

For an ordered pair ``(i, j)`` with best lag ``ℓ*`` (:mod:`lead_lag`), ``r`` its lagged
correlation and ``n`` its overlap:

    z = atanh(r)·sqrt(n − 3)      p = erfc(|z| / √2)      p_value = 1 − (1 − p)^max_lag

and, over all ``m`` ordered pairs ``i != j`` that have a best lag (not only the reported ones),
with the p-values sorted ascending,

    q_(k) = min over l >= k of p_(l)·m / l,   capped at 1.

**How, in O(block × N) memory.** The q-value of a p-value ``p`` is ``inf over t >= p of
m·t / F(t)``, ``F(t)`` the number of pairs with a p-value ``<= t``, so q-values need the counts
``F``, not the sorted p-values. One exact pass over row blocks of leaders computes every pair's
best-lag correlation (per lag one float64 product ``Z_I(t)ᵀ Z(t + ℓ)`` of the zero-filled
standardized window, whose entries are the pairs' ``Sxy``, then
``kernels.lagged_from_sums`` per pair: the exact evaluation's formula) and counts its
p-value in a histogram whose bins are the float64 p-values' leading bits: exponent and the first
:data:`MANTISSA_BITS` mantissa bits, so a bin ``[lo, hi)`` has ``hi / lo <= 1 + 2⁻¹⁷``. With
``C_b`` the pairs in bins ``<= b``, a pair in bin ``b`` has

    q ∈ [min(m·p / C_b, min over b' > b of m·lo_b' / C_b'),  min over b' >= b of m·hi_b' / C_b']

(every pair of bin ``b'`` has rank ``<= C_b'`` and the last one rank ``C_b'``), an interval of
relative width at most ``2⁻¹⁷ ≈ 7.6e-6``; the upper end is reported, so every q-value is within
``7.6e-6·q`` of the exact one, and pairs of equal p-value get equal q-values. P-values below
:data:`SMALLEST_BINNED` share bin 0: their q-value is at most ``m·2⁻⁵⁰ / C_0 < 1e-6`` for any
``m < 2³⁰``, reported as that bound. The reported pairs' p-values are computed exactly from the
pair alone (``kernels.lagged_value`` at each lag), so they do not depend on the blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.kernels import (
    lagged_from_sums,
    lagged_value,
    overlap_moments,
    pair_data,
)
from corr_pipeline.compute.standardize import Standardized, standardize
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, row_blocks
from corr_pipeline.compute.validation import check_min_overlap, check_positive_int, check_returns
from corr_pipeline.compute.workers import worker_pool

MANTISSA_BITS = 17
"""Mantissa bits of a p-value that pick its histogram bin: bins of relative width ``2⁻¹⁷``."""

_SHIFT = 52 - MANTISSA_BITS
_SMALLEST_EXPONENT = -50
SMALLEST_BINNED = 2.0**_SMALLEST_EXPONENT
"""P-values below this share bin 0 (their q-values are below 1e-6 whatever the universe)."""

_BASE_KEY = int(np.float64(SMALLEST_BINNED).view(np.int64)) >> _SHIFT
N_BINS = (int(np.float64(1.0).view(np.int64)) >> _SHIFT) - _BASE_KEY + 2
"""Bin 0 below :data:`SMALLEST_BINNED`, then one bin per 17-bit mantissa prefix up to 1.0."""


@dataclass(frozen=True)
class Significance:
    """P- and q-values of the reported pairs, aligned with them; ``m`` the pairs counted."""

    p_value: np.ndarray  # float64
    q_value: np.ndarray  # float64
    m: int


def pair_significance(
    R: np.ndarray,
    leaders: np.ndarray,
    laggers: np.ndarray,
    *,
    max_lag: int,
    min_overlap: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    block_rows: int | None = None,
    window: Standardized | None = None,
) -> Significance:
    """P- and q-values (see the module docstring) of the ordered pairs ``(leaders[k],
    laggers[k])`` of the columns of ``R`` (float32 T × N returns, NaN where missing), each with a
    best lag over lags ``1 .. max_lag``. ``window``: ``standardize(R)`` when the caller has it.
    The result does not depend on ``working_memory_mb`` or ``block_rows``."""
    check_returns(R)
    n_rows, n_cols = R.shape
    check_positive_int(max_lag, "max_lag")
    if max_lag >= n_rows:
        raise ValueError(f"max_lag must be < T = {n_rows}, got {max_lag}")
    check_min_overlap(min_overlap, n_rows)
    leaders = np.asarray(leaders, dtype=np.int64)
    laggers = np.asarray(laggers, dtype=np.int64)
    _check_pairs(leaders, laggers, n_cols)
    if window is None:
        with worker_pool() as pool:
            window = standardize(R, pool, layout="lead-lag")
    data = pair_data(window)
    p_value = _pair_p_values(leaders, laggers, max_lag, min_overlap, FALLBACK_TAU, data)
    if np.isnan(p_value).any():
        k = int(np.flatnonzero(np.isnan(p_value))[0])
        raise ValueError(
            f"pair {k} ({leaders[k]}, {laggers[k]}) has no finite lagged correlation "
            f"at lags 1..{max_lag} with min_overlap = {min_overlap}: it has no best lag"
        )
    counts = p_value_histogram(window, data, max_lag, min_overlap, working_memory_mb, block_rows)
    m = int(counts.sum())
    return Significance(p_value, _q_values(p_value, counts, m), m)


def _check_pairs(leaders: np.ndarray, laggers: np.ndarray, n_cols: int) -> None:
    if leaders.shape != laggers.shape or leaders.ndim != 1:
        raise ValueError(
            f"leaders and laggers must be 1-d of one length, got {leaders.shape}, {laggers.shape}"
        )
    for name, side in (("leader", leaders), ("lagger", laggers)):
        bad = np.flatnonzero((side < 0) | (side >= n_cols))
        if bad.size:
            raise ValueError(f"pair {bad[0]}: {name} {side[bad[0]]} is outside [0, {n_cols})")
    same = np.flatnonzero(leaders == laggers)
    if same.size:
        raise ValueError(f"pair {same[0]} is a symbol with itself ({leaders[same[0]]})")


def p_value_histogram(
    window: Standardized,
    data: tuple,
    max_lag: int,
    min_overlap: int,
    working_memory_mb: float,
    block_rows: int | None,
) -> np.ndarray:
    """Counts (int64, :data:`N_BINS`) of the best-lag p-values of every ordered pair ``i != j``
    that has a best lag, by one pass over row blocks of leaders (module docstring)."""
    n_rows, n_cols = window.n_rows, window.n_cols
    # per block row: the lag's product (8 bytes a pair), the best |r| (4), r (8) and n (4)
    blocks = row_blocks(n_cols, 24 * n_cols, working_memory_mb, block_rows=block_rows)
    z64 = window.z.astype(np.float64)
    counts = np.zeros(N_BINS, dtype=np.int64)
    sides = [_complete_sides(window, data, lag) for lag in range(1, max_lag + 1)]
    for start, stop in blocks:
        rows = stop - start
        best = (
            np.full((rows, n_cols), -1.0, dtype=np.float32),
            np.zeros((rows, n_cols), dtype=np.float64),
            np.zeros((rows, n_cols), dtype=np.int64),
        )
        for lag, (n_fast, x_side, y_side) in enumerate(sides, start=1):
            product = z64[: n_rows - lag, start:stop].T @ z64[lag:, :]
            _fold_lag(
                product, start, lag, n_fast, x_side, y_side, min_overlap, FALLBACK_TAU, data, best
            )
        _count_p_values(*best, max_lag, counts)
    return counts


def _complete_sides(window: Standardized, data: tuple, lag: int) -> tuple:
    """Per column, for lag ``lag``: whether it is present on every row of the window (then a
    pair of two such columns has the overlap ``n = T − lag`` and per-column sums), its sum
    over the leader's rows ``[0, T − lag)`` and the lagger's ``[lag, T)`` and the inverse square
    roots of the variances there (0 when a variance needs the float64 fallback)."""
    n_rows = window.n_rows
    gap_ptr, lo, hi = data[6], data[8], data[9]
    complete = (lo == 0) & (hi == n_rows) & (np.diff(gap_ptr) == 0)
    n = n_rows - lag
    prefix, prefix_sq = window.prefix, window.prefix_sq
    sides = []
    for row0, row1 in ((0, n), (lag, n_rows)):
        total = prefix[row1] - prefix[row0]
        base = prefix_sq[row1] - prefix_sq[row0]
        var = base - total * total / n
        conditioned = var > FALLBACK_TAU * base
        inv_sd = np.zeros(window.n_cols)
        inv_sd[conditioned] = 1.0 / np.sqrt(var[conditioned])
        sides.append((complete & conditioned, total, inv_sd))
    return n, sides[0], sides[1]


@njit(cache=True, nogil=True)
def _fold_lag(
    product, start, lag, n_fast, x_side, y_side, min_overlap, tau, data, best
):  # pragma: no cover - compiled
    """Keep, per pair of the block, the lag with the largest float32 ``|r|`` so far (ties to
    the smaller lag, as ``kernels.pair_values``), ``r`` exact from its ``Sxy``: for
    two complete, well-conditioned columns ``(Sxy − Sx·Sy/n)·(1/sd_x)·(1/sd_y)``, else
    ``kernels.lagged_from_sums`` of the pair's own overlap."""
    best_abs, best_r, best_n = best
    fast_x, sum_x, inv_x = x_side
    fast_y, sum_y, inv_y = y_side
    inv_n = 1.0 / n_fast
    rows, n_cols = product.shape
    for r in range(rows):
        i = start + r
        for j in range(n_cols):
            if j == i:
                continue
            if fast_x[i] and fast_y[j]:
                value = (product[r, j] - sum_x[i] * sum_y[j] * inv_n) * inv_x[i] * inv_y[j]
                value = min(1.0, max(-1.0, value))
                count = n_fast
            else:
                sums = overlap_moments(i, j, lag, data)
                if sums[8] < min_overlap:
                    continue
                value, count = lagged_from_sums(
                    i, j, lag, product[r, j], sums, min_overlap, tau, data
                )
                if math.isnan(value):
                    continue
            magnitude = abs(np.float32(value))
            if magnitude > best_abs[r, j]:
                best_abs[r, j] = magnitude
                best_r[r, j] = value
                best_n[r, j] = count


@njit(cache=True, nogil=True, inline="always")
def sidak_p_value(r, n, max_lag):  # pragma: no cover - compiled
    """``1 − (1 − erfc(|atanh(r)|·sqrt(n − 3) / √2))^max_lag`` (0 for ``|r| = 1``)."""
    magnitude = min(abs(r), 1.0)
    if magnitude >= 1.0:
        return 0.0
    z = math.atanh(magnitude) * math.sqrt(max(n - 3.0, 0.0))
    p = math.erfc(z / math.sqrt(2.0))
    if p >= 1.0:
        return 1.0
    return -math.expm1(max_lag * math.log1p(-p))


@njit(cache=True, nogil=True, inline="always")
def _bin_of(p):  # pragma: no cover - compiled
    if p < SMALLEST_BINNED:
        return 0
    key = np.int64(np.float64(p).view(np.int64)) >> _SHIFT
    return key - _BASE_KEY + 1


@njit(cache=True, nogil=True)
def _count_p_values(best_abs, best_r, best_n, max_lag, counts):  # pragma: no cover - compiled
    rows, n_cols = best_abs.shape
    for r in range(rows):
        for j in range(n_cols):
            if best_abs[r, j] >= 0.0:
                counts[_bin_of(sidak_p_value(best_r[r, j], best_n[r, j], max_lag))] += 1


@njit(cache=True, nogil=True)
def _pair_p_values(
    leaders, laggers, max_lag, min_overlap, tau, data
):  # pragma: no cover - compiled
    """Per pair, the p-value of its best lag (NaN without one), the pair alone evaluated."""
    out = np.empty(leaders.size, dtype=np.float64)
    for k in range(leaders.size):
        best_abs = np.float32(-1.0)
        best_r = np.nan
        best_n = 0
        for lag in range(1, max_lag + 1):
            value, count = lagged_value(leaders[k], laggers[k], lag, min_overlap, tau, data)
            magnitude = abs(np.float32(value))
            if magnitude > best_abs:
                best_abs = magnitude
                best_r = value
                best_n = count
        out[k] = sidak_p_value(best_r, best_n, max_lag) if best_abs >= 0 else np.nan
    return out


def _bin_upper_edges() -> np.ndarray:
    """``hi_b`` of every bin: bin 0 ends at :data:`SMALLEST_BINNED`, bin ``b >= 1`` holds the
    float64 values whose leading bits are ``_BASE_KEY + b − 1``."""
    keys = np.arange(_BASE_KEY + 1, _BASE_KEY + N_BINS, dtype=np.int64) << _SHIFT
    return np.concatenate([[SMALLEST_BINNED], keys.view(np.float64)])


def _q_values(p_value: np.ndarray, counts: np.ndarray, m: int) -> np.ndarray:
    """The upper end of each p-value's q interval (module docstring), capped at 1."""
    if p_value.size == 0:
        return np.empty(0, dtype=np.float64)
    cumulative = np.cumsum(counts)
    filled = counts > 0
    ratio = np.full(counts.size, np.inf)
    ratio[filled] = m * _bin_upper_edges()[filled] / cumulative[filled]
    suffix_min = np.minimum.accumulate(ratio[::-1])[::-1]
    bins = (np.ascontiguousarray(p_value, np.float64).view(np.int64) >> _SHIFT) - _BASE_KEY + 1
    bins[p_value < SMALLEST_BINNED] = 0
    return np.minimum(suffix_min[bins], 1.0)
