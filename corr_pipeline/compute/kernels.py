"""Fused per-pair kernels (numba): the elementwise half of the correlation.

For rows ``i`` of side A and columns ``j`` of side B (see ``standardize.Side``)
with standardized, zero-filled ``Z_A``, ``Z_B`` and presence masks ``M_A``,
``M_B``, the pairwise-complete Pearson correlation over the overlap
``O_ij = {t : M_A[t, i] = M_B[t, j] = 1}`` is

    n   = |O_ij|
    Sx  = Σ_O Z_A[t, i]      Sxx = Σ_O Z_A[t, i]²
    Sy  = Σ_O Z_B[t, j]      Syy = Σ_O Z_B[t, j]²      Sxy = Σ_t Z_A[t, i] Z_B[t, j]
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n) · (Syy − Sy²/n))

``Sxy`` needs no mask (zeros outside the overlap contribute nothing): it is the
one big matrix product. The overlap-restricted sums come

* for a dense-gap column ``j`` (listing/delisting) from products with its
  mask: ``Sx = (Z_Aᵀ M_B)_ij``, ``Sxx = (Z_A²ᵀ M_B)_ij``, ``n = (M_Aᵀ M_B)_ij``;
* for any other ``j`` by removing its few gap rows from the column totals:
  ``Sx = s_i − Σ_{t ∈ gaps_j} Z_A[t, i]`` (likewise ``Sxx`` from ``q_i`` and
  ``n`` from ``n_i``),

and symmetrically for ``Sy``, ``Syy`` with the roles of ``i`` and ``j`` swapped.

Exactness guard: when a variance ``Sxx − Sx²/n`` is at most ``tau`` times the
sum it was taken from, float32 cancellation could cost digits (and a truly
constant overlap would not come out as exactly 0), so that pair is
recomputed exactly from the raw returns in float64 (two-pass, with zero
variance decided by equality of all values, as pandas' Welford recurrence
does). Such pairs are rare (near-constant overlaps); the guard makes the fast
formula exact to float32 rounding everywhere else.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

FALLBACK_TAU = 1.0 / 16.0
"""Recompute a pair exactly when a variance is below tau × its source sum (see module docstring)."""

MODE_WRITE = 0
MODE_BEST_LAG = 1


@njit(cache=True, nogil=True)
def exact_pair_correlation(x, y, min_overlap):  # pragma: no cover - compiled
    """Pearson correlation of x and y over rows where both are finite, float64 two-pass.

    NaN if fewer than ``min_overlap`` such rows or if either series is constant there.
    """
    count = 0
    sum_x = 0.0
    sum_y = 0.0
    first_x = 0.0
    first_y = 0.0
    x_varies = False
    y_varies = False
    for t in range(x.shape[0]):
        xt = np.float64(x[t])
        yt = np.float64(y[t])
        if math.isfinite(xt) and math.isfinite(yt):
            if count == 0:
                first_x = xt
                first_y = yt
            else:
                x_varies = x_varies or xt != first_x
                y_varies = y_varies or yt != first_y
            count += 1
            sum_x += xt
            sum_y += yt
    if count < min_overlap or count < 2 or not x_varies or not y_varies:
        return np.nan
    mean_x = sum_x / count
    mean_y = sum_y / count
    sxx = 0.0
    syy = 0.0
    sxy = 0.0
    for t in range(x.shape[0]):
        xt = np.float64(x[t])
        yt = np.float64(y[t])
        if math.isfinite(xt) and math.isfinite(yt):
            dx = xt - mean_x
            dy = yt - mean_y
            sxx += dx * dx
            syy += dy * dy
            sxy += dx * dy
    value = sxy / math.sqrt(sxx * syy)
    return min(1.0, max(-1.0, value))


@njit(parallel=True, cache=True)
def correlate_tile(  # pragma: no cover - compiled
    mode,
    symmetric,
    tile_row0,
    row_lo,
    row_hi,
    col0,
    min_overlap,
    tau,
    sxy,
    x_sum,
    x_sq,
    x_count,
    b_dense_local,
    y_sum,
    y_sq,
    a_dense_local,
    a_z_t,
    a_present_t,
    a_raw_t,
    a_sum,
    a_sq_sum,
    a_count,
    a_gap_ptr,
    a_gap_rows,
    b_z,
    b_z_sq,
    b_raw_t,
    b_sum,
    b_sq_sum,
    b_gap_ptr,
    b_gap_rows,
    out_row0,
    out_col0,
    out_corr,
    out_overlap,
    lag,
    best_abs,
    best_corr,
    best_lag,
    best_overlap,
):
    """Finish the correlation of rows ``[row_lo, row_hi)`` (global A columns) of one tile.

    Products for the tile (rows from ``tile_row0``, columns from ``col0``):
    ``sxy``, the dense-column sums ``x_*`` (indexed by ``b_dense_local``) and the
    dense-row sums ``y_*`` (indexed by ``a_dense_local``). ``symmetric`` keeps
    only ``j >= i``.

    MODE_WRITE: ``out_corr[i − out_row0, j − out_col0]`` and ``out_overlap``.
    MODE_BEST_LAG: for ``j != i`` keep, in ``best_*[i − out_row0, j]``, the lag
    with the largest finite |corr| (strictly larger, so ties keep the smaller lag).
    """
    width = sxy.shape[1]
    for r in prange(row_hi - row_lo):
        i = row_lo + r
        ti = i - tile_row0
        c_start = i - col0 if symmetric else 0
        sum_y = np.empty(width)
        sq_y = np.empty(width)
        y_pos = a_dense_local[ti]
        if y_pos >= 0:
            for c in range(c_start, width):
                sum_y[c] = y_sum[y_pos, c]
                sq_y[c] = y_sq[y_pos, c]
        else:
            for c in range(c_start, width):
                sum_y[c] = b_sum[col0 + c]
                sq_y[c] = b_sq_sum[col0 + c]
            for k in range(a_gap_ptr[i], a_gap_ptr[i + 1]):
                t = a_gap_rows[k]
                for c in range(c_start, width):
                    sum_y[c] -= b_z[t, col0 + c]
                    sq_y[c] -= b_z_sq[t, col0 + c]
        for c in range(c_start, width):
            j = col0 + c
            if mode == MODE_BEST_LAG and j == i:
                continue
            x_pos = b_dense_local[c]
            if x_pos >= 0:
                sx = np.float64(x_sum[ti, x_pos])
                sxx = np.float64(x_sq[ti, x_pos])
                count = np.int64(x_count[ti, x_pos])
                base_x = sxx
            else:
                sx = a_sum[i]
                sxx = a_sq_sum[i]
                count = a_count[i]
                base_x = a_sq_sum[i]
                for k in range(b_gap_ptr[j], b_gap_ptr[j + 1]):
                    t = b_gap_rows[k]
                    v = np.float64(a_z_t[i, t])
                    sx -= v
                    sxx -= v * v
                    count -= a_present_t[i, t]
            base_y = sq_y[c] if y_pos >= 0 else b_sq_sum[j]
            if symmetric and j == i:
                value = 1.0 if (count >= min_overlap and a_sq_sum[i] > 0.0) else np.nan
            elif count < min_overlap:
                value = np.nan
            else:
                sy = sum_y[c]
                var_x = sxx - sx * sx / count
                var_y = sq_y[c] - sy * sy / count
                if var_x <= tau * base_x or var_y <= tau * base_y:
                    value = exact_pair_correlation(a_raw_t[i], b_raw_t[j], min_overlap)
                else:
                    value = (np.float64(sxy[ti, c]) - sx * sy / count) / math.sqrt(var_x * var_y)
                    value = min(1.0, max(-1.0, value))
            if mode == MODE_WRITE:
                out_corr[i - out_row0, j - out_col0] = value
                out_overlap[i - out_row0, j - out_col0] = count
            else:
                magnitude = abs(np.float32(value))
                row = i - out_row0
                if magnitude > best_abs[row, j]:
                    best_abs[row, j] = magnitude
                    best_corr[row, j] = value
                    best_lag[row, j] = lag
                    best_overlap[row, j] = count
