"""Significance of lead-lag pairs: Šidák p-values and Benjamini–Hochberg q-values (SPEC §6).

For an ordered pair ``(i, j)`` with best lag ``ℓ*`` (:mod:`lead_lag`), ``r`` its lagged
correlation and ``n`` its overlap:

    z = atanh(r)·sqrt(n − 3)      p = erfc(|z| / √2)      p_value = 1 − (1 − p)^max_lag

and, over all ``m`` ordered pairs ``i != j`` that have a best lag (not only the reported ones),
with the p-values sorted ascending,

    q_(k) = min over l >= k of p_(l)·m / l,   capped at 1.

**How, in O(block × N) memory.** The q-value of a p-value ``p`` is ``inf over t >= p of
m·t / F(t)``, ``F(t)`` the number of pairs with a p-value ``<= t``, so q-values need the counts
``F``, not the sorted p-values. One exact pass over product tiles of leaders computes every
pair's best-lag correlation (per tile one float64 product of the tile's leaders shifted by every
lag against a chunk of laggers, whose entries are the pairs' ``Sxy``, then the exact
evaluation's sums and formula, vectorised over the laggers) and counts its lag p-value ``p``
(before Šidák, which is increasing) in the histogram of
:mod:`~corr_pipeline.compute.lead_lag.p_values`, whose bins hold p-values within a factor
``1 + 2⁻¹⁷`` of each other (``1 + 2⁻¹²`` below ``p = 1.3e-17``; the histogram bins
``u = z + z²/2``, which needs no ``erfc``), and so does their image under Šidák (concave
through 0). With ``C_b`` the pairs in bins ``<= b`` and ``hi'_b`` the Šidák p-value of the
bin's largest p-value, a pair in bin ``b`` has

    q ∈ [min(m·p_value / C_b, min over b' > b of m·lo'_b' / C_b'),  min over b' >= b of m·hi'_b' / C_b']

(every pair of bin ``b'`` has rank ``<= C_b'`` and the last one rank ``C_b'``), an interval of
relative width at most ``7.6e-6`` (``2.4e-4`` where ``q < 1e-6``); the upper end is reported,
and pairs of equal p-value get equal q-values. The histogram is kept sparse (the bins that hold
pairs) and does not depend on the tiles' order, the threads or the stripes.

**Significant candidates** (``max_q_value`` < 1). The reported q-value is a non-decreasing step
function of the bin, so ``q <= max_q_value`` exactly when the pair's bin is at most the last
bin whose q-value is ``<= max_q_value`` (:func:`candidate_bin_limit`): the scan's candidacy
condition (``kernels.pair_values``), bounded by its screen.

The reported pairs' p-values are computed exactly from the pair alone (``kernels.lagged_value``
at each lag), so they do not depend on the tiles.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.kernels import (
    lagged_from_sums,
    lagged_value,
    pair_data,
)
from corr_pipeline.compute.lead_lag.p_values import N_BINS, bin_upper_p, lag_p_value, p_bin
from corr_pipeline.compute.standardize import Standardized, standardize
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, Progress, tiles_covering
from corr_pipeline.compute.validation import check_min_overlap, check_positive_int, check_returns
from corr_pipeline.compute.workers import available_cores, worker_pool


@dataclass(frozen=True)
class PValueCounts:
    """The histogram of the lag p-values of every ordered pair with a best lag, sparse: the bins
    that hold pairs (ascending) and how many each."""

    bins: np.ndarray  # int32 (``p_values.N_BINS`` < 2³¹)
    counts: np.ndarray  # int64

    @property
    def m(self) -> int:
        """The pairs counted."""
        return int(self.counts.sum())

    @classmethod
    def merge(cls, parts: list[PValueCounts]) -> PValueCounts:
        """One histogram of several (of disjoint sets of pairs)."""
        if not parts:
            return cls(np.empty(0, np.int32), np.empty(0, np.int64))
        bins, where = np.unique(np.concatenate([p.bins for p in parts]), return_inverse=True)
        weights = np.concatenate([p.counts for p in parts]).astype(np.float64)  # < 2⁵³: exact
        counts = np.bincount(where, weights=weights, minlength=bins.size)
        return cls(bins.astype(np.int32), counts.astype(np.int64))


@dataclass(frozen=True)
class Significance:
    """P- and q-values of the reported pairs, aligned with them; ``m`` the pairs counted."""

    p_value: np.ndarray  # float64
    q_value: np.ndarray  # float64
    m: int


def sidak(p: np.ndarray | float, max_lag: int) -> np.ndarray:
    """``1 − (1 − p)^max_lag``, in float64."""
    with np.errstate(divide="ignore"):  # p = 1: log1p(−1) = −inf, and the result 1
        return -np.expm1(max_lag * np.log1p(-np.asarray(p, dtype=np.float64)))


def pair_significance(
    R: np.ndarray,
    leaders: np.ndarray,
    laggers: np.ndarray,
    *,
    max_lag: int,
    min_overlap: int,
    block_rows: int | None = None,
) -> Significance:
    """P- and q-values (see the module docstring) of the ordered pairs ``(leaders[k],
    laggers[k])`` of the columns of ``R`` (float32 T × N returns, NaN where missing), each with a
    best lag over lags ``1 .. max_lag``. ``block_rows``: count the pairs in calls over that many
    leaders at a time, as stripes do; the values do not depend on it."""
    check_returns(R)
    n_rows, n_cols = R.shape
    check_positive_int(max_lag, "max_lag")
    if max_lag >= n_rows:
        raise ValueError(f"max_lag must be < T = {n_rows}, got {max_lag}")
    check_min_overlap(min_overlap, n_rows)
    leaders = np.asarray(leaders, dtype=np.int64)
    laggers = np.asarray(laggers, dtype=np.int64)
    _check_pairs(leaders, laggers, n_cols)
    with worker_pool() as pool:
        window = standardize(R, pool, layout="lead-lag")
        step = n_cols if block_rows is None else max(1, int(block_rows))
        counts = PValueCounts.merge(
            [
                count_p_values(window, max_lag, min_overlap, pool, (lo, min(lo + step, n_cols)))
                for lo in range(0, n_cols, step)
            ]
        )
    p, bins = _pair_lag_p_values(
        leaders, laggers, max_lag, min_overlap, FALLBACK_TAU, pair_data(window)
    )
    if np.isnan(p).any():
        k = int(np.flatnonzero(np.isnan(p))[0])
        raise ValueError(
            f"pair {k} ({leaders[k]}, {laggers[k]}) has no finite lagged correlation "
            f"at lags 1..{max_lag} with min_overlap = {min_overlap}: it has no best lag"
        )
    return Significance(sidak(p, max_lag), q_values(bins, counts, max_lag), counts.m)


def annotate(
    pairs: np.ndarray,
    data: tuple,
    counts: PValueCounts,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
) -> np.ndarray:
    """``pairs`` (``LEAD_LAG_DTYPE``, each with a best lag) with their ``p_value`` and
    ``q_value`` filled in, from the pairs alone (on ``pool``'s threads; ``data``: the window's
    ``kernels.pair_data``, as the scan's screen holds it) and the histogram ``counts`` of every
    pair."""
    leaders = pairs["leader"].astype(np.int64)
    laggers = pairs["lagger"].astype(np.int64)
    p = np.empty(pairs.size)
    bins = np.empty(pairs.size, dtype=np.int64)
    step = max(1024, -(-pairs.size // (4 * available_cores())))

    def evaluate(lo: int) -> None:
        hi = min(lo + step, pairs.size)
        p[lo:hi], bins[lo:hi] = _pair_lag_p_values(
            leaders[lo:hi], laggers[lo:hi], max_lag, min_overlap, FALLBACK_TAU, data
        )

    list(pool.map(evaluate, range(0, pairs.size, step)))
    out = pairs.copy()
    out["p_value"] = sidak(p, max_lag)
    out["q_value"] = q_values(bins, counts, max_lag)
    return out


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


def count_items(n_leaders: int, n_cols: int) -> int:
    """The work items of :func:`count_p_values` over ``n_leaders`` leaders from a tile's start."""
    return -(-n_leaders // GEMM_TILE) * -(-n_cols // PRODUCT_COLUMNS)


def count_p_values(
    window: Standardized,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
    leaders: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> PValueCounts:
    """The histogram (module docstring) of the lag p-values of the best lags of the ordered
    pairs ``i != j`` with a best lag, for the leaders ``i`` in ``leaders`` (all by default) and
    every lagger ``j``: work items of one leader tile × one chunk of laggers on ``pool``'s
    threads (per thread ``L × GEMM_TILE × PRODUCT_COLUMNS`` float64 products, 10.5 MB at L = 5),
    each counting into its thread's histogram; ``progress(items_done, items)`` after each."""
    n_rows, n_cols = window.n_rows, window.n_cols
    start, stop = (0, n_cols) if leaders is None else leaders
    data = pair_data(window)
    laggers = _lagger_sums(data, max_lag)
    arrays = (window.z, window.prefix, window.prefix_sq)
    tiles = tiles_covering(start, stop)
    # int32 counts (half the cache footprint) when no bin can reach 2³¹ pairs
    counter = np.int32 if (stop - start) * n_cols < 2**31 else np.int64
    most_rows = GEMM_TILE
    workspaces: dict[int, tuple[np.ndarray, ...]] = {}  # per thread, dropped on return
    lock = threading.Lock()

    def workspace() -> tuple[np.ndarray, ...]:
        key = threading.get_ident()
        with lock:
            if key not in workspaces:
                workspaces[key] = (
                    np.zeros(N_BINS, dtype=counter),  # pages as touched
                    np.empty((max_lag, most_rows, n_rows)),
                    np.empty((n_rows, PRODUCT_COLUMNS)),
                    np.empty(max_lag * most_rows * PRODUCT_COLUMNS),
                )
            return workspaces[key]

    def count_item(item: tuple[int, int, int]) -> None:
        first, col0, col1 = item
        last = min(first + GEMM_TILE, n_cols)
        height, width = last - first, col1 - col0
        histogram, shifted_space, columns_space, products_space = workspace()
        shifted = shifted_space[:, :height]
        _shift_leaders(window.z_t, first, last, shifted)
        columns = columns_space[:, :width]
        np.copyto(columns, window.z[:, col0:col1])
        products = products_space[: max_lag * height * width].reshape(max_lag, height, width)
        np.matmul(shifted.reshape(-1, n_rows), columns, out=products.reshape(-1, width))
        count_tile(
            products,
            (first, max(start, first), min(stop, last), col0),
            arrays,
            min_overlap,
            FALLBACK_TAU,
            data,
            laggers,
            histogram,
        )

    items = [
        (first, col0, min(col0 + PRODUCT_COLUMNS, n_cols))
        for first, _ in tiles
        for col0 in range(0, n_cols, PRODUCT_COLUMNS)
    ]
    for done, _ in enumerate(pool.map(count_item, items), start=1):  # re-raises an error
        if progress is not None:
            progress(done, len(items))
    histograms = [space[0] for space in workspaces.values()]
    workspaces.clear()
    return _sparse(histograms)


def _sparse(histograms: list[np.ndarray]) -> PValueCounts:
    """The sum of dense histograms (added into the first, in place: no bin holds more than the
    pairs counted), as :class:`PValueCounts`, extracted a slice at a time."""
    if not histograms:
        return PValueCounts.merge([])
    total = histograms[0]
    for histogram in histograms[1:]:
        total += histogram
    del histograms[1:]
    bins, counts = [], []
    for lo in range(0, total.size, 1 << 20):
        found = np.flatnonzero(total[lo : lo + (1 << 20)])
        bins.append((found + lo).astype(np.int32))
        counts.append(total[found + lo].astype(np.int64))
    return PValueCounts(np.concatenate(bins), np.concatenate(counts))


@njit(cache=True, nogil=True)
def _shift_leaders(z_t, first, last, out):  # pragma: no cover - compiled
    """``out[ℓ − 1, i − first, u] = Z[u − ℓ, i]`` in float64 (0 for ``u < ℓ``): one product with
    ``Z`` gives every lag's ``Σ_{t < T−ℓ} Z[t, i]·Z[t + ℓ, j]`` (the added terms are zeros)."""
    max_lag, _, n_rows = out.shape
    for lag in range(1, max_lag + 1):
        for i in range(first, last):
            row = out[lag - 1, i - first]
            row[:lag] = 0.0
            for u in range(lag, n_rows):
                row[u] = np.float64(z_t[i, u - lag])


@njit(cache=True, nogil=True)
def _lagger_sums(data, max_lag):  # pragma: no cover - compiled
    """Per lag ``ℓ`` and lagger ``j``, the overlap ``[a, b)`` of ``kernels.overlap_moments``
    with a leader present throughout (``a = max(lo_j − ℓ, 0)``, ``b = max(min(hi_j − ℓ,
    T − ℓ), a)``) and the lagger's interval sums over it (``sy``, ``base_y``), the same
    operations as ``overlap_moments``: ``(a, b, sy, base_y)``, each ``max_lag × N``."""
    prefix_t, prefix_sq_t, lo, hi = data[3], data[4], data[8], data[9]
    n_cols, n_rows = prefix_t.shape[0], prefix_t.shape[1] - 1
    a = np.empty((max_lag, n_cols), dtype=np.int64)
    b = np.empty((max_lag, n_cols), dtype=np.int64)
    sy = np.empty((max_lag, n_cols))
    base_y = np.empty((max_lag, n_cols))
    for lag in range(1, max_lag + 1):
        for j in range(n_cols):
            k_lo = min(max(lo[j] - lag, 0), n_rows - lag)
            k_hi = max(min(hi[j] - lag, n_rows - lag), k_lo)
            a[lag - 1, j] = k_lo
            b[lag - 1, j] = k_hi
            sy[lag - 1, j] = prefix_t[j, k_hi + lag] - prefix_t[j, k_lo + lag]
            base_y[lag - 1, j] = prefix_sq_t[j, k_hi + lag] - prefix_sq_t[j, k_lo + lag]
    return a, b, sy, base_y


@njit(cache=True, nogil=True)
def count_tile(
    products, tile, window, min_overlap, tau, data, laggers, histogram
):  # pragma: no cover - compiled
    """Count the lag p-value of each pair's best lag (the largest float32 ``|r|``, ties to the
    smaller lag, as ``kernels.pair_values``) for leaders ``[row_lo, row_hi)`` and the laggers
    ``col0 ..`` of the products (``products[ℓ − 1]``: the pairs' ``Sxy``, rows from
    ``first``). Per leader and lag, the pairs' overlap ``K`` and sums are those of
    ``kernels.overlap_moments``, the same operations in the same order, vectorised over the
    laggers: the interval sums of both columns over ``K`` from the prefix sums (a lagger's from
    ``laggers``, :func:`_lagger_sums`, when ``K`` is its whole overlap with the window), less
    the leader's values where the lagger is missing (its gaps) and the lagger's values where
    the leader is missing (a zero, subtracted exactly, where the lagger is absent); ``r`` is
    then ``kernels.lagged_from_sums``' (its float64 fallback for an ill-conditioned variance
    included).

    ``tile`` = (first, row_lo, row_hi, col0); ``window`` = (z, prefix, prefix_sq), time-major."""
    first, row_lo, row_hi, col0 = tile
    z, prefix, prefix_sq = window
    z_t, present_t = data[0], data[1]
    prefix_t, prefix_sq_t, prefix_count_t = data[3], data[4], data[5]
    gap_ptr, gap_rows, lo, hi = data[6], data[7], data[8], data[9]
    lag_a, lag_b, lag_sy, lag_base_y = laggers
    max_lag, _, width = products.shape
    n_rows = z.shape[0]
    k_lo = np.empty(width, dtype=np.int64)
    k_hi = np.empty(width, dtype=np.int64)
    count = np.empty(width, dtype=np.int64)
    sx = np.empty(width)
    sy = np.empty(width)
    sxx = np.empty(width)
    syy = np.empty(width)
    base_x = np.empty(width)
    base_y = np.empty(width)
    best_abs = np.empty(width, dtype=np.float32)
    best_r = np.empty(width)
    best_n = np.empty(width, dtype=np.int64)
    fallback = np.empty(width, dtype=np.bool_)
    partial = np.flatnonzero((lo[col0 : col0 + width] != 0) | (hi[col0 : col0 + width] != n_rows))
    lagger_gaps = np.empty((gap_ptr[col0 + width] - gap_ptr[col0], 2), dtype=np.int64)
    for c in range(width):  # (c, row) of each row where a lagger is missing inside its interval
        for k in range(gap_ptr[col0 + c], gap_ptr[col0 + c + 1]):
            lagger_gaps[k - gap_ptr[col0], 0] = c
            lagger_gaps[k - gap_ptr[col0], 1] = gap_rows[k]
    for i in range(row_lo, row_hi):
        r = i - first
        best_abs[:] = -1.0
        for lag in range(1, max_lag + 1):
            top = n_rows - lag
            # K for a lagger that spans the window, one interval [k0, k1) for the row ...
            k0 = min(max(lo[i], 0), top)
            k1 = max(min(hi[i], top), k0)
            x_sum = prefix_t[i, k1] - prefix_t[i, k0]
            x_sq = prefix_sq_t[i, k1] - prefix_sq_t[i, k0]
            x_count = prefix_count_t[i, k1] - prefix_count_t[i, k0]
            y_hi = prefix[k1 + lag, col0 : col0 + width]
            y_lo = prefix[k0 + lag, col0 : col0 + width]
            y_sq_hi = prefix_sq[k1 + lag, col0 : col0 + width]
            y_sq_lo = prefix_sq[k0 + lag, col0 : col0 + width]
            for c in range(width):
                k_lo[c] = k0
                k_hi[c] = k1
                sx[c] = x_sum
                base_x[c] = x_sq
                sxx[c] = x_sq
                count[c] = x_count
                sy[c] = y_hi[c] - y_lo[c]
                base_y[c] = y_sq_hi[c] - y_sq_lo[c]
                syy[c] = base_y[c]
            # ... and its own for a lagger listed late or gone early.
            for c in partial:
                j = col0 + c
                a = lag_a[lag - 1, j]
                b = lag_b[lag - 1, j]
                kl = max(k0, a)
                kh = max(min(k1, b), kl)
                k_lo[c] = kl
                k_hi[c] = kh
                sx[c] = prefix_t[i, kh] - prefix_t[i, kl]
                base_x[c] = prefix_sq_t[i, kh] - prefix_sq_t[i, kl]
                sxx[c] = base_x[c]
                count[c] = prefix_count_t[i, kh] - prefix_count_t[i, kl]
                if kl == a and kh == b:
                    sy[c] = lag_sy[lag - 1, j]
                    base_y[c] = lag_base_y[lag - 1, j]
                else:
                    sy[c] = prefix[kh + lag, j] - prefix[kl + lag, j]
                    base_y[c] = prefix_sq[kh + lag, j] - prefix_sq[kl + lag, j]
                syy[c] = base_y[c]
            # rows where a lagger is missing: inside its interval, so inside its K exactly
            # when inside [k0, k1)
            for e in range(lagger_gaps.shape[0]):
                c = lagger_gaps[e, 0]
                t = lagger_gaps[e, 1] - lag
                if k0 <= t < k1:
                    v = np.float64(z_t[i, t])
                    sx[c] -= v
                    sxx[c] -= v * v
                    count[c] -= present_t[i, t]
            for k in range(gap_ptr[i], gap_ptr[i + 1]):  # rows where the leader is missing
                t = gap_rows[k]
                if k0 <= t < k1:
                    row = z[t + lag]
                    for c in range(width):
                        v = np.float64(row[col0 + c])
                        sy[c] -= v
                        syy[c] -= v * v
            # Every pair's formula value at once (branch-free, so it vectorises), then the few
            # ill-conditioned ones from the float64 fallback.
            for c in range(width):
                n = count[c]
                inv_n = 1.0 / max(n, 1)
                var_x = sxx[c] - sx[c] * sx[c] * inv_n
                var_y = syy[c] - sy[c] * sy[c] * inv_n
                value = (products[lag - 1, r, c] - sx[c] * sy[c] * inv_n) / math.sqrt(
                    max(var_x * var_y, 1e-300)
                )
                value = min(1.0, max(-1.0, value))
                enough = n >= min_overlap
                conditioned = (var_x > tau * base_x[c]) & (var_y > tau * base_y[c])
                fallback[c] = enough & ~conditioned
                magnitude = abs(np.float32(value))
                better = enough & conditioned & (magnitude > best_abs[c])
                best_abs[c] = magnitude if better else best_abs[c]
                best_r[c] = value if better else best_r[c]
                best_n[c] = n if better else best_n[c]
            for c in range(width):
                if fallback[c]:
                    sums = (
                        k_lo[c],
                        k_hi[c],
                        sx[c],
                        sy[c],
                        sxx[c],
                        syy[c],
                        base_x[c],
                        base_y[c],
                        count[c],
                    )
                    j = col0 + c
                    sxy = products[lag - 1, r, c]
                    value = lagged_from_sums(i, j, lag, sxy, sums, min_overlap, tau, data)[0]
                    magnitude = abs(np.float32(value))
                    if magnitude > best_abs[c]:  # False for NaN
                        best_abs[c] = magnitude
                        best_r[c] = value
                        best_n[c] = count[c]
        if col0 <= i < col0 + width:
            best_abs[i - col0] = -1.0  # not a pair
        for c in range(width):
            if best_abs[c] >= 0.0:
                histogram[p_bin(best_r[c], best_n[c])] += 1


@njit(cache=True, nogil=True)
def _pair_lag_p_values(
    leaders, laggers, max_lag, min_overlap, tau, data
):  # pragma: no cover - compiled
    """Per pair, the lag p-value of its best lag (NaN without one) and its histogram bin, the
    pair alone evaluated."""
    out = np.empty(leaders.size, dtype=np.float64)
    bins = np.zeros(leaders.size, dtype=np.int64)
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
        out[k] = np.nan
        if best_abs >= 0:
            out[k] = lag_p_value(best_r, best_n)
            bins[k] = p_bin(best_r, best_n)
    return out, bins


def _bin_q_values(counts: PValueCounts, max_lag: int) -> np.ndarray:
    """Per bin of ``counts``, the reported q-value of its pairs (module docstring), capped at 1:
    ``min over b' >= b of m·hi'_b' / C_b'``, in one backward pass (no temporaries)."""
    return _suffix_q_values(counts.bins, counts.counts, counts.m, max_lag)


@njit(cache=True, nogil=True)
def _suffix_q_values(bins, counts, m, max_lag):  # pragma: no cover - compiled
    out = np.empty(bins.size)
    after = 0  # pairs in the bins after this one: C_b = m − after
    lowest = np.inf
    for k in range(bins.size - 1, -1, -1):
        edge = bin_upper_p(np.int64(bins[k]))
        sidak_edge = -math.expm1(max_lag * math.log1p(-edge)) if edge < 1.0 else 1.0
        lowest = min(lowest, m * sidak_edge / (m - after))
        out[k] = min(lowest, 1.0)
        after += counts[k]
    return out


def q_values(bins: np.ndarray, counts: PValueCounts, max_lag: int) -> np.ndarray:
    """The q-values (module docstring) of pairs in the histogram bins ``bins``
    (``p_values.p_bin``) of ``counts``."""
    if bins.size == 0:
        return np.empty(0, dtype=np.float64)
    per_bin = np.concatenate([_bin_q_values(counts, max_lag), [1.0]])
    return per_bin[np.searchsorted(counts.bins, bins)]


def candidate_bin_limit(counts: PValueCounts, max_q_value: float, max_lag: int) -> int:
    """The largest histogram bin whose pairs have a q-value ``<= max_q_value`` (module
    docstring): ``N_BINS`` for ``max_q_value >= 1`` (no condition), −1 when no pair
    qualifies."""
    if max_q_value >= 1.0:
        return N_BINS
    passing = np.flatnonzero(_bin_q_values(counts, max_lag) <= max_q_value)
    if passing.size == 0:
        return -1
    return int(counts.bins[passing[-1]])
