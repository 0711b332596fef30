"""The compiled kernels of the lead-lag sweep (:mod:`~corr_pipeline.compute.lead_lag.sweep`, whose
docstring states what they compute and proves the bounds): the leaders shifted by every lag,
the laggers' per-lag tables, the per-pair pass :func:`sweep_tile` and the exact bins of the
pairs it defers.

The per-lag loops over a chunk of laggers each touch few arrays, so that LLVM vectorises them
without runtime alias checks; the choice of each pair's best lag and its statistic is one
scalar loop over the pairs with the lags inside.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from corr_pipeline.compute.lead_lag.kernels import best_lag, lagged_value
from corr_pipeline.compute.lead_lag.p_values import (
    COARSE_STEPS,
    FINE_BINS,
    FINE_STEPS,
    N_BINS,
    U_FINE,
    U_LAST,
    t_bin,
)

GROUP_ROWS = 16
"""Leaders swept together: their pairs' ``Q`` is computed after all their best lags are known,
four laggers at a time, so that the laggers' rows of ``Z²`` are read once for the group."""

Q_TERMS = 128
"""Terms of ``Q`` per float32 partial sum (``γ_{Q_TERMS+2}`` of the bound), the partial sums
added in float64: one sum over the whole window would give ``γ_{T+2}``, too wide at T = 1,500 for
the strong pairs' statistic to be certain."""


@njit(cache=True, nogil=True)
def exact_bins(pairs, max_lag, min_overlap, tau, data):  # pragma: no cover - compiled
    """Per pair ``(leader, lagger, lag)``, the bin of its exact p-value at its exact best lag
    (−1 without one): at ``lag`` when the sweep found it certain, else searched."""
    out = np.empty(pairs.shape[0], dtype=np.int64)
    for k in range(pairs.shape[0]):
        i, j, lag = pairs[k, 0], pairs[k, 1], pairs[k, 2]
        if lag > 0:
            out[k] = t_bin(lagged_value(i, j, lag, min_overlap, tau, data)[2])
            continue
        best_abs, _, _, _, t_stat = best_lag(i, j, max_lag, min_overlap, tau, data)
        out[k] = t_bin(t_stat) if best_abs >= 0 else -1
    return out


@njit(cache=True, nogil=True)
def shift_leaders(z_t, tile, first_lag, out):  # pragma: no cover - compiled
    """``out[ℓ − first_lag, r, u] = Z[u − ℓ, tile[r]]`` (0 for ``u < ℓ``): one product with
    ``Z`` gives every lag's sums (the added terms are zeros)."""
    n_lags, _, n_rows = out.shape
    for s in range(n_lags):
        lag = first_lag + s
        for r in range(tile.size):
            row = out[s, r]
            row[:lag] = 0.0
            row[lag:] = z_t[tile[r], : n_rows - lag]


@njit(cache=True, nogil=True)
def lagger_sums(data, max_lag):  # pragma: no cover - compiled
    """Per lag ``ℓ = 0 .. max_lag`` and lagger ``j``, the overlap ``[a, b)`` of
    ``kernels.overlap_moments`` with a leader present throughout (``a = max(lo_j − ℓ, 0)``,
    ``b = max(min(hi_j − ℓ, T − ℓ), a)``) and the lagger's interval sums over it (``sy``,
    ``base_y``), the same operations as ``overlap_moments``: ``(a, b, sy, base_y)``, each
    ``(max_lag + 1) × N`` (row ``ℓ``)."""
    prefix_t, prefix_sq_t, lo, hi = data[3], data[4], data[8], data[9]
    n_cols, n_rows = prefix_t.shape[0], prefix_t.shape[1] - 1
    a = np.empty((max_lag + 1, n_cols), dtype=np.int64)
    b = np.empty((max_lag + 1, n_cols), dtype=np.int64)
    sy = np.empty((max_lag + 1, n_cols))
    base_y = np.empty((max_lag + 1, n_cols))
    for lag in range(max_lag + 1):
        for j in range(n_cols):
            k_lo = min(max(lo[j] - lag, 0), n_rows - lag)
            k_hi = max(min(hi[j] - lag, n_rows - lag), k_lo)
            a[lag, j] = k_lo
            b[lag, j] = k_hi
            sy[lag, j] = prefix_t[j, k_hi + lag] - prefix_t[j, k_lo + lag]
            base_y[lag, j] = prefix_sq_t[j, k_hi + lag] - prefix_sq_t[j, k_lo + lag]
    return a, b, sy, base_y


@njit(cache=True, nogil=True, inline="always")
def _bin_of(z):  # pragma: no cover - compiled
    """``p_values.t_bin`` of ``z >= 0``, branch-free (so that the loops calling it vectorise)."""
    u = min(z + 0.5 * z * z, U_LAST)
    fine = N_BINS - 1 - np.int64(min(u, U_FINE) * FINE_STEPS)
    coarse = N_BINS - 1 - FINE_BINS - np.int64((u - U_FINE) * COARSE_STEPS)
    return fine if u < U_FINE else (coarse if u < U_LAST else 0)


@njit(cache=True, nogil=True, error_model="numpy")
def _overlap_sums(
    i, lag, col0, data, window, laggers, partial, lagger_gaps, sums
):  # pragma: no cover - compiled
    """The sums of ``kernels.overlap_moments`` of leader ``i`` at lag ``lag`` with the laggers
    ``col0 ..``, vectorised over them (the same operations in the same order, the counts as
    floats): the rows of ``sums`` are (sx, sy, sxx, syy, base_x, base_y, n). ``lagger_gaps``:
    the ``(c, row)`` of each row where lagger ``c`` is missing inside its interval, each
    lagger's rows ascending."""
    z, prefix, prefix_sq = window[0], window[1], window[2]
    z_t, present_t = data[0], data[1]
    prefix_t, prefix_sq_t, prefix_count_t = data[3], data[4], data[5]
    gap_ptr, gap_rows, lo, hi = data[6], data[7], data[8], data[9]
    lag_a, lag_b, lag_sy, lag_base_y = laggers
    sx, sy, sxx, syy, base_x, base_y, count = (
        sums[0],
        sums[1],
        sums[2],
        sums[3],
        sums[4],
        sums[5],
        sums[6],
    )
    width = sx.shape[0]
    n_rows = z.shape[0]
    top = n_rows - lag
    # K for a lagger that spans the window, one interval [k0, k1) for the row ...
    k0 = min(max(lo[i], 0), top)
    k1 = max(min(hi[i], top), k0)
    x_sum = prefix_t[i, k1] - prefix_t[i, k0]
    x_sq = prefix_sq_t[i, k1] - prefix_sq_t[i, k0]
    x_count = np.float64(prefix_count_t[i, k1] - prefix_count_t[i, k0])
    y_hi = prefix[k1 + lag, col0 : col0 + width]
    y_lo = prefix[k0 + lag, col0 : col0 + width]
    y_sq_hi = prefix_sq[k1 + lag, col0 : col0 + width]
    y_sq_lo = prefix_sq[k0 + lag, col0 : col0 + width]
    # (each loop touches few arrays, so that LLVM vectorises it without runtime alias checks)
    for c in range(width):
        sx[c] = x_sum
        base_x[c] = x_sq
        sxx[c] = x_sq
        count[c] = x_count
    for c in range(width):
        sy[c] = y_hi[c] - y_lo[c]
    for c in range(width):
        base_y[c] = y_sq_hi[c] - y_sq_lo[c]
        syy[c] = base_y[c]
    # ... and its own for a lagger listed late or gone early.
    for c in partial:
        j = col0 + c
        a = lag_a[lag, j]
        b = lag_b[lag, j]
        kl = max(k0, a)
        kh = max(min(k1, b), kl)
        sx[c] = prefix_t[i, kh] - prefix_t[i, kl]
        base_x[c] = prefix_sq_t[i, kh] - prefix_sq_t[i, kl]
        sxx[c] = base_x[c]
        count[c] = np.float64(prefix_count_t[i, kh] - prefix_count_t[i, kl])
        if kl == a and kh == b:
            sy[c] = lag_sy[lag, j]
            base_y[c] = lag_base_y[lag, j]
        else:
            sy[c] = prefix[kh + lag, j] - prefix[kl + lag, j]
            base_y[c] = prefix_sq[kh + lag, j] - prefix_sq[kl + lag, j]
        syy[c] = base_y[c]
    # rows where a lagger is missing: inside its interval, so inside its K exactly when
    # inside [k0, k1)
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


@njit(cache=True, nogil=True, inline="always")
def _lag_value(sums, c, p, g_i, root_y, f_overlap, tau):  # pragma: no cover - compiled
    """Lagger ``c``'s ``|r̂|`` at one lag (−1 unless the lag is finite and takes no fallback),
    its bound ``δ`` (module docstring) and its kind: 0 when the lag does not reach
    ``min_overlap``, 1 when it does but a variance takes the float64 fallback, 2 otherwise;
    branch-free."""
    n = sums[6, c]
    inv_n = 1.0 / max(n, 1.0)
    var_x = sums[2, c] - sums[0, c] * sums[0, c] * inv_n
    var_y = sums[3, c] - sums[1, c] * sums[1, c] * inv_n
    inv = 1.0 / math.sqrt(max(var_x * var_y, 1e-300))
    value = min(1.0, max(-1.0, (p - sums[0, c] * sums[1, c] * inv_n) * inv))
    has = n >= f_overlap
    fine = has & (var_x > tau * sums[4, c]) & (var_y > tau * sums[5, c])
    magnitude = abs(value) if fine else -1.0
    delta = g_i * root_y[c] * inv + 2.0**-48
    kind = 2.0 if fine else (1.0 if has else 0.0)
    return magnitude, delta, kind


@njit(cache=True, nogil=True, error_model="numpy")
def _sync_bounds(sums, p_lag, g_i, root_y, f_overlap, tau, sync_lo, sync_hi):  # pragma: no cover
    """Lag 0's bounds of ``|sync|``: ``|r̂₀| ± δ₀`` within [0, 1], 0 to 1 on a fallback, 0 to 0
    below ``min_overlap``; branch-free, so that it vectorises."""
    for c in range(p_lag.shape[0]):
        m0, d0, k0 = _lag_value(sums, c, p_lag[c], g_i, root_y, f_overlap, tau)
        sync_lo[c] = max(m0 - d0, 0.0) if m0 >= 0.0 else 0.0
        sync_hi[c] = min(m0 + d0, 1.0) if m0 >= 0.0 else min(k0, 1.0)


@njit(cache=True, nogil=True, error_model="numpy")
def _fold_lag(sums, p_lag, g_i, root_y, f_overlap, tau, slot, run):  # pragma: no cover
    """Fold one lag (``slot``, lags in ascending order) into each pair's running choice ``run``
    = (best |r̂|, its δ, P there, its slot, the largest other |r̂| + δ, the largest |r̂| + δ, the
    largest |r̂| − δ, the smallest kind of the finite lags, the largest kind): branch-free
    selects, so that it vectorises over the laggers."""
    best_abs, best_delta, best_p, best_slot, others, hi, lo, worst, any_finite = run
    for c in range(p_lag.shape[0]):
        m, d, k = _lag_value(sums, c, p_lag[c], g_i, root_y, f_overlap, tau)
        any_finite[c] = max(any_finite[c], k)
        worst[c] = min(worst[c], k) if k > 0.0 else worst[c]
        ok = m >= 0.0
        better = m > best_abs[c]
        others[c] = max(others[c], best_abs[c] + best_delta[c] if better else m + d)
        hi[c] = max(hi[c], m + d) if ok else hi[c]
        lo[c] = max(lo[c], m - d) if ok else lo[c]
        best_slot[c] = slot if better else best_slot[c]
        best_delta[c] = d if better else best_delta[c]
        best_p[c] = p_lag[c] if better else best_p[c]
        best_abs[c] = m if better else best_abs[c]


@njit(cache=True, nogil=True, error_model="numpy")
def _start_choice(first, run):  # pragma: no cover - compiled
    """``run`` before the first lag (:func:`_fold_lag`; ``first`` the slot of lag 1)."""
    best_abs, best_delta, best_p, best_slot, others, hi, lo, worst, any_finite = run
    for c in range(best_abs.shape[0]):
        best_abs[c] = -1.0
        best_delta[c] = 0.0
        best_p[c] = 0.0
        best_slot[c] = first
        others[c] = -np.inf
        hi[c] = -np.inf
        lo[c] = -np.inf
        worst[c] = 2.0
        any_finite[c] = 0.0


@njit(cache=True, nogil=True, error_model="numpy")
def _choose(first_lag, run, state):  # pragma: no cover - compiled
    """From each pair's choice over the lags (:func:`_fold_lag`): ``P`` at the best lag (into
    ``t_hat``, for :func:`_statistic`), the best lag when it is certain (else 0), and for the
    bounds the largest ``|r̂| ± δ`` (1 for the upper one when a lag takes the fallback) and
    whether a lag is finite; ``state`` = one leader's (t_hat, spread, top_hi, top_lo, finite,
    sync_lo, sync_hi, best_lag)."""
    best_abs, best_delta, best_p, best_slot, others, hi, lo, worst, any_finite = run
    t_hat, _, top_hi, top_lo, finite, _, _, best_lag = state
    for c in range(best_abs.shape[0]):
        unsure = worst[c] < 2.0
        finite[c] = min(any_finite[c], 1.0)
        top_hi[c] = 1.0 if unsure else max(hi[c], 0.0)
        top_lo[c] = lo[c]
        b = best_abs[c]
        certain = (not unsure) & (b >= 0.0) & (b - best_delta[c] - 2.0**-23 > others[c])
        best_lag[c] = first_lag + np.int64(best_slot[c]) if certain else 0
        t_hat[c] = best_p[c]


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _squares_at_best_lags(squares, n_terms, leaders, col0, best_lag, out):  # pragma: no cover
    """``Q̂[g, c] = Σ_t Z²[t, leaders[g]]·Z²[t + ℓ, col0 + c]`` at each pair's best lag
    ``ℓ = best_lag[g, c]`` (lag 1 where there is none: unused), from ``squares`` (N rows of
    ``Z²`` rounded to float32, zero after the window's ``n_terms`` rows, so every pair sums the
    same ``n_terms`` terms): float32 dot products of ``Q_TERMS`` terms, each summed in whatever
    order vectorises (``reassoc``: the bound of the ``sweep`` module docstring holds for any
    order), added in float64. Four laggers at a time share each load of the leader's row, and
    their rows stay in the first-level cache across the group's leaders."""
    last = out.shape[1] - 1
    for c in range(0, last + 1, 4):
        c1, c2, c3 = min(c + 1, last), min(c + 2, last), min(c + 3, last)
        y0, y1, y2, y3 = (
            squares[col0 + c],
            squares[col0 + c1],
            squares[col0 + c2],
            squares[col0 + c3],
        )
        for g in range(leaders.size):
            x = squares[leaders[g]]
            b0 = y0[max(best_lag[g, c], 1) :]  # (slices: no index wraps around, so it vectorises)
            b1 = y1[max(best_lag[g, c1], 1) :]
            b2 = y2[max(best_lag[g, c2], 1) :]
            b3 = y3[max(best_lag[g, c3], 1) :]
            q0 = q1 = q2 = q3 = 0.0
            for t0 in range(0, n_terms, Q_TERMS):
                t1 = min(t0 + Q_TERMS, n_terms)
                a, x0, x1, x2, x3 = x[t0:t1], b0[t0:t1], b1[t0:t1], b2[t0:t1], b3[t0:t1]
                p0 = p1 = p2 = p3 = np.float32(0.0)
                for t in range(a.shape[0]):
                    v = a[t]
                    p0 += v * x0[t]
                    p1 += v * x1[t]
                    p2 += v * x2[t]
                    p3 += v * x3[t]
                q0 += np.float64(p0)
                q1 += np.float64(p1)
                q2 += np.float64(p2)
                q3 += np.float64(p3)
            out[g, c3] = q3  # (from the last: a repeated lagger keeps its own slot's value)
            out[g, c2] = q2
            out[g, c1] = q1
            out[g, c] = q0


@njit(cache=True, nogil=True, error_model="numpy")
def _statistic(g_i, root_y, gamma_q, eta, best_lag, p_best, q_best):  # pragma: no cover - compiled
    """The robust statistic ``t̂ = P / sqrt(Q)`` at each pair's best lag and its bound ``Δ``
    (``sweep`` module docstring), in place of ``P`` (``p_best``) and ``Q`` (``q_best``);
    ``t̂ = 0``, ``Δ = ∞`` where the lag is not certain (``best_lag`` 0) or ``Q`` too small to
    bound. Branch-free, so that it vectorises."""
    for c in range(p_best.shape[0]):
        p = p_best[c]
        q = q_best[c]
        q_lo = (q - eta) / (1.0 + gamma_q)
        q_hi = (q + eta) / (1.0 - gamma_q)
        t = p / math.sqrt(max(q, 1e-300))
        bound = (
            (g_i * root_y[c] + abs(p)) / math.sqrt(max(q_lo, 1e-300))
            - abs(p) / math.sqrt(max(q_hi, 1e-300))
            + 2.0**-48 * abs(t)
        )
        usable = (best_lag[c] > 0) & (q_lo > 0.0)
        p_best[c] = t if usable else 0.0
        q_best[c] = bound if usable else np.inf


@njit(cache=True, nogil=True, error_model="numpy")
def _write_bounds(out_row, col0, first_lag, state, outputs):  # pragma: no cover - compiled
    """The improvement bounds of one leader's pairs with the laggers ``col0 ..`` (module
    docstring) into row ``out_row`` of ``upper`` and ``lower``, in loops of few arrays each;
    ``outputs`` as :func:`sweep_tile`'s."""
    t_hat, spread, top_hi, top_lo, finite, sync_lo, sync_hi = state[:7]
    upper, lower, sync_block, given_sync, min_improvement, bin_limit = outputs
    width = sync_lo.shape[0]
    out_upper = upper[out_row, col0 : col0 + width]
    out_lower = lower[out_row, col0 : col0 + width]
    if given_sync:  # corr's, exact
        given = sync_block[out_row, col0 : col0 + width]
        for c in range(width):
            value = abs(given[c])
            value = np.float32(0.0) if math.isnan(value) else value
            sync_lo[c] = value
            sync_hi[c] = value
    elif first_lag == 0:  # lag 0's bounds, rounded outward to float32
        for c in range(width):
            sync_lo[c] = np.float32(max(sync_lo[c] * (1.0 - 2.0**-23), 0.0))
            sync_hi[c] = np.float32(min(sync_hi[c] * (1.0 + 2.0**-23), 1.0))
    else:
        sync_lo[:] = 0.0
        sync_hi[:] = 1.0
    for c in range(width):
        out_upper[c] = np.float32(min(top_hi[c] * (1.0 + 2.0**-23), 1.0)) - np.float32(sync_lo[c])
        low = np.float32(max(top_lo[c] * (1.0 - 2.0**-23), 0.0)) - np.float32(sync_hi[c])
        out_lower[c] = low if top_lo[c] > -np.inf else np.float32(-np.inf)
    if bin_limit < N_BINS:  # the q-value condition, where the statistic's bound decides it
        for c in range(width):
            z_hat = abs(t_hat[c])
            sure = spread[c] < np.inf
            failing = sure & (_bin_of(z_hat + spread[c]) > bin_limit)
            passing = sure & (_bin_of(max(z_hat - spread[c], 0.0)) <= bin_limit)
            out_upper[c] = np.float32(-np.inf) if failing else out_upper[c]
            out_lower[c] = out_lower[c] if passing else np.float32(-np.inf)
    for c in range(width):
        real = finite[c] > 0.0
        out_upper[c] = out_upper[c] if real & (out_upper[c] > min_improvement) else -np.inf
        out_lower[c] = out_lower[c] if real & (out_lower[c] > min_improvement) else -np.inf


@njit(cache=True, nogil=True, error_model="numpy")
def _row_lags(products, r, i, col0, first_lag, inputs, lagged, state):  # pragma: no cover
    """Leader ``i`` (the tile's row ``r``) with the laggers ``col0 ..``: each lag's ``P`` (the
    float64 sum of the row chunks' float32 products), overlap sums and ``|r̂| ± δ``, folded into
    the choice of the best lag (:func:`_choose`, into ``state``); ``inputs`` = (data, window,
    laggers, root_y, f_overlap, tau); ``lagged`` = (partial, lagger_gaps, g_i) and the buffers
    (sums, p_lag, run) of :func:`_workspace`."""
    data, window, laggers, root_y, f_overlap, tau = inputs
    partial, lagger_gaps, g_i, sums, p_lag, run = lagged
    n_chunks, n_slots, _, width = products.shape
    _start_choice(1 - first_lag, run)
    for s in range(n_slots):
        for c in range(width):
            p_lag[c] = np.float64(products[0, s, r, c])
        for k in range(1, n_chunks):
            for c in range(width):
                p_lag[c] += np.float64(products[k, s, r, c])
        _overlap_sums(i, first_lag + s, col0, data, window, laggers, partial, lagger_gaps, sums)
        if first_lag + s == 0:
            _sync_bounds(sums, p_lag, g_i, root_y, f_overlap, tau, state[5], state[6])
        else:
            _fold_lag(sums, p_lag, g_i, root_y, f_overlap, tau, np.float64(s), run)
    _choose(first_lag, run, state)


@njit(cache=True, nogil=True, error_model="numpy")
def _row_bins(t_hat, spread, finite, self_c, log_eps, bins, low):  # pragma: no cover - compiled
    """Per lagger of one leader: the bin its pair is counted in (−1: deferred, −2: none, for
    ``i = j`` or without a finite lag) and the smallest bin its p-value could be in
    (``N_BINS`` unless counted); branch-free, so that it vectorises."""
    for c in range(t_hat.shape[0]):
        z_hat = abs(t_hat[c])
        d = spread[c]
        counted = (d * (z_hat + d + 1.0) <= log_eps) & (finite[c] > 0.0)
        bins[c] = _bin_of(z_hat) if counted else (-1 if finite[c] > 0.0 else -2)
        low[c] = _bin_of(z_hat + d) if counted else N_BINS
    if self_c >= 0:
        bins[self_c] = -2
        low[self_c] = N_BINS


@njit(cache=True, nogil=True, error_model="numpy")
def _count_row(
    i, col0, bins, best_lag, histogram, spills, deferred, counted
):  # pragma: no cover - compiled
    """Count one leader's pairs (:func:`_row_bins`) into the byte histogram, its spills and the
    deferred pairs ``(leader, lagger, lag)``; ``counted`` = (spills, deferred) so far, returned
    updated."""
    n_spills, n_deferred = counted
    for c in range(bins.shape[0]):
        b = bins[c]
        if b >= 0:
            held = histogram[b] + 1
            if held == 256:
                spills[n_spills] = b
                n_spills += 1
                held = 0
            histogram[b] = held
        elif b == -1:
            deferred[n_deferred, 0] = i
            deferred[n_deferred, 1] = col0 + c
            deferred[n_deferred, 2] = best_lag[c]
            n_deferred += 1
    return n_spills, n_deferred


@njit(cache=True, nogil=True, error_model="numpy")
def sweep_tile(
    products, squares, tile, window, data, laggers, params, counting, outputs
):  # pragma: no cover - compiled
    """The pairs of one tile of leaders and one chunk of laggers (``sweep`` module docstring),
    in groups of :data:`GROUP_ROWS` leaders: each leader's lags and best lag, then the group's
    ``Q`` at the best lags (:func:`_squares_at_best_lags`), then each leader's statistics,
    counts and bounds.

    ``products[k, s, r, c]``: row chunk ``k``'s float32 ``P`` of lag ``first_lag + s`` for the
    tile's row ``r`` and lagger ``col0 + c``; ``squares``: the window's ``Z²`` rounded to
    float32, N × (T + max_lag), zero after row T.
    ``tile`` = (leaders, rows, col0, first_lag, min_overlap, tau): the tile's leader indices
    and, per tile row, its row in the bounds (−1: not swept); ``window`` = (z, prefix,
    prefix_sq, roots), time-major, ``roots`` the columns' ``sqrt(S)``; ``laggers``:
    :func:`lagger_sums`; ``params`` = (G, γ_Q, η, ln(1 + EPSILON)); ``counting`` = (count,
    histogram, spills, deferred, activity, low_bins, record): whether to count, the thread's
    byte histogram, room for its spills and deferred pairs (``(leader, lagger, lag)``, the lag
    0 unless certain; one per pair at most), whether to keep each row's smallest possible bin
    in ``low_bins``, each pair's counted bin (−1: deferred) when ``record`` is not empty;
    ``outputs`` = (upper, lower, sync_block, given_sync, min_improvement, bin_limit), the
    bounds (empty arrays: none; ``given_sync``: ``sync_block`` holds ``corr``). Returns
    ``(spills, deferred)`` written."""
    leaders, rows, col0, first_lag, min_overlap, tau = tile
    roots = window[3]
    gap_ptr, gap_rows, lo, hi = data[6], data[7], data[8], data[9]
    big_g, gamma_q, eta, log_eps = params
    count, histogram, spills, deferred, activity, low_bins, record = counting
    upper, lower = outputs[0], outputs[1]
    recording = record.shape[0] > 0
    bounding = upper.shape[0] > 0
    counted = (0, 0)
    width = products.shape[3]
    n_rows = window[0].shape[0]
    sums, p_lag, run, group, bins, low = _workspace(width)
    root_y = roots[col0 : col0 + width]
    partial = np.flatnonzero((lo[col0 : col0 + width] != 0) | (hi[col0 : col0 + width] != n_rows))
    lagger_gaps = _lagger_gaps(gap_ptr[col0 : col0 + width + 1], gap_rows)
    inputs = (data, window, laggers, root_y, np.float64(min_overlap), tau)
    for g0 in range(0, leaders.size, GROUP_ROWS):
        g1 = min(g0 + GROUP_ROWS, leaders.size)
        for r in range(g0, g1):
            state = _state_row(group, r - g0)
            if rows[r] < 0:
                state[4][:] = 0.0
                state[7][:] = 0
                continue
            i = leaders[r]
            g_i = big_g * roots[i]
            lagged = (partial, lagger_gaps, g_i, sums, p_lag, run)
            _row_lags(products, r, i, col0, first_lag, inputs, lagged, state)
        _squares_at_best_lags(squares, n_rows, leaders[g0:g1], col0, group[7], group[1])
        for r in range(g0, g1):
            out_row = rows[r]
            if out_row < 0:
                continue
            i = leaders[r]
            state = _state_row(group, r - g0)
            t_hat, spread, finite, best_lag = state[0], state[1], state[4], state[7]
            _statistic(big_g * roots[i], root_y, gamma_q, eta, best_lag, t_hat, spread)
            self_c = i - col0 if col0 <= i < col0 + width else -1
            if count or activity or recording:
                _row_bins(t_hat, spread, finite, self_c, log_eps, bins, low)
                if count:
                    counted = _count_row(
                        i, col0, bins, best_lag, histogram, spills, deferred, counted
                    )
                if recording:
                    for c in range(width):
                        if bins[c] != -2:
                            record[i, col0 + c] = bins[c]
                if activity:
                    low_bins[r] = min(low_bins[r], low.min())
            if bounding:
                _write_bounds(out_row, col0, first_lag, state, outputs)
                if self_c >= 0:
                    upper[out_row, i] = -np.inf
                    lower[out_row, i] = -np.inf
    return counted


@njit(cache=True, nogil=True)
def _workspace(width):  # pragma: no cover - compiled
    """The buffers of :func:`sweep_tile` for ``width`` laggers: the overlap sums (one lag's),
    ``P`` (one lag's), the running choice of :func:`_fold_lag`, the group's per-pair state (its
    leaders' :func:`_state_row`), and a leader's bins and smallest bins (:func:`_row_bins`)."""
    run = (
        np.empty(width),  # the best |r̂| so far (−1: none)
        np.empty(width),  # its δ
        np.empty(width),  # P there
        np.empty(width),  # its slot
        np.empty(width),  # the largest |r̂| + δ of the other lags
        np.empty(width),  # the largest |r̂| + δ
        np.empty(width),  # the largest |r̂| − δ
        np.empty(width),  # the smallest kind of the finite lags
        np.empty(width),  # the largest kind
    )
    group = (
        np.empty((GROUP_ROWS, width)),  # t̂ (P at the best lag until _statistic)
        np.empty((GROUP_ROWS, width)),  # Δ (Q at the best lag until _statistic)
        np.empty((GROUP_ROWS, width)),  # the largest |r̂| + δ
        np.empty((GROUP_ROWS, width)),  # the largest |r̂| − δ
        np.empty((GROUP_ROWS, width)),  # a lag is finite (1, 0)
        np.empty((GROUP_ROWS, width)),  # bounds of |sync| from lag 0
        np.empty((GROUP_ROWS, width)),
        np.empty((GROUP_ROWS, width), dtype=np.int64),  # the best lag when certain, else 0
    )
    bins = np.empty(width, dtype=np.int64)
    low = np.empty(width, dtype=np.int64)
    return np.empty((7, width)), np.empty(width), run, group, bins, low


@njit(cache=True, nogil=True)
def _lagger_gaps(gap_ptr, gap_rows):  # pragma: no cover - compiled
    """``(c, row)`` of each row where lagger ``c`` (of the laggers of ``gap_ptr``, the CSR
    pointers from the first) is missing inside its interval, each lagger's rows ascending."""
    first = gap_ptr[0]
    out = np.empty((gap_ptr[-1] - first, 2), dtype=np.int64)
    for c in range(gap_ptr.size - 1):
        for k in range(gap_ptr[c], gap_ptr[c + 1]):
            out[k - first, 0] = c
            out[k - first, 1] = gap_rows[k]
    return out


@njit(cache=True, nogil=True, inline="always")
def _state_row(group, g):  # pragma: no cover - compiled
    """Leader ``g`` of the group's per-pair state: (t_hat, spread, top_hi, top_lo, finite,
    sync_lo, sync_hi, best_lag)."""
    return (
        group[0][g],
        group[1][g],
        group[2][g],
        group[3][g],
        group[4][g],
        group[5][g],
        group[6][g],
        group[7][g],
    )
