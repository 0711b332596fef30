"""Numba kernels of the lead-lag scan (SPEC §6): the exact per-pair evaluation and the
threshold selections; the bounds they select from come from :mod:`.sweep`.

Notation (see ``standardize``): ``Z`` the standardized zero-filled window, ``PZ``, ``PZ2``, ``PM``
its prefix sums of values, squares and presence. For lag ``ℓ`` the leader ``i`` is read on rows
``t ∈ [0, T−ℓ)`` and the lagger ``j`` on rows ``t + ℓ`` (lag 0: the synchronous pair). A column
is present on ``[lo, hi)`` (first to last finite row of the window) less its interior gaps, so
the pair's overlap lies in ``K = [max(lo_i, lo_j − ℓ, 0), min(hi_i, hi_j − ℓ, T − ℓ))`` less the
gaps of either.

**Exact value** (:func:`lagged_value`), the same formula and exactness guard as the
correlation's kernels:

    n = #{t ∈ K : both present}
    Sx = PZ_i[K] − Σ_{t ∈ K, j missing at t+ℓ} Z_i(t)    Sxx likewise with Z²    (Sy, Syy symmetric)
    Sxy = Σ_{t ∈ K} Z_i(t) Z_j(t+ℓ)   (float64 sum of the float32 products, fixed order)
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n)(Syy − Sy²/n))

recomputed from the raw returns in float64 (``kernels.exact_pair_correlation``) when a variance is
at most ``tau`` times the interval sum of squares it came from (``base``). The same pass over the
overlap sums ``Sq = Σ_{t ∈ K} (Z_i(t) Z_j(t+ℓ))²`` for the robust statistic
``t_stat = Sxy / sqrt(Sq)`` (``p_values``): ``Z`` is each column less its mean over its own finite
rows, scaled, and the statistic does not depend on the scale. Every value is a pure function of
the pair: it does not depend on the block, the tile or the thread that computes it.

**Significance** (``max_q_value`` < 1: a candidate's best lag also needs the histogram bin of its
p-value ``t_bin(t_stat) <= bin_limit``, ``significance.candidate_bin_limit``): the exact
evaluation applies the condition itself (:func:`pair_values`).

**Selection** (:func:`select_rows`, :func:`select_columns`), exact by the threshold argument:
if k pairs of a row (or column) have lower bounds ``≥ θ``, its k-th best exact improvement is
``≥ θ``, so a pair whose upper bound is *strictly* below ``θ`` — or strictly below the k-th
exact improvement already found — has k pairs strictly above it and is in no top-k, whatever
its exact value and whatever the tie rule. The others are evaluated exactly in decreasing
order of their upper bound. Top-k lists are ordered by (improvement desc, index asc), a total
order, so they do not depend on the order of insertion.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import exact_pair_correlation
from corr_pipeline.compute.lead_lag.p_values import N_BINS, robust_t, t_bin
from corr_pipeline.compute.standardize import Standardized, make_side
from corr_pipeline.compute.top_k import before, insert_value


@njit(cache=True, nogil=True)
def _dot_and_squares(x, y):  # pragma: no cover - compiled
    """``(Σ_t x[t]·y[t], Σ_t (x[t]·y[t])²)`` in float64 over four interleaved partial sums (a
    fixed order); each product of two float32 values is exact in float64."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    q0 = q1 = q2 = q3 = 0.0
    t = 0
    while t + 4 <= n:
        p0 = np.float64(x[t]) * np.float64(y[t])
        p1 = np.float64(x[t + 1]) * np.float64(y[t + 1])
        p2 = np.float64(x[t + 2]) * np.float64(y[t + 2])
        p3 = np.float64(x[t + 3]) * np.float64(y[t + 3])
        s0 += p0
        s1 += p1
        s2 += p2
        s3 += p3
        q0 += p0 * p0
        q1 += p1 * p1
        q2 += p2 * p2
        q3 += p3 * p3
        t += 4
    while t < n:
        p0 = np.float64(x[t]) * np.float64(y[t])
        s0 += p0
        q0 += p0 * p0
        t += 1
    return (s0 + s1) + (s2 + s3), (q0 + q1) + (q2 + q3)


def pair_data(window: Standardized) -> tuple:
    """The ``data`` tuple of :func:`lagged_value` and :func:`pair_values` for ``window``: its
    transposed arrays and the whole window's presence intervals and interior gaps."""
    full = make_side(window, 0, window.n_rows)
    return (
        window.z_t,
        window.present_t,
        window.raw.T,  # the exact fallback's column-major view of the returns
        window.prefix_t,
        window.prefix_sq_t,
        window.prefix_count_t,
        full.gap_ptr,
        full.gap_rows,
        full.lo,
        full.hi,
    )


@njit(cache=True, nogil=True, inline="always")
def overlap_moments(i, j, lag, data):  # pragma: no cover - compiled
    """The overlap ``K`` of (R[t, i], R[t + lag, j]) and its sums, as in the module docstring:
    ``(k_lo, k_hi, sx, sy, sxx, syy, base_x, base_y, n)``; ``n = 0`` when ``K`` is empty.

    ``data`` = (z_t, present_t, R.T, prefix_t, prefix_sq_t, prefix_count_t, gap_ptr,
    gap_rows, lo, hi): the whole window's presence intervals and interior gaps (CSR)."""
    z_t = data[0]
    present_t = data[1]
    prefix_t = data[3]
    prefix_sq_t = data[4]
    prefix_count_t = data[5]
    gap_ptr = data[6]
    gap_rows = data[7]
    lo = data[8]
    hi = data[9]
    n_rows = z_t.shape[1]
    k_lo = max(lo[i], lo[j] - lag, 0)
    k_hi = min(hi[i], hi[j] - lag, n_rows - lag)
    if k_hi <= k_lo:
        return k_lo, k_lo, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, np.int64(0)
    sx = prefix_t[i, k_hi] - prefix_t[i, k_lo]
    base_x = prefix_sq_t[i, k_hi] - prefix_sq_t[i, k_lo]
    count = np.int64(prefix_count_t[i, k_hi] - prefix_count_t[i, k_lo])
    sy = prefix_t[j, k_hi + lag] - prefix_t[j, k_lo + lag]
    base_y = prefix_sq_t[j, k_hi + lag] - prefix_sq_t[j, k_lo + lag]
    sxx = base_x
    syy = base_y
    for k in range(gap_ptr[j], gap_ptr[j + 1]):
        t = gap_rows[k] - lag
        if k_lo <= t < k_hi:
            v = np.float64(z_t[i, t])
            sx -= v
            sxx -= v * v
            count -= present_t[i, t]
    for k in range(gap_ptr[i], gap_ptr[i + 1]):
        t = gap_rows[k]
        if k_lo <= t < k_hi:
            v = np.float64(z_t[j, t + lag])
            sy -= v
            syy -= v * v
    return k_lo, k_hi, sx, sy, sxx, syy, base_x, base_y, count


@njit(cache=True, nogil=True, inline="always")
def lagged_from_sums(i, j, lag, sxy, sums, min_overlap, tau, data):  # pragma: no cover - compiled
    """The exact correlation (float64, NaN allowed) and overlap of the pair from
    :func:`overlap_moments` ``sums`` and ``sxy = Σ_K Z_i(t)·Z_j(t + lag)``: the formula of
    the module docstring, or the raw returns' float64 correlation when a variance is at most
    ``tau`` times its interval sum of squares."""
    sx = sums[2]
    sy = sums[3]
    base_x = sums[6]
    base_y = sums[7]
    count = sums[8]
    if count < min_overlap:
        return np.nan, count
    inv_n = 1.0 / count
    var_x = sums[4] - sx * sx * inv_n
    var_y = sums[5] - sy * sy * inv_n
    if var_x <= tau * base_x or var_y <= tau * base_y:
        raw_t = data[2]
        n_rows = raw_t.shape[1]
        value = exact_pair_correlation(
            raw_t[i, 0 : n_rows - lag], raw_t[j, lag:n_rows], min_overlap
        )
    else:
        value = (sxy - sx * sy * inv_n) / math.sqrt(max(var_x * var_y, 1e-300))
        value = min(1.0, max(-1.0, value))
    return value, count


@njit(cache=True, nogil=True)
def lagged_value(i, j, lag, min_overlap, tau, data):  # pragma: no cover - compiled
    """Exact correlation (float64, NaN allowed), overlap and robust statistic (module docstring;
    0 for an empty overlap or a zero denominator) of (R[t, i], R[t + lag, j]):
    :func:`lagged_from_sums` with ``sxy`` and ``Sq`` summed by :func:`_dot_and_squares` over
    the overlap."""
    sums = overlap_moments(i, j, lag, data)
    if sums[8] < min_overlap:
        return np.nan, sums[8], 0.0
    z_t = data[0]
    k_lo = sums[0]
    k_hi = sums[1]
    sxy, squares = _dot_and_squares(z_t[i, k_lo:k_hi], z_t[j, k_lo + lag : k_hi + lag])
    value, count = lagged_from_sums(i, j, lag, sxy, sums, min_overlap, tau, data)
    return value, count, robust_t(sxy, squares)


@njit(cache=True, nogil=True)
def best_lag(i, j, max_lag, min_overlap, tau, data):  # pragma: no cover - compiled
    """The pair's best lag (SPEC §6: the largest float32 ``|lagged|``, ties to the smaller lag)
    and its values: ``(best_abs, corr, lag, overlap, t_stat)``, ``best_abs`` −1 (and lag 0)
    when no lag is finite."""
    best_abs = np.float32(-1.0)
    best_value = np.nan
    best = 0
    best_overlap = 0
    best_t = 0.0
    for lag in range(1, max_lag + 1):
        value, count, t_stat = lagged_value(i, j, lag, min_overlap, tau, data)
        magnitude = abs(np.float32(value))
        if magnitude > best_abs:
            best_abs = magnitude
            best_value = value
            best = lag
            best_overlap = count
            best_t = t_stat
    return best_abs, best_value, best, best_overlap, best_t


@njit(cache=True, nogil=True)
def pair_values(i, j, given_sync, params, data):  # pragma: no cover - compiled
    """Exact (improvement, best_corr, best_lag, best_overlap, sync) of the pair (i, j), SPEC §6;
    the improvement is float32, −inf for a non-candidate.

    ``params`` = (max_lag, min_overlap, tau, min_improvement as float32, with_sync, bin_limit);
    without ``with_sync`` the synchronous correlation is ``given_sync`` (float32, NaN allowed).
    A candidate also needs the histogram bin of its best lag's p-value (``p_values.t_bin`` of
    its robust statistic) at most ``bin_limit`` (``N_BINS``: no condition)."""
    max_lag = params[0]
    min_overlap = params[1]
    tau = params[2]
    min_improvement = params[3]
    bin_limit = params[5]
    best_abs, best_value, lag, best_overlap, best_t = best_lag(
        i, j, max_lag, min_overlap, tau, data
    )
    best_corr = np.float32(best_value)
    sync = given_sync
    if params[4]:
        sync = np.float32(lagged_value(i, j, 0, min_overlap, tau, data)[0])
    sync_abs = abs(sync)
    if math.isnan(sync_abs):
        sync_abs = np.float32(0.0)
    improvement = best_abs - sync_abs
    if not (best_abs >= 0 and improvement > min_improvement):
        improvement = np.float32(-np.inf)
    elif bin_limit < N_BINS and t_bin(best_t) > bin_limit:
        improvement = np.float32(-np.inf)
    return improvement, best_corr, lag, best_overlap, sync


@njit(cache=True, nogil=True)
def _select_exact(  # pragma: no cover - compiled
    i_of, j_of, upper, given_sync, index_of, params, data, out, slot
):
    """Threshold selection over candidates sorted by ``upper`` descending: evaluate each
    exactly and keep the top k (``out[*][slot]``, ordered by (improvement desc, index_of asc)),
    stopping at the first candidate whose bound is strictly below the k-th kept improvement
    (every later one is too). ``out`` = (improvement, index, best_corr, best_lag,
    best_overlap, sync), each (rows × k), to be filled with −inf / −1. Returns the number of
    pairs evaluated."""
    values = out[0][slot]
    index = out[1][slot]
    k = values.shape[0]
    evaluated = 0
    for q in range(i_of.shape[0]):
        if upper[q] < values[k - 1]:
            break
        evaluated += 1
        e, corr, lag, overlap, sync = pair_values(i_of[q], j_of[q], given_sync[q], params, data)
        key = index_of[q]
        if not before(e, key, values[k - 1], index[k - 1]) or e == -np.inf:
            continue
        pos = k - 1
        while pos > 0 and before(e, key, values[pos - 1], index[pos - 1]):
            values[pos] = values[pos - 1]
            index[pos] = index[pos - 1]
            out[2][slot, pos] = out[2][slot, pos - 1]
            out[3][slot, pos] = out[3][slot, pos - 1]
            out[4][slot, pos] = out[4][slot, pos - 1]
            out[5][slot, pos] = out[5][slot, pos - 1]
            pos -= 1
        values[pos] = e
        index[pos] = key
        out[2][slot, pos] = corr
        out[3][slot, pos] = lag
        out[4][slot, pos] = overlap
        out[5][slot, pos] = sync
    return evaluated


@njit(cache=True, nogil=True)
def select_rows(  # pragma: no cover - compiled
    row_lo, row_hi, leaders, upper, lower, sync_block, with_sync, params, data, out
):
    """Each leader's final top-k laggers (rows ``[row_lo, row_hi)`` of the block, whose leaders
    are ``leaders``): the k-th
    largest lower bound of the row is a threshold no selected pair is below; the pairs whose
    upper bound reaches it are evaluated in decreasing bound order (:func:`_select_exact`).
    Returns the number of pairs evaluated exactly."""
    evaluated = 0
    n_cols = upper.shape[1]
    k = out[0].shape[1]
    kth = np.empty(k, dtype=np.float32)
    found = np.empty(n_cols, dtype=np.int64)
    for r in range(row_lo, row_hi):
        kth[:] = -np.inf
        for j in range(n_cols):
            insert_value(kth, lower[r, j])
        threshold = kth[k - 1]
        count = 0
        for j in range(n_cols):
            if upper[r, j] > -np.inf and upper[r, j] >= threshold:
                found[count] = j
                count += 1
        cols = found[:count].copy()
        bounds = np.empty(count, dtype=np.float32)
        for q in range(count):
            bounds[q] = upper[r, cols[q]]
        order = np.argsort(-bounds, kind="mergesort")
        cols = cols[order]
        syncs = np.empty(count, dtype=np.float32)
        for q in range(count):
            syncs[q] = np.float32(np.nan) if with_sync else sync_block[r, cols[q]]
        owner = np.full(count, leaders[r], dtype=np.int64)
        evaluated += _select_exact(owner, cols, bounds[order], syncs, cols, params, data, out, r)
    return evaluated


@njit(cache=True, nogil=True)
def fold_columns(  # pragma: no cover - compiled
    col_lo, col_hi, lower, upper, column_lower, column_exact, floor
):
    """For the laggers ``[col_lo, col_hi)``: fold the block's lower bounds into each lagger's
    running top-k of lower bounds (``column_lower``, N × k), then return the block's pairs
    ``(rows, laggers)`` whose upper bound is finite and reaches the lagger's threshold
    ``max(column_lower[j, k−1], column_exact[j, k−1], floor[j])`` (``column_exact``: its exact
    top-k so far; ``floor``: a value known not to exceed its final k-th best improvement), the
    column candidates to pool."""
    height = lower.shape[0]
    k = column_lower.shape[1]
    for r in range(height):
        for j in range(col_lo, col_hi):
            insert_value(column_lower[j], lower[r, j])
    threshold = np.empty(col_hi - col_lo, dtype=np.float32)
    for j in range(col_lo, col_hi):
        threshold[j - col_lo] = max(column_lower[j, k - 1], column_exact[j, k - 1], floor[j])
    rows = np.empty(height * (col_hi - col_lo), dtype=np.int32)
    laggers = np.empty(height * (col_hi - col_lo), dtype=np.int32)
    count = 0
    for r in range(height):
        for j in range(col_lo, col_hi):
            u = upper[r, j]
            if u > -np.inf and u >= threshold[j - col_lo]:
                rows[count] = r
                laggers[count] = j
                count += 1
    return rows[:count].copy(), laggers[:count].copy()


@njit(cache=True, nogil=True)
def select_columns(  # pragma: no cover - compiled
    seg_lo, seg_hi, starts, leaders, laggers, upper, syncs, params, data, out
):
    """Each lagger's final top-k leaders from its pooled candidates: segments
    ``starts[s] .. starts[s + 1]`` (s in [seg_lo, seg_hi)) of the pool sorted by lagger, then
    bound descending; results in ``out[*][lagger]`` (:func:`_select_exact`). Returns the number
    of pairs evaluated exactly."""
    evaluated = 0
    for s in range(seg_lo, seg_hi):
        a = starts[s]
        b = starts[s + 1]
        if b > a:
            evaluated += _select_exact(
                leaders[a:b],
                laggers[a:b],
                upper[a:b],
                syncs[a:b],
                leaders[a:b],
                params,
                data,
                out,
                laggers[a],
            )
    return evaluated
