"""Numba kernels of the screened lead-lag scan (SPEC §6): per-lag intervals, a rigorous upper
bound of every pair's improvement, the exact per-pair evaluation and the two threshold selections.

Notation (see ``standardize``): ``Z`` the standardized zero-filled window, ``PZ``, ``PZ2``, ``PM``
its prefix sums of values, squares and presence. For lag ``ℓ`` the leader ``i`` is read on rows
``t ∈ [0, T−ℓ)`` (side A) and the lagger ``j`` on rows ``t + ℓ`` (side B, local row ``t``). On
each side a column is present on an interval ``[lo, hi)`` (first to last finite row of that side)
less ``g`` interior gaps. The overlap of a pair lies in ``K = [max(loA_i, loB_j), min(hiA_i,
hiB_j))`` and is ``K`` less at most ``gA_i + gB_j`` rows.

**Exact value** (:func:`lagged_value`), the same formula and exactness guard as ``kernels``:

    n = #{t ∈ K : both present}
    Sx = PZ_i[K] − Σ_{t ∈ K, j missing at t+ℓ} Z_i(t)    Sxx likewise with Z²    (Sy, Syy symmetric)
    Sxy = Σ_{t ∈ K} Z_i(t) Z_j(t+ℓ)   (float64 sum of the float32 products, fixed order)
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n)(Syy − Sy²/n))

recomputed from the raw returns in float64 (``kernels.exact_pair_correlation``) when a variance is
at most ``tau`` times the interval sum of squares it came from (``base``). Every value is a pure
function of the pair: it does not depend on the block, the tile or the thread that computes it.

**Upper bound** (:func:`screen_tile`). With ``P`` the float32 GEMM product of the pair (any
summation order: ``|P − Sxy| ≤ γ·sqrt(Sxx_K·Syy_K)``, ``γ = 2·T·2⁻²⁴``), ``M1_c(g)`` / ``M2_c(g)``
the sums of the ``g`` largest ``|Z_c|`` / ``Z_c²`` of column ``c`` over the whole window, and
``n_lo = |K| − gA_i − gB_j``:

    |Sx| ≤ sx := |PZ_i[K]| + M1_i(gB_j)           Sxx ≥ PZ2_i[K] − M2_i(gB_j)
    var_x ≥ vx := PZ2_i[K] − M2_i(gB_j) − sx²/n_lo   (and var_y ≥ vy symmetrically)
    |corr_ℓ| ≤ U_ℓ := min(1, (|P| + γ·sqrt(PZ2_i[K]·PZ2_j[K]) + sx·sy/n_lo) / sqrt(vx·vy))

valid when ``n_lo ≥ 1``, ``vx > tau'·PZ2_i[K]`` and ``vy > tau'·PZ2_j[K]`` (``tau' > tau``: then
neither variance can trigger the float64 fallback, so the value is the formula's), else
``U_ℓ = 1`` (a computed correlation is clamped to [−1, 1]); ``U_ℓ = −∞`` when ``|K| <
min_overlap`` (the lag is NaN). The synchronous correlation has the lower bound

    |sync| ≥ L0 := max(0, |P₀| − γ·sqrt(Sxx_K·Syy_K) − sx·sy/n_lo) / sqrt(Sxx_K·Syy_K)

(valid under the same conditions and ``n_lo ≥ min_overlap``, else 0), or is read exactly from a
given ``corr``. The improvement bound is ``max_ℓ U_ℓ − L0 + margin`` (the margin, 2⁻¹², covers
every float rounding of the bound and of the exact value, both below 1e-6); ``−∞`` for ``i = j``,
for pairs without a possible lag and when it is at most ``min_improvement``.

**Selection** (:func:`select_rows`, :func:`select_columns`), exact by the threshold argument: a
pair is evaluated unless its bound is *strictly* below the k-th best exact improvement already
known in its row (resp. its column), in which case k evaluated pairs beat it strictly and it can
be in no top-k, whatever its exact value and whatever the tie rule. Top-k lists are ordered by
(improvement desc, index asc), a total order, so they do not depend on the order of insertion.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from corr_pipeline.compute.kernels import exact_pair_correlation

BOUND_MARGIN = 2.0**-12
"""Added to every improvement bound: covers the float rounding of the bound and of the exact value."""

TAU_SCREEN_FACTOR = 1.01
"""The bound treats a variance within this factor of the fallback threshold as ill-conditioned."""

GAP_DEPTH = 8
"""Largest-values sums ``M1, M2`` are tabulated for up to this many gaps, then extended linearly."""

NOT_EVALUATED = np.float32(np.nan)


@njit(cache=True, nogil=True)
def lag_intervals(present_t, count_t, max_lag):  # pragma: no cover - compiled
    """Per lag ``ℓ = 0..max_lag`` and column: side A (rows [0, T−ℓ)) and side B (rows [ℓ, T),
    local row = window row − ℓ) intervals ``[lo, hi)`` and interior-gap counts (``count_t`` = PM
    transposed); empty sides
    have ``lo = hi = 0``. Returns ``lo_a, hi_a, gaps_a, lo_b, hi_b, gaps_b``, each (L+1, N) int64."""
    n_cols, n_rows = present_t.shape
    shape = (max_lag + 1, n_cols)
    lo_a = np.zeros(shape, dtype=np.int64)
    hi_a = np.zeros(shape, dtype=np.int64)
    gaps_a = np.zeros(shape, dtype=np.int64)
    lo_b = np.zeros(shape, dtype=np.int64)
    hi_b = np.zeros(shape, dtype=np.int64)
    gaps_b = np.zeros(shape, dtype=np.int64)
    for c in range(n_cols):
        p = present_t[c]
        for lag in range(max_lag + 1):
            stop = n_rows - lag
            lo = 0
            while lo < stop and p[lo] == 0:
                lo += 1
            if lo < stop:
                hi = stop
                while p[hi - 1] == 0:
                    hi -= 1
                lo_a[lag, c] = lo
                hi_a[lag, c] = hi
                gaps_a[lag, c] = hi - lo - (count_t[c, hi] - count_t[c, lo])
            lo = lag
            while lo < n_rows and p[lo] == 0:
                lo += 1
            if lo < n_rows:
                hi = n_rows
                while p[hi - 1] == 0:
                    hi -= 1
                lo_b[lag, c] = lo - lag
                hi_b[lag, c] = hi - lag
                gaps_b[lag, c] = hi - lo - (count_t[c, hi] - count_t[c, lo])
    return lo_a, hi_a, gaps_a, lo_b, hi_b, gaps_b


@njit(cache=True, nogil=True)
def largest_sums(z_t, depth):  # pragma: no cover - compiled
    """``top1[c, g]`` / ``top2[c, g]``: sums of the ``g`` largest ``|Z_c|`` / ``Z_c²`` (g = 0..depth),
    and ``last1[c]`` / ``last2[c]``: the depth-th largest values (for ``g > depth``:
    ``M(g) ≤ top[c, depth] + (g − depth)·last[c]``). All float64."""
    n_cols, n_rows = z_t.shape
    top1 = np.zeros((n_cols, depth + 1))
    top2 = np.zeros((n_cols, depth + 1))
    last1 = np.zeros(n_cols)
    last2 = np.zeros(n_cols)
    largest = np.zeros(depth)
    for c in range(n_cols):
        largest[:] = 0.0
        for t in range(n_rows):
            v = abs(np.float64(z_t[c, t]))
            if v > largest[depth - 1]:
                pos = depth - 1
                while pos > 0 and v > largest[pos - 1]:
                    largest[pos] = largest[pos - 1]
                    pos -= 1
                largest[pos] = v
        for g in range(depth):
            top1[c, g + 1] = top1[c, g] + largest[g]
            top2[c, g + 1] = top2[c, g] + largest[g] * largest[g]
        last1[c] = largest[depth - 1]
        last2[c] = largest[depth - 1] * largest[depth - 1]
    return top1, top2, last1, last2


@njit(cache=True, nogil=True)
def screen_tile(  # pragma: no cover - compiled
    products,
    with_sync,
    max_lag,
    tile_start,
    row_lo,
    row_hi,
    block_start,
    col0,
    out_bound,
    sync_block,
    min_overlap,
    min_improvement,
    gamma,
    tau_screen,
    prefix,
    prefix_sq,
    prefix_t,
    prefix_sq_t,
    lo_a,
    hi_a,
    gaps_a,
    lo_b,
    hi_b,
    gaps_b,
    top1,
    top2,
    top1_t,
    top2_t,
    last1,
    last2,
):
    """Improvement bounds (module docstring) of leaders ``[row_lo, row_hi)`` against the laggers
    ``col0 ..`` of one product chunk, into ``out_bound[i − block_start, j]`` (float32).

    ``products[ℓ]`` holds the float32 product of lag ℓ for the tile (rows from ``tile_start``);
    slot 0 (lag 0) is used only when ``with_sync``; otherwise ``|sync|`` is read from
    ``sync_block[i − block_start, j]`` (NaN read as 0). ``gamma[ℓ]`` bounds the GEMM rounding."""
    width = products.shape[2]
    n_rows = prefix.shape[0] - 1
    depth = top1.shape[1] - 1
    upper = np.empty(width)
    lower = np.empty(width)
    first_lag = 0 if with_sync else 1
    for i in range(row_lo, row_hi):
        ti = i - tile_start
        r = i - block_start
        for c in range(width):
            upper[c] = -np.inf
            lower[c] = 0.0
        for lag in range(first_lag, max_lag + 1):
            prod = products[lag]
            lo_i = lo_a[lag, i]
            hi_i = hi_a[lag, i]
            g_i = gaps_a[lag, i]
            g_row = min(g_i, depth)
            g_ext = max(g_i - depth, 0)
            pz_i = prefix_t[i]
            pz2_i = prefix_sq_t[i]
            pz_hi = prefix[hi_i + lag]
            pz_lo = prefix[lo_i + lag]
            pz2_hi = prefix_sq[hi_i + lag]
            pz2_lo = prefix_sq[lo_i + lag]
            pz_end = prefix[n_rows]
            pz2_end = prefix_sq[n_rows]
            pz_start = prefix[lag]
            pz2_start = prefix_sq[lag]
            m1_row = top1_t[g_row]
            m2_row = top2_t[g_row]
            lo_bl = lo_b[lag]
            hi_bl = hi_b[lag]
            g_bl = gaps_b[lag]
            gam = gamma[lag]
            for c in range(width):
                j = col0 + c
                lo_j = lo_bl[j]
                hi_j = hi_bl[j]
                g_j = g_bl[j]
                k_lo = max(lo_i, lo_j)
                k_hi = min(hi_i, hi_j)
                n_k = k_hi - k_lo
                k_hi = max(k_hi, k_lo)
                sx_k = pz_i[k_hi] - pz_i[k_lo]
                sxx_k = pz2_i[k_hi] - pz2_i[k_lo]
                # Lagger sums over K: its own interval ends are its whole-side values.
                # PZ_j at an end of its own interval equals PZ_j at the end of its side (no
                # finite value in between), a fixed row: every read below is row-contiguous.
                cut_hi = hi_i <= hi_j
                cut_lo = lo_i >= lo_j
                sy_k = (pz_hi[j] if cut_hi else pz_end[j]) - (pz_lo[j] if cut_lo else pz_start[j])
                syy_k = (pz2_hi[j] if cut_hi else pz2_end[j]) - (
                    pz2_lo[j] if cut_lo else pz2_start[j]
                )
                g_col = min(g_j, depth)
                m1_i = top1[i, g_col] + max(g_j - depth, 0) * last1[i]
                m2_i = top2[i, g_col] + max(g_j - depth, 0) * last2[i]
                m1_j = m1_row[j] + g_ext * last1[j]
                m2_j = m2_row[j] + g_ext * last2[j]
                n_lo = n_k - g_i - g_j
                inv_n = 1.0 / max(n_lo, 1)
                sx = abs(sx_k) + m1_i
                sy = abs(sy_k) + m1_j
                vx = sxx_k - m2_i - sx * sx * inv_n
                vy = syy_k - m2_j - sy * sy * inv_n
                ok = (n_lo >= 1) and (vx > tau_screen * sxx_k) and (vy > tau_screen * syy_k)
                scale = math.sqrt(max(sxx_k * syy_k, 0.0))
                cross = sx * sy * inv_n
                p = abs(np.float64(prod[ti, c]))
                if lag == 0:
                    if ok and n_lo >= min_overlap and scale > 0.0:
                        lower[c] = min(1.0, max(0.0, (p - gam * scale - cross) / scale))
                else:
                    u = 1.0
                    if ok:
                        u = min(1.0, (p + gam * scale + cross) / math.sqrt(vx * vy))
                    if n_k >= min_overlap and u > upper[c]:
                        upper[c] = u
        for c in range(width):
            j = col0 + c
            if not with_sync:
                s = abs(np.float64(sync_block[r, j]))
                lower[c] = 0.0 if math.isnan(s) else s
            bound = upper[c] - lower[c] + BOUND_MARGIN
            if j == i or upper[c] == -np.inf or not bound > min_improvement:
                bound = -np.inf
            out_bound[r, j] = bound


@njit(cache=True, nogil=True)
def _dot_lagged(x, y):  # pragma: no cover - compiled
    """``Σ_t x[t]·y[t]`` in float64 over four interleaved partial sums (a fixed order)."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    t = 0
    while t + 4 <= n:
        s0 += np.float64(x[t]) * np.float64(y[t])
        s1 += np.float64(x[t + 1]) * np.float64(y[t + 1])
        s2 += np.float64(x[t + 2]) * np.float64(y[t + 2])
        s3 += np.float64(x[t + 3]) * np.float64(y[t + 3])
        t += 4
    while t < n:
        s0 += np.float64(x[t]) * np.float64(y[t])
        t += 1
    return (s0 + s1) + (s2 + s3)


@njit(cache=True, nogil=True)
def lagged_value(i, j, lag, min_overlap, tau, data):  # pragma: no cover - compiled
    """Exact correlation (float64, NaN allowed) and overlap of (R[t, i], R[t + lag, j]).

    ``data`` = (z_t, present_t, raw_t, prefix_t, prefix_sq_t, prefix_count_t, gap_ptr,
    gap_rows, lo_a, hi_a, lo_b, hi_b); gaps are the whole window's interior gaps."""
    z_t = data[0]
    present_t = data[1]
    raw_t = data[2]
    prefix_t = data[3]
    prefix_sq_t = data[4]
    prefix_count_t = data[5]
    gap_ptr = data[6]
    gap_rows = data[7]
    n_rows = z_t.shape[1]
    k_lo = max(data[8][lag, i], data[10][lag, j])
    k_hi = min(data[9][lag, i], data[11][lag, j])
    if k_hi <= k_lo:
        return np.nan, 0
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
    if count < min_overlap:
        return np.nan, count
    sxy = _dot_lagged(z_t[i, k_lo:k_hi], z_t[j, k_lo + lag : k_hi + lag])
    inv_n = 1.0 / count
    var_x = sxx - sx * sx * inv_n
    var_y = syy - sy * sy * inv_n
    if var_x <= tau * base_x or var_y <= tau * base_y:
        value = exact_pair_correlation(
            raw_t[i, 0 : n_rows - lag], raw_t[j, lag:n_rows], min_overlap
        )
    else:
        value = (sxy - sx * sy * inv_n) / math.sqrt(max(var_x * var_y, 1e-300))
        value = min(1.0, max(-1.0, value))
    return value, count


@njit(cache=True, nogil=True)
def evaluate_pair(i, j, r, params, data, sync_block, out):  # pragma: no cover - compiled
    """Exact best lag, its correlation and overlap, the sync correlation and the improvement of
    (i, j) (SPEC §6), written at ``[r, j]`` of ``out`` = (improvement, best_corr, best_lag,
    best_overlap, sync); returns the improvement (float32, −inf for a non-candidate).

    ``params`` = (max_lag, min_overlap, tau, min_improvement as float32, with_sync)."""
    max_lag = params[0]
    min_overlap = params[1]
    tau = params[2]
    min_improvement = params[3]
    with_sync = params[4]
    best_abs = np.float32(-1.0)
    best_corr = np.float32(np.nan)
    best_lag = 0
    best_overlap = 0
    for lag in range(1, max_lag + 1):
        value, count = lagged_value(i, j, lag, min_overlap, tau, data)
        v32 = np.float32(value)
        magnitude = abs(v32)
        if magnitude > best_abs:
            best_abs = magnitude
            best_corr = v32
            best_lag = lag
            best_overlap = count
    if with_sync:
        sync = np.float32(lagged_value(i, j, 0, min_overlap, tau, data)[0])
    else:
        sync = sync_block[r, j]
    sync_abs = abs(sync)
    if math.isnan(sync_abs):
        sync_abs = np.float32(0.0)
    improvement = best_abs - sync_abs
    if not (best_abs >= 0 and improvement > min_improvement):
        improvement = np.float32(-np.inf)
    out[0][r, j] = improvement
    out[1][r, j] = best_corr
    out[2][r, j] = best_lag
    out[3][r, j] = best_overlap
    out[4][r, j] = sync
    return improvement


@njit(cache=True, nogil=True, inline="always")
def _before(value, index, other_value, other_index):  # pragma: no cover - compiled
    """The total order of every top-k: larger value first, then smaller index."""
    return value > other_value or (value == other_value and index < other_index)


@njit(cache=True, nogil=True)
def insert_ordered(values, indices, value, index):  # pragma: no cover - compiled
    """Insert (value, index) into the list ordered by :func:`_before`, dropping the last."""
    k = values.shape[0]
    if not _before(value, index, values[k - 1], indices[k - 1]):
        return
    pos = k - 1
    while pos > 0 and _before(value, index, values[pos - 1], indices[pos - 1]):
        values[pos] = values[pos - 1]
        indices[pos] = indices[pos - 1]
        pos -= 1
    values[pos] = value
    indices[pos] = index


@njit(cache=True, nogil=True)
def select_rows(  # pragma: no cover - compiled
    row_lo, row_hi, block_start, bound, params, data, sync_block, out, row_values, row_index
):
    """Each leader's final top-k laggers (``row_values`` / ``row_index``, block rows × k, to be
    filled with −inf / −1): seeds are the k best bounds, then every pair whose bound is not
    strictly below the current k-th exact improvement is evaluated (module docstring)."""
    n_cols = bound.shape[1]
    k = row_values.shape[1]
    seed_values = np.empty(k, dtype=np.float32)
    seed_index = np.empty(k, dtype=np.int64)
    evaluated = out[0]
    for r in range(row_lo, row_hi):
        i = block_start + r
        seed_values[:] = -np.inf
        seed_index[:] = -1
        for j in range(n_cols):
            u = bound[r, j]
            if u > -np.inf:
                insert_ordered(seed_values, seed_index, u, j)
        values = row_values[r]
        index = row_index[r]
        for s in range(k):
            j = seed_index[s]
            if j < 0:
                break
            e = evaluate_pair(i, j, r, params, data, sync_block, out)
            if e > -np.inf:
                insert_ordered(values, index, e, j)
        for j in range(n_cols):
            u = bound[r, j]
            if u > -np.inf and u >= values[k - 1] and math.isnan(evaluated[r, j]):
                e = evaluate_pair(i, j, r, params, data, sync_block, out)
                if e > -np.inf:
                    insert_ordered(values, index, e, j)


@njit(cache=True, nogil=True)
def select_columns(  # pragma: no cover - compiled
    col_lo, col_hi, block_start, bound, params, data, sync_block, out, column_values, column_rows
):
    """Fold the block's leaders into each lagger's running top-k (``column_values`` /
    ``column_rows``, N × k, global leader indices): the pairs already evaluated, then seeds (the
    k best bounds not below the k-th kept value), then every pair whose bound is not strictly
    below the current k-th value (module docstring). Columns are walked in small groups, rows
    in order, so the bound matrix is read row-major."""
    height = bound.shape[0]
    k = column_values.shape[1]
    group = 32
    evaluated = out[0]
    seed_values = np.empty((group, k), dtype=np.float32)
    seed_rows = np.empty((group, k), dtype=np.int64)
    for g_lo in range(col_lo, col_hi, group):
        g_hi = min(g_lo + group, col_hi)
        for r in range(height):
            for j in range(g_lo, g_hi):
                e = evaluated[r, j]
                if e > -np.inf:  # evaluated (not NaN) and a candidate
                    insert_ordered(column_values[j], column_rows[j], e, block_start + r)
        seed_values[:] = -np.inf
        seed_rows[:] = -1
        for r in range(height):
            for j in range(g_lo, g_hi):
                u = bound[r, j]
                if u > -np.inf and u >= column_values[j, k - 1] and math.isnan(evaluated[r, j]):
                    insert_ordered(seed_values[j - g_lo], seed_rows[j - g_lo], u, r)
        for j in range(g_lo, g_hi):
            for s in range(k):
                r = seed_rows[j - g_lo, s]
                if r < 0:
                    break
                e = evaluate_pair(block_start + r, j, r, params, data, sync_block, out)
                if e > -np.inf:
                    insert_ordered(column_values[j], column_rows[j], e, block_start + r)
        for r in range(height):
            for j in range(g_lo, g_hi):
                u = bound[r, j]
                if u > -np.inf and u >= column_values[j, k - 1] and math.isnan(evaluated[r, j]):
                    e = evaluate_pair(block_start + r, j, r, params, data, sync_block, out)
                    if e > -np.inf:
                        insert_ordered(column_values[j], column_rows[j], e, block_start + r)
