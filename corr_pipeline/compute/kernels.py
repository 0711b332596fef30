"""Fused per-pair kernels (numba): the elementwise half of the correlation.

For column ``i`` of side A and column ``j`` of side B (see ``standardize``),
aligned row by row (local row ``t`` is window row ``a0 + t`` in A and
``b0 + t`` in B), the pairwise-complete Pearson correlation over the overlap
``O_ij = {t : both finite}`` is

    n   = |O_ij|
    Sx  = Σ_O Z[a0+t, i]     Sxx = Σ_O Z[a0+t, i]²
    Sy  = Σ_O Z[b0+t, j]     Syy = Σ_O Z[b0+t, j]²      Sxy = Σ_t Z[a0+t, i] Z[b0+t, j]
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n) · (Syy − Sy²/n))
         = (n·Sxy − Sx·Sy) / sqrt((n·Sxx − Sx²) · (n·Syy − Sy²))     (computed so, in float64:
                                                                   one division, one root)

``Sxy`` needs no mask (zeros outside the overlap add nothing): it is the one
matrix product per tile. Because ``Z`` is zero wherever ``i`` is missing, the
overlap sums of ``i`` only have to leave out the rows where ``j`` is missing,
which are the rows outside ``j``'s presence interval ``[lo_j, hi_j)`` and its
few interior gaps ``g_j``:

    Sx  = PZ[a0+hi_j, i] − PZ[a0+lo_j, i] − Σ_{t ∈ g_j} Z[a0+t, i]
    Sxx = (same with PZ2 and Z²)          n = (same with PM and the presence of i)

and ``Sy``, ``Syy`` likewise with the roles of ``i`` and ``j`` swapped. Listings
and delistings therefore cost O(1) per pair; a halt costs one subtraction.

Exactness guard: when a variance ``Sxx − Sx²/n`` is at most ``tau`` times the
interval sum it came from (tested as ``n·Sxx − Sx² <= n · tau · sum``), float cancellation could cost digits (and a truly
constant overlap would not come out as exactly 0), so that pair is
recomputed exactly from the raw returns in float64 (two-pass, with zero
variance decided by equality of all values, as pandas' Welford recurrence
does). Such pairs are rare (near-constant overlaps); the guard keeps the fast
formula within float32 rounding everywhere else.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from corr_pipeline.compute.intrinsics import transpose_block8

FALLBACK_TAU = 1.0 / 16.0
"""Recompute a pair exactly when a variance is below tau × its source sum (see module docstring)."""

CHUNK = 512
"""Columns per inner pass: the per-row buffers stay in L1 cache."""


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


@njit(cache=True, nogil=True)
def correlate_tile(  # pragma: no cover - compiled
    symmetric,
    min_overlap,
    tau,
    sxy,
    tile_row0,
    col0,
    row_lo,
    row_hi,
    z,
    z_t,
    present_t,
    raw_t,
    prefix,
    prefix_sq,
    prefix_t,
    prefix_sq_t,
    prefix_count_t,
    a0,
    a_lo,
    a_hi,
    a_gap_ptr,
    a_gap_rows,
    b0,
    b_lo,
    b_hi,
    b_gap_ptr,
    b_gap_rows,
    b_gap_cols,
    b_partial_ptr,
    b_partial_cols,
    b_total,
    b_total_sq,
    n_rows,
    out_row0,
    out_col0,
    out_corr,
    out_overlap,
):
    """Finish the correlation of rows ``[row_lo, row_hi)`` (A columns) of one tile.

    Serial and GIL-free: callers run tiles in parallel threads (``workers``).
    ``sxy`` holds the tile product: rows from ``tile_row0``, B columns ``col0 ..`` (a chunk).
    B's interior gaps are CSR entries (``b_gap_rows``, with their column in
    ``b_gap_cols``). ``b_partial_cols`` lists, ascending, the B columns whose
    interval is not the whole side, and ``b_partial_ptr[j]`` counts those below
    ``j``: only they need prefix-sum lookups on column i; the others take its total.
    ``b_total[j]``, ``b_total_sq[j]`` are B's whole-side sums (``PZ[b0 + T', j] − PZ[b0, j]``,
    the same subtraction as the lookups), taken by every row ``i`` whose interval is the whole side.
    ``symmetric`` keeps only ``j >= i`` (and sets the diagonal).
    Writes ``out_corr[i − out_row0, j − out_col0]`` and ``out_overlap``.
    """
    width = sxy.shape[1]
    sum_y = np.empty(CHUNK)
    sq_y = np.empty(CHUNK)
    base_y = np.empty(CHUNK)
    sum_x = np.empty(CHUNK)
    sq_x = np.empty(CHUNK)
    base_x = np.empty(CHUNK)
    count = np.empty(CHUNK, dtype=np.int32)
    flagged = np.empty(CHUNK, dtype=np.bool_)
    for i in range(row_lo, row_hi):
        ti = i - tile_row0
        c_first = max(i - col0, 0) if symmetric else 0
        diagonal = symmetric and i >= col0  # this chunk starts at or before column i
        lo_i = b0 + a_lo[i]
        hi_i = b0 + a_hi[i]
        sq_i = prefix_sq_t[i, a0 + a_hi[i]] - prefix_sq_t[i, a0 + a_lo[i]]
        whole_sum_i = prefix_t[i, a0 + n_rows] - prefix_t[i, a0]
        whole_sq_i = prefix_sq_t[i, a0 + n_rows] - prefix_sq_t[i, a0]
        whole_count_i = prefix_count_t[i, a0 + n_rows] - prefix_count_t[i, a0]
        full_row_i = a_lo[i] == 0 and a_hi[i] == n_rows
        row = i - out_row0
        z_i = z_t[i]  # row views of column i: one base address in the scattered loops below
        present_i = present_t[i]
        prefix_i = prefix_t[i]
        prefix_sq_i = prefix_sq_t[i]
        prefix_count_i = prefix_count_t[i]
        for c_start in range(c_first, width, CHUNK):
            c_stop = min(c_start + CHUNK, width)
            j0 = col0 + c_start
            m = c_stop - c_start
            # Row slices (non-negative local indices, unit stride): the loops below vectorise
            # with plain vector loads and stores instead of gathers and scatters.
            sxy_i = sxy[ti, c_start:c_stop]
            corr_i = out_corr[row, j0 - out_col0 : j0 - out_col0 + m]
            overlap_i = out_overlap[row, j0 - out_col0 : j0 - out_col0 + m]
            # Overlap sums of column j: its values on i's interval (B's column totals when
            # that is the whole side), less i's interior gaps; of column i: its values on
            # the whole side (corrected below for the partial columns j).
            if full_row_i:
                total_y = b_total[j0 : j0 + m]
                total_sq_y = b_total_sq[j0 : j0 + m]
                for c in range(m):
                    sum_y[c] = total_y[c]
                    base_y[c] = total_sq_y[c]
                    sq_y[c] = total_sq_y[c]
                    sum_x[c] = whole_sum_i
                    base_x[c] = whole_sq_i
                    sq_x[c] = whole_sq_i
                    count[c] = whole_count_i
            else:
                hi_y = prefix[hi_i, j0 : j0 + m]
                lo_y = prefix[lo_i, j0 : j0 + m]
                hi_sq_y = prefix_sq[hi_i, j0 : j0 + m]
                lo_sq_y = prefix_sq[lo_i, j0 : j0 + m]
                for c in range(m):
                    sum_y[c] = hi_y[c] - lo_y[c]
                    base_y[c] = hi_sq_y[c] - lo_sq_y[c]
                    sq_y[c] = base_y[c]
                    sum_x[c] = whole_sum_i
                    base_x[c] = whole_sq_i
                    sq_x[c] = whole_sq_i
                    count[c] = whole_count_i
            for k in range(a_gap_ptr[i], a_gap_ptr[i + 1]):
                z_gap = z[b0 + a_gap_rows[k], j0 : j0 + m]
                for c in range(m):
                    v = np.float64(z_gap[c])
                    sum_y[c] -= v
                    sq_y[c] -= v * v
            # Column i on j's interval when j is partial, then less j's interior gaps.
            for p in range(b_partial_ptr[j0], b_partial_ptr[j0 + m]):
                j = b_partial_cols[p]
                c = j - j0
                lo = a0 + b_lo[j]
                hi = a0 + b_hi[j]
                sum_x[c] = prefix_i[hi] - prefix_i[lo]
                base_x[c] = prefix_sq_i[hi] - prefix_sq_i[lo]
                sq_x[c] = base_x[c]
                count[c] = prefix_count_i[hi] - prefix_count_i[lo]
            for k in range(b_gap_ptr[j0], b_gap_ptr[j0 + m]):
                c = b_gap_cols[k] - j0
                t = a0 + b_gap_rows[k]
                v = np.float64(z_i[t])
                sum_x[c] -= v
                sq_x[c] -= v * v
                count[c] -= present_i[t]
            # Pearson from the sums (branch-free), written straight out; pairs whose
            # variance fails the guard are flagged and rewritten from the exact fallback.
            n_flagged = 0
            for c in range(m):
                value, bad = _pearson(
                    sxy_i[c],
                    count[c],
                    sum_x[c],
                    sum_y[c],
                    sq_x[c],
                    sq_y[c],
                    tau * base_x[c],
                    tau * base_y[c],
                    min_overlap,
                )
                flagged[c] = bad
                n_flagged += bad
                corr_i[c] = value
                overlap_i[c] = count[c]
            if n_flagged:
                for c in range(m):
                    if flagged[c]:
                        corr_i[c] = exact_pair_correlation(
                            raw_t[i, a0 : a0 + n_rows], raw_t[j0 + c, b0 : b0 + n_rows], min_overlap
                        )
            if diagonal and c_start == c_first:
                corr_i[0] = 1.0 if (count[0] >= min_overlap and sq_i > 0.0) else np.nan


@njit(inline="always")
def _pearson(sxy, n, sx, sy, sq_x, sq_y, guard_x, guard_y, min_overlap):  # pragma: no cover
    """``(corr, flagged)`` from the overlap sums (module docstring); NaN below ``min_overlap``.

    Flagged (to be recomputed exactly) when a variance is at most its guard, tau times the
    sum it came from: ``n·sq − s² <= n · guard``, the guard scaled by n like the variance."""
    n_f = np.float64(n)
    var_x = n_f * sq_x - sx * sx  # n times the variances and covariance: no division by n
    var_y = n_f * sq_y - sy * sy
    value = (n_f * np.float64(sxy) - sx * sy) / math.sqrt(max(var_x * var_y, 1e-300))
    value = min(1.0, max(-1.0, value))
    enough = n >= min_overlap
    bad = enough & ((var_x <= n_f * guard_x) | (var_y <= n_f * guard_y))
    return (value if enough else np.nan), bad


@njit(cache=True, nogil=True)
def mirror_block(matrix, row_lo, row_hi, col_lo, col_hi):  # pragma: no cover - compiled
    """``matrix[r, c] = matrix[c, r]`` for ``c in [row_lo, row_hi)``, ``r in [col_lo, col_hi)``, ``r > c``.

    Copies the upper-triangle block rows ``[row_lo, row_hi)`` × columns ``[col_lo, col_hi)``
    (one product chunk, still in cache) to its mirror image below the diagonal (``matrix``
    C-contiguous), in 8 × 8 squares from the block's corner: a square wholly below the
    diagonal is moved by one register transpose (``intrinsics.transpose_block8``), the others
    (on the diagonal, or cut by the block's edge) element by element.
    """
    for r0 in range(col_lo, col_hi, 8):
        r1 = min(r0 + 8, col_hi)
        for c0 in range(row_lo, row_hi, 8):
            c1 = min(c0 + 8, row_hi)
            if r1 - r0 == 8 and c1 - c0 == 8 and r0 >= c0 + 8:
                transpose_block8(matrix, c0, r0, matrix, r0, c0)
            else:
                for r in range(max(r0, c0 + 1), r1):
                    for c in range(c0, min(c1, r)):
                        matrix[r, c] = matrix[c, r]
