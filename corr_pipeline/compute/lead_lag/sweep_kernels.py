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
    floats): the rows of ``sums`` are (sx, sy, sxx, syy, base_x, base_y, n)."""
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


@njit(cache=True, nogil=True, error_model="numpy")
def _lag_values(
    sums, p_lag, g_i, root_y, f_overlap, tau, magnitude, delta, kind
):  # pragma: no cover - compiled
    """One lag's ``|r̂|`` (−1 unless the lag is finite and takes no fallback) and its bound
    ``δ`` for every lagger (module docstring), and ``kind``: 0 when the lag does not reach
    ``min_overlap``, 1 when it does but a variance takes the float64 fallback, 2 otherwise;
    branch-free, so that it vectorises."""
    for c in range(p_lag.shape[0]):
        n = sums[6, c]
        inv_n = 1.0 / max(n, 1.0)
        var_x = sums[2, c] - sums[0, c] * sums[0, c] * inv_n
        var_y = sums[3, c] - sums[1, c] * sums[1, c] * inv_n
        inv = 1.0 / math.sqrt(max(var_x * var_y, 1e-300))
        value = min(1.0, max(-1.0, (p_lag[c] - sums[0, c] * sums[1, c] * inv_n) * inv))
        has = n >= f_overlap
        fine = has & (var_x > tau * sums[4, c]) & (var_y > tau * sums[5, c])
        magnitude[c] = abs(value) if fine else -1.0
        delta[c] = g_i * root_y[c] * inv + 2.0**-48
        kind[c] = 2.0 if fine else (1.0 if has else 0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def _choose(
    i, col0, first_lag, lags, p_all, squares_t, g_i, root_y, params, state
):  # pragma: no cover - compiled
    """Per pair (one scalar loop, the lags inside): the synchronous bounds from lag 0 (when
    swept), the best lag's certainty, the robust statistic ``t̂`` there and its bound ``Δ``
    (module docstring of ``sweep``; ``Δ = ∞``, ``t̂ = 0`` when the lag is not certain or ``Q``
    too small to bound; ``Q`` from :func:`_squares_at_best_lag`), and for the bounds the largest ``|r̂| ± δ`` over the lags (1 for the
    upper one when a lag takes the fallback), whether a lag is finite, and the best lag when
    it is certain (else 0). ``lags`` = the per-slot (magnitude, delta, kind) arrays of
    :func:`_lag_values`;
    ``state`` = (t_hat, spread, top_hi, top_lo, finite, sync_lo, sync_hi, best_lag)."""
    magnitude, delta, kind = lags
    gamma_q, eta = params
    t_hat, spread, top_hi, top_lo, finite, sync_lo, sync_hi, best_lag = state
    n_slots = magnitude.shape[0]
    first = 1 - first_lag  # the slot of lag 1
    if first_lag == 0:
        for c in range(magnitude.shape[1]):
            m0 = magnitude[0, c]
            sync_lo[c] = max(m0 - delta[0, c], 0.0) if m0 >= 0.0 else 0.0
            sync_hi[c] = min(m0 + delta[0, c], 1.0) if m0 >= 0.0 else min(kind[0, c], 1.0)
    for c in range(magnitude.shape[1]):
        best = first
        best_abs = -1.0
        best_delta = 0.0
        others = -np.inf
        hi = -np.inf
        lo = -np.inf
        worst = 2.0  # the smallest kind over the finite lags: 1 when one takes the fallback
        any_finite = 0.0
        for s in range(first, n_slots):  # branch-free: selects, no jumps on the data
            k = kind[s, c]
            any_finite = max(any_finite, k)
            worst = min(worst, k) if k > 0.0 else worst
            m = magnitude[s, c]
            d = delta[s, c]
            ok = m >= 0.0
            better = m > best_abs
            others = max(others, best_abs + best_delta if better else m + d)
            hi = max(hi, m + d) if ok else hi
            lo = max(lo, m - d) if ok else lo
            best = s if better else best
            best_delta = d if better else best_delta
            best_abs = m if better else best_abs
        unsure = worst < 2.0
        any_finite = min(any_finite, 1.0)
        finite[c] = any_finite
        top_hi[c] = 1.0 if unsure else max(hi, 0.0)
        top_lo[c] = lo
        lag = first_lag + best
        certain = (not unsure) & (best_abs >= 0.0) & (best_abs - best_delta - 2.0**-23 > others)
        best_lag[c] = lag if certain else 0
        t_hat[c] = p_all[best, c]  # P at the best lag, for _statistic
    _squares_at_best_lag(squares_t, i, col0, best_lag, spread)
    _statistic(g_i, root_y, gamma_q, eta, best_lag, t_hat, spread)


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _squares_at_best_lag(squares_t, i, col0, best_lag, out):  # pragma: no cover - compiled
    """``Q̂ = Σ_t Z²[t, i]·Z²[t + ℓ, j]`` at each certain best lag ``ℓ`` (0 where there is
    none): float32 dot products of ``Q_TERMS`` terms, each summed in whatever order
    vectorises (``reassoc``: the bound of the ``sweep`` module docstring holds for any order),
    added in float64."""
    n_rows = squares_t.shape[1]
    for c in range(out.shape[0]):
        lag = max(best_lag[c], 0)
        leader = squares_t[i, : n_rows - lag]
        lagger = squares_t[col0 + c, lag:]  # (slices: no index wraps around, so it vectorises)
        total = 0.0
        for t0 in range(0, leader.shape[0] if lag > 0 else 0, Q_TERMS):
            a = leader[t0 : t0 + Q_TERMS]
            b = lagger[t0 : t0 + Q_TERMS]
            part = np.float32(0.0)
            for t in range(a.shape[0]):
                part += a[t] * b[t]
            total += np.float64(part)
        out[c] = total


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
def _write_bounds(
    out_row,
    col0,
    first_lag,
    given_sync,
    sync_block,
    state,
    min_improvement,
    bin_limit,
    upper,
    lower,
):  # pragma: no cover - compiled
    """The improvement bounds of one leader's pairs with the laggers ``col0 ..`` (module
    docstring) into row ``out_row`` of ``upper`` and ``lower``, in loops of few arrays each."""
    t_hat, spread, top_hi, top_lo, finite, sync_lo, sync_hi = state[:7]
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
def sweep_tile(
    products, squares_t, tile, window, data, laggers, params, counting, outputs
):  # pragma: no cover - compiled
    """The pairs of one tile of leaders and one chunk of laggers (``sweep`` module docstring).

    ``products[k, s, r, c]``: row chunk ``k``'s float32 ``P`` of lag ``first_lag + s`` for the
    tile's row ``r`` and lagger ``col0 + c``; ``squares_t``: the window's ``Z²`` rounded to
    float32, N × T.
    ``tile`` = (leaders, rows, col0, first_lag, min_overlap, tau): the tile's leader indices
    and, per tile row, its row in the bounds (−1: not swept); ``window`` = (z, prefix,
    prefix_sq, roots), time-major, ``roots`` the columns' ``sqrt(S)``; ``laggers``: :func:`lagger_sums`;
    ``params`` = (G, γ_Q, η, ln(1 + EPSILON)); ``counting`` = (count, histogram, spills,
    deferred, activity, low_bins, record): whether to count, the thread's byte histogram, room
    for its spills and deferred pairs (``(leader, lagger, lag)``, the lag 0 unless certain; one
    per pair at most), whether to keep each row's
    smallest possible bin in ``low_bins``, each pair's counted bin (−1: deferred) when
    ``record`` is not empty; ``outputs`` = (upper, lower, sync_block, given_sync,
    min_improvement, bin_limit), the bounds (empty arrays: none; ``given_sync``:
    ``sync_block`` holds ``corr``). Returns ``(spills, deferred)`` written."""
    leaders, rows, col0, first_lag, min_overlap, tau = tile
    roots = window[3]
    gap_ptr, gap_rows, lo, hi = data[6], data[7], data[8], data[9]
    big_g, gamma_q, eta, log_eps = params
    count, histogram, spills, deferred, activity, low_bins, record = counting
    upper, lower, sync_block, given_sync, min_improvement, bin_limit = outputs
    recording = record.shape[0] > 0
    bounding = upper.shape[0] > 0
    n_spills = 0
    n_deferred = 0
    n_chunks, n_slots, _, width = products.shape
    n_rows = window[0].shape[0]
    sums = np.empty((7, width))
    p_all = np.empty((n_slots, width))
    lags = (
        np.empty((n_slots, width)),  # |r̂|, −1 unless finite and without fallback
        np.empty((n_slots, width)),  # δ
        np.empty((n_slots, width)),  # 0: below min_overlap, 1: a fallback, 2: fine
    )
    state = (
        np.empty(width),  # t̂
        np.empty(width),  # Δ
        np.empty(width),  # the largest |r̂| + δ
        np.empty(width),  # the largest |r̂| − δ
        np.empty(width),  # a lag is finite (1, 0)
        np.empty(width),  # bounds of |sync| from lag 0
        np.empty(width),
        np.empty(width, dtype=np.int64),  # the best lag when certain, else 0
    )
    t_hat, spread, finite = state[0], state[1], state[4]
    root_y = roots[col0 : col0 + width]
    partial = np.flatnonzero((lo[col0 : col0 + width] != 0) | (hi[col0 : col0 + width] != n_rows))
    lagger_gaps = np.empty((gap_ptr[col0 + width] - gap_ptr[col0], 2), dtype=np.int64)
    for c in range(width):  # (c, row) of each row where a lagger is missing inside its interval
        for k in range(gap_ptr[col0 + c], gap_ptr[col0 + c + 1]):
            lagger_gaps[k - gap_ptr[col0], 0] = c
            lagger_gaps[k - gap_ptr[col0], 1] = gap_rows[k]
    f_overlap = np.float64(min_overlap)
    for r in range(leaders.size):
        out_row = rows[r]
        if out_row < 0:
            continue
        i = leaders[r]
        g_i = big_g * roots[i]
        for s in range(n_slots):
            p_lag = p_all[s]
            for c in range(width):
                p_lag[c] = np.float64(products[0, s, r, c])
            for k in range(1, n_chunks):
                for c in range(width):
                    p_lag[c] += np.float64(products[k, s, r, c])
            _overlap_sums(i, first_lag + s, col0, data, window, laggers, partial, lagger_gaps, sums)
            _lag_values(
                sums,
                p_lag,
                g_i,
                root_y,
                f_overlap,
                tau,
                lags[0][s],
                lags[1][s],
                lags[2][s],
            )
        _choose(i, col0, first_lag, lags, p_all, squares_t, g_i, root_y, (gamma_q, eta), state)
        self_c = i - col0 if col0 <= i < col0 + width else -1
        if count or activity or recording:
            for c in range(width):
                if c == self_c or finite[c] == 0.0:
                    continue
                z_hat = abs(t_hat[c])
                counted = spread[c] * (z_hat + spread[c] + 1.0) <= log_eps
                if count:
                    if counted:
                        b = _bin_of(z_hat)
                        held = histogram[b] + 1
                        if held == 256:
                            spills[n_spills] = b
                            n_spills += 1
                            held = 0
                        histogram[b] = held
                    else:
                        deferred[n_deferred, 0] = i
                        deferred[n_deferred, 1] = col0 + c
                        deferred[n_deferred, 2] = state[7][c]
                        n_deferred += 1
                if recording:
                    record[i, col0 + c] = _bin_of(z_hat) if counted else -1
                if activity and counted:
                    low_bins[r] = min(low_bins[r], _bin_of(z_hat + spread[c]))
        if bounding:
            _write_bounds(
                out_row,
                col0,
                first_lag,
                given_sync,
                sync_block,
                state,
                min_improvement,
                bin_limit,
                upper,
                lower,
            )
            if self_c >= 0:
                upper[out_row, i] = -np.inf
                lower[out_row, i] = -np.inf
    return n_spills, n_deferred
