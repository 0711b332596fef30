"""Numba kernels of the screened lead-lag scan (SPEC §6): rigorous upper and lower bounds of
every pair's improvement, the exact per-pair evaluation and the threshold selections.

Notation (see ``standardize``): ``Z`` the standardized zero-filled window, ``PZ``, ``PZ2``, ``PM``
its prefix sums of values, squares and presence. For lag ``ℓ`` the leader ``i`` is read on rows
``t ∈ [0, T−ℓ)`` and the lagger ``j`` on rows ``t + ℓ``. A column is present on ``[lo, hi)``
(first to last finite row of the window) less its interior gaps, so the pair's overlap lies in
``K = [max(lo_i, lo_j − ℓ, 0), min(hi_i, hi_j − ℓ, T − ℓ))`` less the gaps of either.

**Exact value** (:func:`lagged_value`), the same formula and exactness guard as ``kernels``:

    n = #{t ∈ K : both present}
    Sx = PZ_i[K] − Σ_{t ∈ K, j missing at t+ℓ} Z_i(t)    Sxx likewise with Z²    (Sy, Syy symmetric)
    Sxy = Σ_{t ∈ K} Z_i(t) Z_j(t+ℓ)   (float64 sum of the float32 products, fixed order)
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n)(Syy − Sy²/n))

recomputed from the raw returns in float64 (``kernels.exact_pair_correlation``) when a variance is
at most ``tau`` times the interval sum of squares it came from (``base``). Every value is a pure
function of the pair: it does not depend on the block, the tile or the thread that computes it.

**Bounds** (:func:`screen_tile`, :func:`_pair_bounds`). Each column has an interval ``[lo, hi)``
(the whole window for a *dense* column) and ``g`` missing rows inside it. For lag ℓ the leader is
read on ``K_x(ℓ) = [max(lo_j − ℓ, 0), min(hi_j − ℓ, T − ℓ))`` and the lagger on ``K_y(ℓ) =
[lo_i + ℓ, min(hi_i + ℓ, T))``: each column is zero outside its own interval, so each side's
interval sums depend on the *other* column's interval only. Over ℓ = 1..L these ranges share a
core and lie in a hull at most L − 1 rows larger at each end, so with ``P`` the largest
``|float32 GEMM product|`` over the lags (``|P − Sxy| ≤ γ·sqrt(Sxx·Syy)`` for any summation
order, ``γ = 2·T·2⁻²⁴/(1 − T·2⁻²⁴)``), for every lag at once:

    |Sx| ≤ sx := |Σ_core Z_i| + Σ_fringe |Z_i| + Σ_{w: j missing} max_ℓ |Z_i(w − ℓ)|
    Sxx ≥ sxx_lo := Σ_core Z_i² − Σ_{w: j missing} max_ℓ Z_i(w − ℓ)²     Sxx ≤ sxx_hi := Σ_hull Z_i²
    n ≥ n_lo := |core ∩| − g_i − g_j        (sy, syy_lo, syy_hi symmetric, with j's rows t + ℓ)
    var_x ≥ vx := sxx_lo − sx²/n_lo
    |corr_ℓ| ≤ U := min(1, (P + γ·sqrt(sxx_hi·syy_hi) + sx·sy/n_lo) / sqrt(vx·vy))
    max_ℓ |corr_ℓ| ≥ D := max(0, (P − γ·sqrt(sxx_hi·syy_hi) − sx·sy/n_lo) / sqrt(sxx_hi·syy_hi))

``U`` holds when ``n_lo ≥ 1``, ``vx > tau'·sxx_hi`` and ``vy > tau'·syy_hi`` (``tau' =
1.01·tau``: then neither variance can trigger the float64 fallback, so the exact value is the
formula's), else ``U = 1`` (a computed correlation is clamped to [−1, 1]); ``U = −∞`` when the
hull has fewer than ``min_overlap`` rows (every lag is NaN). ``D`` holds under the same
conditions and ``n_lo ≥ min_overlap`` (every lag finite), else there is none. For the
synchronous pair the interval and gap sums are exact, only ``n`` is known to within
``min(g_i, g_j)``, giving ``S_lo ≤ |sync| ≤ S_hi`` (``0`` and ``1`` when the conditions fail),
or ``|sync|`` exactly when ``corr`` is given. Finally

    upper = U − S_lo + margin          lower = D − S_hi − margin

(the margin, 2⁻¹², covers every float rounding of the bounds and of the exact value, all below
1e-6), each ``−∞`` when at most ``min_improvement`` (then the pair is no candidate, resp. the
bound says nothing) and for ``i = j``.

**Significance** (``max_q_value`` < 1: a candidate's best lag also needs its p-value's bin
``p_bin(r, n) <= bin_limit``, ``significance.candidate_bin_limit``). The bin does not increase
with ``|r|`` nor with ``n``; the best lag has ``D <= |r| <= U`` and ``n_lo <= n <= n_hull``, so
a pair with ``p_bin(U, n_hull) > bin_limit`` is no candidate (upper = −∞) and a lower bound
stands only when ``p_bin(D, n_lo) <= bin_limit``
(:func:`~corr_pipeline.compute.lead_lag.p_values.significance_bounds`, with ``U`` and ``D``
widened by its margin). The exact evaluation applies the condition itself (:func:`pair_values`).

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
from corr_pipeline.compute.lead_lag.p_values import N_BINS, p_bin, significance_bounds
from corr_pipeline.compute.standardize import Standardized, make_side
from corr_pipeline.compute.top_k import before, insert_value

BOUND_MARGIN = 2.0**-12
"""Added to every improvement bound: covers the float rounding of the bound and of the exact value."""

TAU_SCREEN_FACTOR = 1.01
"""The bound treats a variance within this factor of the fallback threshold as ill-conditioned."""

DENSE_GAPS = 16
"""A column missing at most this many rows of the window is *dense*: its interval is taken as the
whole window and its missing rows as gaps (ragged columns use their own interval)."""


@njit(cache=True, nogil=True)
def column_extents(present_t):  # pragma: no cover - compiled
    """Per column: its interval ``[lo, hi)`` (``0, T`` for a *dense* column, one missing at most
    :data:`DENSE_GAPS` rows; else first to last finite row), its missing rows inside it as CSR
    (``miss_ptr``, ``miss_rows`` ascending, ``miss_cols``) and their count ``gaps``. Returns
    ``lo, hi, gaps, miss_ptr, miss_rows, miss_cols, dense``."""
    n_cols, n_rows = present_t.shape
    lo = np.zeros(n_cols, dtype=np.int64)
    hi = np.zeros(n_cols, dtype=np.int64)
    gaps = np.zeros(n_cols, dtype=np.int64)
    dense = np.zeros(n_cols, dtype=np.bool_)
    for c in range(n_cols):
        p = present_t[c]
        count = 0
        first = n_rows
        last = -1
        for t in range(n_rows):
            if p[t]:
                count += 1
                first = min(first, t)
                last = t
        if n_rows - count <= DENSE_GAPS:
            dense[c] = True
            hi[c] = n_rows
        elif count > 0:
            lo[c] = first
            hi[c] = last + 1
        gaps[c] = hi[c] - lo[c] - count if count > 0 else 0
    miss_ptr = np.zeros(n_cols + 1, dtype=np.int64)
    for c in range(n_cols):
        miss_ptr[c + 1] = miss_ptr[c] + gaps[c]
    miss_rows = np.empty(miss_ptr[n_cols], dtype=np.int64)
    miss_cols = np.empty(miss_ptr[n_cols], dtype=np.int64)
    for c in range(n_cols):
        q = miss_ptr[c]
        if gaps[c] > 0:
            for t in range(lo[c], hi[c]):
                if not present_t[c, t]:
                    miss_rows[q] = t
                    miss_cols[q] = c
                    q += 1
    return lo, hi, gaps, miss_ptr, miss_rows, miss_cols, dense


@njit(cache=True, nogil=True, inline="always")
def _fringe(h_lo, h_hi, c_lo, c_hi):  # pragma: no cover - compiled
    """The rows of the hull ``[h_lo, h_hi)`` outside the core ``[c_lo, c_hi)`` (``h_lo <= c_lo
    <= c_hi <= h_hi``) as two ranges ``(h_lo, head_hi), (tail_lo, h_hi)``: at most ``L − 1``
    rows at each end, so the loops never walk the hull."""
    return (h_lo, min(c_lo, h_hi)), (max(c_hi, h_lo), h_hi)


@njit(cache=True, nogil=True, inline="always")
def _pair_bounds(
    p_max,
    p_sync,
    with_sync,
    sync_abs,
    sx,
    x_sq_lo,
    x_sq_hi,
    sy,
    y_sq_lo,
    y_sq_hi,
    n_core,
    n_hull,
    g_i,
    g_j,
    sx0,
    sxx0,
    sy0,
    syy0,
    n0,
    min_overlap,
    min_improvement,
    gamma,
    tau_screen,
):  # pragma: no cover - compiled
    """(upper, lower) bounds of one pair's improvement (module docstring).

    Lags: ``sx``, ``sy`` bound ``|Sx|``, ``|Sy|``; ``*_sq_lo`` / ``*_sq_hi`` bound ``Sxx``, ``Syy``
    from below / above, for every lag; ``n_core`` / ``n_hull`` are the fewest / most rows of a
    lag's interval intersection, ``g_i + g_j`` the most rows missing in it. Sync: exact ``Sx``,
    ``Sxx``, ``Sy``, ``Syy`` over the overlap, whose size is ``n0 − g_i − g_j`` to
    ``n0 − max(g_i, g_j)``."""
    # Branch-free (every value computed, then selected) so that the loop vectorizes.
    n_lo = n_core - g_i - g_j
    inv_n = 1.0 / max(n_lo, 1.0)
    vx = x_sq_lo - sx * sx * inv_n
    vy = y_sq_lo - sy * sy * inv_n
    ok = (n_lo >= 1) & (vx > tau_screen * x_sq_hi) & (vy > tau_screen * y_sq_hi)
    scale = math.sqrt(max(x_sq_hi * y_sq_hi, 0.0))
    cross = sx * sy * inv_n
    up = min(1.0, (p_max + gamma * scale + cross) / math.sqrt(max(vx * vy, 1e-300)))
    lw = max(0.0, (p_max - gamma * scale - cross) / max(scale, 1e-300))
    upper = up if ok else 1.0
    upper = upper if n_hull >= min_overlap else -np.inf
    lower = lw if ok & (n_lo >= min_overlap) else -np.inf
    n0_lo = n0 - g_i - g_j
    inv_lo = 1.0 / max(n0_lo, 1.0)
    inv_hi = 1.0 / max(n0 - max(g_i, g_j), 1.0)
    vx_lo = sxx0 - sx0 * sx0 * inv_lo
    vy_lo = syy0 - sy0 * sy0 * inv_lo
    vx_hi = sxx0 - sx0 * sx0 * inv_hi
    vy_hi = syy0 - sy0 * sy0 * inv_hi
    scale0 = math.sqrt(max(sxx0 * syy0, 0.0))
    cross0 = abs(sx0 * sy0) * inv_lo
    ok0 = (n0_lo >= min_overlap) & (vx_lo > tau_screen * sxx0) & (vy_lo > tau_screen * syy0)
    s_lo = min(
        1.0, max(0.0, (p_sync - gamma * scale0 - cross0) / math.sqrt(max(vx_hi * vy_hi, 1e-300)))
    )
    s_hi = min(1.0, (p_sync + gamma * scale0 + cross0) / math.sqrt(max(vx_lo * vy_lo, 1e-300)))
    sync_lo = (s_lo if ok0 else 0.0) if with_sync else sync_abs
    sync_hi = (s_hi if ok0 else 1.0) if with_sync else sync_abs
    bound_hi = upper - sync_lo + BOUND_MARGIN
    bound_lo = lower - sync_hi - BOUND_MARGIN
    bound_hi = bound_hi if (upper > -np.inf) & (bound_hi > min_improvement) else -np.inf
    bound_lo = bound_lo if bound_lo > min_improvement else -np.inf
    return bound_hi, bound_lo, up if ok else 1.0, lw, n_lo


@njit(cache=True, nogil=True)
def screen_tile(products, tile, params, window, out):  # pragma: no cover - compiled
    """Upper and lower improvement bounds (module docstring) of leaders ``[row_lo, row_hi)``
    against the laggers ``col0 ..`` of one product chunk, into ``out_*[i − block_start, j]``.

    ``products[ℓ]`` is the float32 product of lag ℓ for the tile (rows from ``tile_start``;
    slot 0, lag 0, only when ``with_sync``, else ``|sync|`` is read from ``sync_block``, NaN as 0).
    ``lag_y`` holds the dense leaders'
    lagger-side sums (rows ``max_ℓ |PZ_j[T] − PZ_j[ℓ]|``, ``PZ2_j[T] − PZ2_j[L]``,
    ``PZ2_j[T] − PZ2_j[1]``); ``ragged_cols`` lists the columns that are not dense.

    For every lag ℓ, the leader's rows lie in ``[max(lo_j − ℓ, 0), min(hi_j − ℓ, T − ℓ))`` and
    the lagger's in ``[lo_i + ℓ, min(hi_i + ℓ, T))``; each column is zero outside its own
    interval, so each side's interval sums only depend on the *other* column's interval. Over
    ℓ = 1..L these ranges contain a common core and lie in a hull at most ``L − 1`` rows larger
    at each end: sums over the core plus the absolute values (squares) of the fringe rows bound
    every lag at once (one bound per pair for all lags, with the largest |P|). A row ``w`` where the lagger is missing
    removes the leader's ``Z_i(w − ℓ)`` from the leader's sums: at most ``max_ℓ |Z_i(w − ℓ)|``
    (and its square); the leader's missing rows ``t`` likewise remove at most
    ``max_ℓ |Z_j(t + ℓ)|`` (float32, over ``ℓ <= min(L, T − 1 − t)``; 0 at the last row) from
    the lagger's. For the synchronous pair these corrections are exact.

    Arguments, grouped (one kernel call per tile and chunk): ``tile`` = (tile_start, row_lo,
    row_hi, block_start, col0); ``params`` = (with_sync, max_lag, min_overlap, min_improvement,
    gamma, tau_screen, bin_limit); ``window`` = the window's and screen's arrays (z, z_t, prefix,
    prefix_sq, prefix_t, prefix_sq_t, lo, hi, gaps, miss_ptr, miss_rows, miss_cols,
    ragged_cols, lag_y); ``out`` = (out_upper, out_lower, sync_block)."""
    tile_start, row_lo, row_hi, block_start, col0 = tile
    with_sync, max_lag, min_overlap, min_improvement, gamma, tau_screen, bin_limit = params
    z, z_t, prefix, prefix_sq, prefix_t, prefix_sq_t = window[:6]
    lo, hi, gaps, miss_ptr, miss_rows, miss_cols, ragged_cols, lag_y = window[6:]
    out_upper, out_lower, sync_block = out
    width = products.shape[2]
    n_rows = prefix.shape[0] - 1
    L = max_lag
    y_sum = np.empty(width)
    y_sq_lo = np.empty(width)
    y_sq_hi = np.empty(width)
    y0_sum = np.empty(width)
    y0_sq = np.empty(width)
    xs_v = np.empty(width)
    xsl_v = np.empty(width)
    xsh_v = np.empty(width)
    nc_v = np.empty(width)
    nh_v = np.empty(width)
    x0s_v = np.empty(width)
    x0q_v = np.empty(width)
    n0_v = np.empty(width)
    behind = np.empty(n_rows)
    ahead = np.empty(width, dtype=np.float32)
    p_max32 = np.empty(width, dtype=np.float32)
    p_sync_v = np.empty(width)
    sync_v = np.empty(width)
    gaps_v = np.empty(width)
    corr_hi_v = np.empty(width)
    corr_lo_v = np.empty(width)
    n_lo_v = np.empty(width)
    for c in range(width):
        gaps_v[c] = np.float64(gaps[col0 + c])
    r_first = np.searchsorted(ragged_cols, col0)
    r_last = np.searchsorted(ragged_cols, col0 + width)
    e_first = miss_ptr[col0]
    e_last = miss_ptr[col0 + width]
    for i in range(row_lo, row_hi):
        ti = i - tile_start
        r = i - block_start
        lo_i = lo[i]
        hi_i = hi[i]
        g_i = gaps[i]
        pz_i = prefix_t[i]
        pz2_i = prefix_sq_t[i]
        zi = z_t[i]
        # behind[w] = max over lags of |Z_i(w − ℓ)|.
        for w in range(n_rows):
            v = 0.0
            for lag in range(1, min(L, w) + 1):
                v = max(v, abs(np.float64(zi[w - lag])))
            behind[w] = v
        # Lagger-side sums over the rows the leader's interval allows (vectors over j).
        if lo_i == 0 and hi_i == n_rows:
            for c in range(width):
                y_sum[c] = lag_y[0, col0 + c]
                y_sq_lo[c] = lag_y[1, col0 + c]
                y_sq_hi[c] = lag_y[2, col0 + c]
        else:
            c_lo = min(lo_i + L, n_rows)
            c_hi = max(min(hi_i + 1, n_rows), c_lo)
            h_lo = min(lo_i + 1, n_rows)
            h_hi = max(min(hi_i + L, n_rows), h_lo)
            for c in range(width):
                j = col0 + c
                y_sum[c] = abs(prefix[c_hi, j] - prefix[c_lo, j])
                core_sq = prefix_sq[c_hi, j] - prefix_sq[c_lo, j]
                y_sq_lo[c] = core_sq
                y_sq_hi[c] = core_sq
            # The fringe rows (hull less core), at most L − 1 at each end, exactly.
            for t_lo, t_hi in _fringe(h_lo, h_hi, c_lo, c_hi):
                for t in range(t_lo, t_hi):
                    for c in range(width):
                        v = abs(np.float64(z[t, col0 + c]))
                        y_sum[c] += v
                        y_sq_hi[c] += v * v
        for c in range(width):
            j = col0 + c
            y0_sum[c] = prefix[hi_i, j] - prefix[lo_i, j]
            y0_sq[c] = prefix_sq[hi_i, j] - prefix_sq[lo_i, j]
        for q in range(miss_ptr[i], miss_ptr[i + 1]):
            t = miss_rows[q]
            ahead[:] = 0.0  # max over lags of |Z_j(t + ℓ)|
            for lag in range(1, min(L, n_rows - 1 - t) + 1):
                for c in range(width):
                    ahead[c] = max(ahead[c], abs(z[t + lag, col0 + c]))
            for c in range(width):
                a = np.float64(ahead[c])
                y_sum[c] += a
                y_sq_lo[c] -= a * a
                v = np.float64(z[t, col0 + c])
                y0_sum[c] -= v
                y0_sq[c] -= v * v
        # Leader-side sums, per lagger: over the whole window when j is dense ...
        x_sum = 0.0
        for lag in range(1, L + 1):
            x_sum = max(x_sum, abs(pz_i[n_rows - lag] - pz_i[0]))
        x_sq_lo = pz2_i[n_rows - L] - pz2_i[0]
        x_sq_hi = pz2_i[n_rows - 1] - pz2_i[0]
        n_core = np.float64(min(hi_i, n_rows - L) - lo_i)
        n_hull = np.float64(min(hi_i, n_rows - 1) - lo_i)
        x0_sum = pz_i[n_rows] - pz_i[0]
        x0_sq = pz2_i[n_rows] - pz2_i[0]
        n0 = np.float64(hi_i - lo_i)
        for c in range(width):
            xs_v[c] = x_sum
            xsl_v[c] = x_sq_lo
            xsh_v[c] = x_sq_hi
            nc_v[c] = n_core
            nh_v[c] = n_hull
            x0s_v[c] = x0_sum
            x0q_v[c] = x0_sq
            n0_v[c] = n0
        # ... and over its (shifted) interval when j is ragged: core sums plus the fringe rows.
        for q in range(r_first, r_last):
            j = ragged_cols[q]
            c = j - col0
            lo_j = lo[j]
            hi_j = hi[j]
            c_lo = max(lo_j - 1, 0)
            c_hi = max(min(hi_j - L, n_rows - L), c_lo)
            h_lo = max(lo_j - L, 0)
            h_hi = max(min(hi_j - 1, n_rows - 1), h_lo)
            xs = abs(pz_i[c_hi] - pz_i[c_lo])
            core_sq = pz2_i[c_hi] - pz2_i[c_lo]
            fringe_sq = 0.0
            for t_lo, t_hi in _fringe(h_lo, h_hi, c_lo, c_hi):
                for t in range(t_lo, t_hi):
                    v = abs(np.float64(zi[t]))
                    xs += v
                    fringe_sq += v * v
            xs_v[c] = xs
            xsl_v[c] = core_sq
            xsh_v[c] = core_sq + fringe_sq
            nc_v[c] = min(hi_i, hi_j - L, n_rows - L) - max(lo_i, lo_j - 1)
            nh_v[c] = min(hi_i, hi_j - 1, n_rows - 1) - max(lo_i, lo_j - L)
            x0s_v[c] = pz_i[hi_j] - pz_i[lo_j]
            x0q_v[c] = pz2_i[hi_j] - pz2_i[lo_j]
            n0_v[c] = min(hi_i, hi_j) - max(lo_i, lo_j)
        # Leader-side corrections for the laggers' missing rows (one scatter over the chunk).
        for q in range(e_first, e_last):
            w = miss_rows[q]
            c = miss_cols[q] - col0
            b = behind[w]
            xs_v[c] += b
            xsl_v[c] -= b * b
            v = np.float64(zi[w])
            x0s_v[c] -= v
            x0q_v[c] -= v * v
        f_gi = np.float64(g_i)
        f_min_overlap = np.float64(min_overlap)
        # The largest |product| over the lags, in float32 (abs and max are exact).
        for c in range(width):
            p_max32[c] = abs(products[1, ti, c])
        for lag in range(2, L + 1):
            for c in range(width):
                p_max32[c] = max(p_max32[c], abs(products[lag, ti, c]))
        if with_sync:
            for c in range(width):
                p_sync_v[c] = abs(np.float64(products[0, ti, c]))
                sync_v[c] = 0.0
        else:
            for c in range(width):
                p_sync_v[c] = 0.0
                v = abs(np.float64(sync_block[r, col0 + c]))
                sync_v[c] = 0.0 if math.isnan(v) else v
        for c in range(width):
            upper, lower, corr_hi_v[c], corr_lo_v[c], n_lo_v[c] = _pair_bounds(
                np.float64(p_max32[c]),
                p_sync_v[c],
                with_sync,
                sync_v[c],
                xs_v[c],
                xsl_v[c],
                xsh_v[c],
                y_sum[c],
                y_sq_lo[c],
                y_sq_hi[c],
                nc_v[c],
                nh_v[c],
                f_gi,
                gaps_v[c],
                x0s_v[c],
                x0q_v[c],
                y0_sum[c],
                y0_sq[c],
                n0_v[c],
                f_min_overlap,
                min_improvement,
                gamma,
                tau_screen,
            )
            out_upper[r, col0 + c] = upper
            out_lower[r, col0 + c] = lower
        if bin_limit < N_BINS:
            for c in range(width):
                upper, lower = significance_bounds(
                    out_upper[r, col0 + c],
                    out_lower[r, col0 + c],
                    corr_hi_v[c],
                    corr_lo_v[c],
                    n_lo_v[c],
                    nh_v[c],
                    bin_limit,
                )
                out_upper[r, col0 + c] = upper
                out_lower[r, col0 + c] = lower
        if col0 <= i < col0 + width:
            out_upper[r, i] = -np.inf
            out_lower[r, i] = -np.inf


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
    """Exact correlation (float64, NaN allowed) and overlap of (R[t, i], R[t + lag, j]):
    :func:`lagged_from_sums` with ``sxy`` summed by :func:`_dot_lagged` over the overlap."""
    sums = overlap_moments(i, j, lag, data)
    if sums[8] < min_overlap:
        return np.nan, sums[8]
    z_t = data[0]
    k_lo = sums[0]
    k_hi = sums[1]
    sxy = _dot_lagged(z_t[i, k_lo:k_hi], z_t[j, k_lo + lag : k_hi + lag])
    return lagged_from_sums(i, j, lag, sxy, sums, min_overlap, tau, data)


@njit(cache=True, nogil=True)
def pair_values(i, j, given_sync, params, data):  # pragma: no cover - compiled
    """Exact (improvement, best_corr, best_lag, best_overlap, sync) of the pair (i, j), SPEC §6;
    the improvement is float32, −inf for a non-candidate.

    ``params`` = (max_lag, min_overlap, tau, min_improvement as float32, with_sync, bin_limit);
    without ``with_sync`` the synchronous correlation is ``given_sync`` (float32, NaN allowed).
    A candidate also needs the histogram bin of its best lag's p-value (``p_values.p_bin`` of
    its float64 correlation and overlap) at most ``bin_limit`` (``N_BINS``: no condition)."""
    max_lag = params[0]
    min_overlap = params[1]
    tau = params[2]
    min_improvement = params[3]
    bin_limit = params[5]
    best_abs = np.float32(-1.0)
    best_value = np.nan
    best_lag = 0
    best_overlap = 0
    for lag in range(1, max_lag + 1):
        value, count = lagged_value(i, j, lag, min_overlap, tau, data)
        magnitude = abs(np.float32(value))
        if magnitude > best_abs:
            best_abs = magnitude
            best_value = value
            best_lag = lag
            best_overlap = count
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
    elif bin_limit < N_BINS and p_bin(best_value, best_overlap) > bin_limit:
        improvement = np.float32(-np.inf)
    return improvement, best_corr, best_lag, best_overlap, sync


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
    row_lo, row_hi, block_start, upper, lower, sync_block, with_sync, params, data, out
):
    """Each leader's final top-k laggers (rows ``[row_lo, row_hi)`` of the block): the k-th
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
        leaders = np.full(count, block_start + r, dtype=np.int64)
        evaluated += _select_exact(leaders, cols, bounds[order], syncs, cols, params, data, out, r)
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
