"""Fused per-pair kernels (numba): the elementwise half of the correlation.

For column ``i`` of side A and column ``j`` of side B (see ``standardize``),
aligned row by row (local row ``t`` is window row ``a0 + t`` in A and
``b0 + t`` in B), the pairwise-complete Pearson correlation over the overlap
``O_ij = {t : both finite}`` is

    n   = |O_ij|
    Sx  = Σ_O Z[a0+t, i]     Sxx = Σ_O Z[a0+t, i]²
    Sy  = Σ_O Z[b0+t, j]     Syy = Σ_O Z[b0+t, j]²      Sxy = Σ_t Z[a0+t, i] Z[b0+t, j]
    corr = (Sxy − Sx·Sy/n) / sqrt((Sxx − Sx²/n) · (Syy − Sy²/n))
         = (n·Sxy − Sx·Sy) / sqrt((n·Sxx − Sx²) · (n·Syy − Sy²))     (computed so, in float32:
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

Precision: the fused pass works in float32, like the product ``Sxy`` it finishes. The
prefix sums are float64; each interval sum is their difference rounded once to float32 (a
short interval late in a long window keeps its digits), less the gap rows in float32. With
``u = 2⁻²⁴``, those roundings move ``n·Sxx − Sx²`` by at most about ``8u · n · sum`` (``sum``
the interval sum of squares it came from; ``|Sx| <= sqrt(n · sum)``), and the covariance
term by about ``2u · n · sqrt(sum_x · sum_y)``; a pair that passes the guard below with
``tau = 1/8`` therefore has a correlation within ~``64u`` ≈ 4e-6 of the float64 formula
in the worst case (within a few ``u`` for the usual overlap, whose variance is most of its
sum of squares): inside SPEC's 1e-5. With float64 sums the pass took 33–35 ms of CPU at
N = 4,000 against 27–30 ms (twice the bytes through its transposes, half the vector lanes).

Exactness guard: when a variance ``Sxx − Sx²/n`` is at most ``tau`` times the interval sum
it came from, or at most ``2⁻⁶⁰`` (tested as ``n·Sxx − Sx² <= n · max(tau · sum, 2⁻⁶⁰)``),
float cancellation could cost digits (and a truly constant overlap would not come out as
exactly 0; the floor keeps the product of two variances out of float32's subnormals), so that
pair is recomputed exactly from the raw returns in float64 (two-pass, with zero variance
decided by equality of all values, as pandas' Welford recurrence does). Such pairs are rare
(overlaps whose mean is more than ``sqrt(1/tau − 1)`` ≈ 2.6 of their standard deviations
from 0, in the standardized units); the guard keeps the fast formula within float32 rounding
everywhere else. The fused pass first tests the guard against the whole side's sum
(``n·Sxx − Sx² <= n · max(tau · whole, 2⁻⁶⁰)``, an upper bound: prefix sums of squares never
decrease and float subtraction and rounding are monotone, so no pair the guard flags escapes
it), and forms the interval sum and the exact test only for the few pairs that fail the
bound: the interval sums before the gaps need no storage per pair.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from corr_pipeline.compute.intrinsics import transpose_block8

FALLBACK_TAU = 1.0 / 16.0
"""Recompute a pair exactly when a variance is below tau × its source sum, for the lead-lag's
float64 sums (see module docstring)."""

CORRELATION_TAU = 1.0 / 8.0
"""The correlation's tau: its sums are float32 (see module docstring)."""

VARIANCE_FLOOR = 2.0**-60
"""The correlation also recomputes a pair exactly when a variance (``n·Sxx − Sx²``) is at most
``n`` times this: then its product with the other cannot underflow float32."""

_TINY = np.float32(2.0**-126)  # the smallest normal float32

SUBBLOCK = 256
"""Columns per pass of ``correlate_tile``: 128 to 512 perform alike; narrower passes pay the row
pass's per-row overhead more often."""


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


def tile_scratch(rows: int) -> int:
    """Elements of each of :func:`correlate_tile`'s scratch arrays for a tile of ``rows``
    rows: its sums of eight columns and of a sub-block by row, ``8 · (P + 8) + P · (SUBBLOCK +
    8)`` with ``P = rows`` rounded up to a multiple of 8 (the float32 one holds two of each:
    Sx, Sxx)."""
    padded = (rows + 7) // 8 * 8
    return 8 * (padded + 8) + padded * (SUBBLOCK + 8)


@njit(cache=True, nogil=True)
def correlate_tile(product, window, a_side, b_side, out, scratch):  # pragma: no cover - compiled
    """Finish the correlation of rows ``[row_lo, row_hi)`` (A columns) of one tile.

    Serial and GIL-free: callers run tiles in parallel threads (``workers``). The records:

    * ``product`` = (``sxy``, ``tile_row0``, ``col0``, ``row_lo``, ``row_hi``, ``symmetric``,
      ``min_overlap``, ``tau``): ``sxy`` holds the tile product, rows from ``tile_row0``, B
      columns ``col0 ..`` (a chunk); ``symmetric`` keeps only ``j >= i`` (and sets the
      diagonal);
    * ``window`` = (``z``, ``present``, ``raw_t``, ``prefix``, ``prefix_sq``, ``prefix_count``,
      ``n_rows``): the window's time-major arrays (``standardize``), the raw returns column-major
      for the exact fallback, and the sides' rows ``T'``;
    * ``a_side`` = (``a0``, ``lo``, ``hi``, ``gap_ptr``, ``gap_rows``) and ``b_side`` = the same
      with ``total``, ``total_sq``: each side's first row, its columns' presence intervals and
      interior gaps, and B's whole-side sums (``PZ[b0 + T', j] − PZ[b0, j]`` rounded to float32,
      as the lookups are), taken by every row ``i`` whose interval is the whole side;
    * ``out`` = (``out_row0``, ``out_col0``, ``out_corr``, ``out_overlap``): writes
      ``out_corr[i − out_row0, j − out_col0]`` and ``out_overlap``;
    * ``scratch`` = (float32, int32) arrays of :func:`tile_scratch` elements (the float32 one
      twice), the caller's, reused from call to call: fresh arrays of a megabyte would be pages
      to fault in and zero on every call wherever the allocator maps them afresh (Dask workers).

    The chunk is done :data:`SUBBLOCK` columns at a time, in two passes:

    * :func:`_column_pass`, column by column, vectorised over the tile's rows: the sums of
      column ``i`` over the rows where ``j`` is present (``Sx``, ``Sxx``, ``n``), transposed to
      row order eight columns at a time;
    * :func:`_row_pass`, row by row, vectorised over the columns: the sums of column ``j``
      over ``i``'s interval less ``i``'s interior gaps, Pearson with the guard, the writes.

    Every sum is formed by the same float32 operations in the same order whatever the
    sub-block, chunk, tile or thread.
    """
    sxy, _, col0, row_lo, row_hi, symmetric = product[:6]
    prefix, prefix_sq, prefix_count, n_rows = window[3:]
    a0 = a_side[0]
    rows = row_hi - row_lo
    padded = (rows + 7) // 8 * 8
    # Sums of column i over the rows where j is present, [column, row] for eight columns,
    # then [row, column] for the sub-block. (Rows padded by 8 elements: strides of a power of
    # two would alias in the L1 cache.)
    by_col_size, by_row_size = 8 * (padded + 8), padded * (SUBBLOCK + 8)
    sums = (
        scratch[0][: 2 * by_col_size].reshape((2, 8, padded + 8)),  # Sx, Sxx
        scratch[0][2 * by_col_size : 2 * (by_col_size + by_row_size)].reshape(
            (2, padded, SUBBLOCK + 8)
        ),
        scratch[1][:by_col_size].reshape((8, padded + 8)),  # n
        scratch[1][by_col_size : by_col_size + by_row_size].reshape((padded, SUBBLOCK + 8)),
    )
    # The whole side's sums of each row's column i; stand-ins for the first gap's rows of Z and
    # presence when there is none (x − 0 == x).
    whole = (
        np.empty(rows, dtype=np.float32),
        np.empty(rows, dtype=np.float32),
        np.empty(rows, dtype=np.int32),
        np.zeros(max(rows, SUBBLOCK), dtype=np.float32),
        np.zeros(rows, dtype=np.uint8),
    )
    top = a0 + n_rows
    for r in range(rows):
        i = row_lo + r
        whole[0][r] = np.float32(prefix[top, i] - prefix[a0, i])
        whole[1][r] = np.float32(prefix_sq[top, i] - prefix_sq[a0, i])
        whole[2][r] = prefix_count[top, i] - prefix_count[a0, i]
    row_space = (
        np.empty(SUBBLOCK, dtype=np.float32),
        np.empty(SUBBLOCK, dtype=np.float32),
        np.empty(SUBBLOCK, dtype=np.bool_),
    )
    for s in range(0, sxy.shape[1], SUBBLOCK):
        m_block = min(SUBBLOCK, sxy.shape[1] - s)
        if symmetric and col0 + s + m_block <= row_lo:
            continue  # left of every row's diagonal
        _column_pass(s, m_block, product, window, a0, b_side, whole, sums)
        _row_pass(s, m_block, product, window, a_side, b_side, out, whole, sums, row_space)


@njit(inline="always")
def _column_pass(s, m_block, product, window, a0, b_side, whole, sums):  # pragma: no cover
    """Per column ``j`` of the sub-block at ``s``, vectorised over the tile's rows: the sums of
    column ``i`` over the rows where ``j`` is present, ``PZ[a0 + hi_j, i] − PZ[a0 + lo_j, i]``
    (the whole side's sums of ``i`` when ``j``'s interval is the whole side), less row ``t`` of
    ``Z`` (of ``Z²``, the presence) for each interior gap ``t`` of ``j`` in turn; every eight
    columns transposed to row order at once by 8 × 8 register transposes
    (``intrinsics.transpose_block8``), while their sums are still in the L1 cache (a whole
    sub-block's, 700 KB at 128 rows, would come back from beyond L2)."""
    col0, row_lo, row_hi = product[2], product[3], product[4]
    z, present, _, prefix, prefix_sq, prefix_count, n_rows = window
    b_lo, b_hi, b_gap_ptr, b_gap_rows = b_side[1], b_side[2], b_side[3], b_side[4]
    whole_sum, whole_sq, whole_count, no_gap_z, no_gap_present = whole
    by_col, by_row, by_col_count, by_row_count = sums
    rows = row_hi - row_lo
    padded = (rows + 7) // 8 * 8
    for q0 in range(0, m_block, 8):
        for q in range(q0, min(q0 + 8, m_block)):
            j = col0 + s + q
            sum_x = by_col[0, q - q0, :rows]
            sq_x = by_col[1, q - q0, :rows]
            count = by_col_count[q - q0, :rows]
            # The interval's sums less the first gap's row in the same loop (the same
            # subtractions in the same order), then the other gaps.
            first_gap = b_gap_ptr[j]
            if first_gap < b_gap_ptr[j + 1]:
                t = a0 + b_gap_rows[first_gap]
                z_gap = z[t, row_lo:row_hi]
                present_gap = present[t, row_lo:row_hi]
                first_gap += 1
            else:
                z_gap = no_gap_z[:rows]
                present_gap = no_gap_present
            if b_lo[j] != 0 or b_hi[j] != n_rows:
                lo = a0 + b_lo[j]
                hi = a0 + b_hi[j]
                hi_x = prefix[hi, row_lo:row_hi]
                lo_x = prefix[lo, row_lo:row_hi]
                hi_sq_x = prefix_sq[hi, row_lo:row_hi]
                lo_sq_x = prefix_sq[lo, row_lo:row_hi]
                hi_count = prefix_count[hi, row_lo:row_hi]
                lo_count = prefix_count[lo, row_lo:row_hi]
                for r in range(rows):
                    v = z_gap[r]
                    sum_x[r] = np.float32(hi_x[r] - lo_x[r]) - v
                    sq_x[r] = np.float32(hi_sq_x[r] - lo_sq_x[r]) - v * v
                    count[r] = (hi_count[r] - lo_count[r]) - present_gap[r]
            else:
                for r in range(rows):
                    v = z_gap[r]
                    sum_x[r] = whole_sum[r] - v
                    sq_x[r] = whole_sq[r] - v * v
                    count[r] = whole_count[r] - present_gap[r]
            for k in range(first_gap, b_gap_ptr[j + 1]):
                t = a0 + b_gap_rows[k]
                z_gap = z[t, row_lo:row_hi]
                present_gap = present[t, row_lo:row_hi]
                for r in range(rows):
                    v = z_gap[r]
                    sum_x[r] -= v
                    sq_x[r] -= v * v
                    count[r] -= present_gap[r]
        for r0 in range(0, padded, 8):
            for part in range(2):
                transpose_block8(by_col[part], 0, r0, by_row[part], r0, q0)
            transpose_block8(by_col_count, 0, r0, by_row_count, r0, q0)


@njit(inline="always")
def _row_pass(
    s, m_block, product, window, a_side, b_side, out, whole, sums, row_space
):  # pragma: no cover - compiled
    """Per row ``i`` of the tile, vectorised over the sub-block's columns: the sums of column
    ``j`` over ``i``'s interval (B's column totals when that is the whole side, read in place
    when ``i`` has no gaps either) less ``i``'s interior gaps, then Pearson from the sums
    (branch-free), written straight out. The guard is first tested against upper bounds of its
    source sums (the whole side's, see :func:`_guard_source`); the few pairs that fail it are
    tested exactly and, if they fail again, rewritten from the exact fallback."""
    sxy, tile_row0, col0, row_lo, row_hi, symmetric, min_overlap, tau = product
    z, _, raw_t, prefix, prefix_sq, _, n_rows = window
    a0, a_lo, a_hi, a_gap_ptr, a_gap_rows = a_side
    b0, b_lo, b_hi, _, _, b_total, b_total_sq = b_side
    out_row0, out_col0, out_corr, out_overlap = out
    whole_sq, no_gap_z = whole[1], whole[3]
    by_row, by_row_count = sums[1], sums[3]
    sum_y_scratch, sq_y_scratch, flagged = row_space
    for r in range(row_hi - row_lo):
        i = row_lo + r
        c_first = max(i - col0, 0) if symmetric else 0
        start = max(c_first, s)
        if start >= s + m_block:
            continue
        m = s + m_block - start
        off = start - s
        j0 = col0 + start
        # Row slices (non-negative local indices, unit stride): the loops below vectorise
        # with plain vector loads and stores instead of gathers and scatters.
        sxy_i = sxy[i - tile_row0, start : start + m]
        corr_i = out_corr[i - out_row0, j0 - out_col0 : j0 - out_col0 + m]
        overlap_i = out_overlap[i - out_row0, j0 - out_col0 : j0 - out_col0 + m]
        sum_x = by_row[0, r, off : off + m]
        sq_x = by_row[1, r, off : off + m]
        count = by_row_count[r, off : off + m]
        total_sq_y = b_total_sq[j0 : j0 + m]
        # The sums of column j over i's interval: B's column totals read in place when i is
        # whole and gap-free, else formed here (the first gap's row in the first loop, as in
        # _column_pass), less i's other interior gaps.
        a_whole = a_lo[i] == 0 and a_hi[i] == n_rows
        if a_whole and a_gap_ptr[i] == a_gap_ptr[i + 1]:
            sum_y = b_total[j0 : j0 + m]
            sq_y = total_sq_y
        else:
            sum_y = sum_y_scratch[:m]
            sq_y = sq_y_scratch[:m]
            first_gap = a_gap_ptr[i]
            if first_gap < a_gap_ptr[i + 1]:
                z_gap = z[b0 + a_gap_rows[first_gap], j0 : j0 + m]
                first_gap += 1
            else:
                z_gap = no_gap_z[:m]
            if a_whole:
                total_y = b_total[j0 : j0 + m]
                for c in range(m):
                    v = z_gap[c]
                    sum_y[c] = total_y[c] - v
                    sq_y[c] = total_sq_y[c] - v * v
            else:
                hi_y = prefix[b0 + a_hi[i], j0 : j0 + m]
                lo_y = prefix[b0 + a_lo[i], j0 : j0 + m]
                hi_sq_y = prefix_sq[b0 + a_hi[i], j0 : j0 + m]
                lo_sq_y = prefix_sq[b0 + a_lo[i], j0 : j0 + m]
                for c in range(m):
                    v = z_gap[c]
                    sum_y[c] = np.float32(hi_y[c] - lo_y[c]) - v
                    sq_y[c] = np.float32(hi_sq_y[c] - lo_sq_y[c]) - v * v
            for k in range(first_gap, a_gap_ptr[i + 1]):
                z_gap = z[b0 + a_gap_rows[k], j0 : j0 + m]
                for c in range(m):
                    v = z_gap[c]
                    sum_y[c] -= v
                    sq_y[c] -= v * v
        bound_x = _guard(tau, whole_sq[r])
        row_sums = (sxy_i, count, sum_x, sum_y, sq_x, sq_y, flagged)
        n_flagged = 0
        for c in range(m):
            value, bad = _pearson_at(row_sums, c, bound_x, _guard(tau, total_sq_y[c]), min_overlap)
            flagged[c] = bad
            n_flagged += bad
            corr_i[c] = value
            overlap_i[c] = count[c]
        if n_flagged:
            _recheck_flagged(
                (i, j0, whole_sq[r]),
                row_sums,
                product,
                window,
                a_side,
                b_side,
                corr_i,
            )
        if symmetric and i >= col0 and start == c_first:
            sq_i = prefix_sq[a0 + a_hi[i], i] - prefix_sq[a0 + a_lo[i], i]
            corr_i[0] = 1.0 if (count[0] >= min_overlap and sq_i > 0.0) else np.nan


@njit(cache=True, nogil=True)
def _recheck_flagged(row, row_sums, product, window, a_side, b_side, corr_i):  # pragma: no cover
    """The pairs of row ``i`` (``row`` = (i, j0, its whole-side sum of squares)) whose guard
    failed against the whole side's sums: the guard again with their own interval sums
    (:func:`_guard_source`), and where it fails again, the exact float64 correlation
    (:func:`exact_pair_correlation`) into ``corr_i``. ``row_sums`` = the row's
    (``Sxy``, ``n``, ``Sx``, ``Sy``, ``Sxx``, ``Syy``, flagged) over its columns."""
    i, j0, whole_sq_i = row
    sum_y, flagged = row_sums[3], row_sums[6]
    min_overlap, tau = product[6], product[7]
    raw_t, _, prefix_sq, _, n_rows = window[2:]
    a0, a_lo, a_hi = a_side[:3]
    b0, b_lo, b_hi = b_side[:3]
    b_total_sq = b_side[6]
    for c in range(sum_y.shape[0]):
        if not flagged[c]:
            continue
        j = j0 + c
        _, bad = _pearson_at(
            row_sums,
            c,
            _guard(tau, _guard_source(prefix_sq, a0, b_lo[j], b_hi[j], n_rows, i, whole_sq_i)),
            _guard(tau, _guard_source(prefix_sq, b0, a_lo[i], a_hi[i], n_rows, j, b_total_sq[j])),
            min_overlap,
        )
        if bad:
            corr_i[c] = exact_pair_correlation(
                raw_t[i, a0 : a0 + n_rows], raw_t[j, b0 : b0 + n_rows], min_overlap
            )


@njit(inline="always")
def _pearson_at(row_sums, c, guard_x, guard_y, min_overlap):  # pragma: no cover - compiled
    """:func:`_pearson` of column ``c`` of a row's sums ``row_sums`` = (``Sxy``, ``n``, ``Sx``,
    ``Sy``, ``Sxx``, ``Syy``, flagged)."""
    sxy, count, sum_x, sum_y, sq_x, sq_y = row_sums[:6]
    return _pearson(
        sxy[c], count[c], sum_x[c], sum_y[c], sq_x[c], sq_y[c], guard_x, guard_y, min_overlap
    )


@njit(inline="always")
def _guard_source(prefix_sq, row0, lo, hi, n_rows, col, whole):  # pragma: no cover - compiled
    """The guard's source sum: ``Σ Z²`` of column ``col`` over the other column's interval
    ``[lo, hi)`` (rows from ``row0``), before the gaps: ``whole`` (the whole side's sum, the same
    subtraction) when the interval is the whole side, else ``PZ2[row0 + hi] − PZ2[row0 + lo]``.

    At most ``whole``: the prefix sums of squares never decrease and float subtraction is
    monotone, so a guard that passes with ``whole`` passes with this sum too."""
    if lo == 0 and hi == n_rows:
        return whole
    return np.float32(prefix_sq[row0 + hi, col] - prefix_sq[row0 + lo, col])


@njit(inline="always")
def _guard(tau, source):  # pragma: no cover - compiled
    """The guard of a variance whose source sum is ``source`` (float32):
    ``max(tau · source, VARIANCE_FLOOR)``, monotone in ``source``."""
    return max(np.float32(tau) * source, np.float32(VARIANCE_FLOOR))


@njit(inline="always")
def _pearson(sxy, n, sx, sy, sq_x, sq_y, guard_x, guard_y, min_overlap):  # pragma: no cover
    """``(corr, flagged)`` from the overlap sums (module docstring); NaN below ``min_overlap``.

    Flagged (to be recomputed exactly) when a variance is at most its guard, tau times the
    sum it came from: ``n·sq − s² <= n · guard``, the guard scaled by n like the variance."""
    n_f = np.float32(n)
    var_x = n_f * sq_x - sx * sx  # n times the variances and covariance: no division by n
    var_y = n_f * sq_y - sy * sy
    value = (n_f * sxy - sx * sy) / np.sqrt(max(var_x * var_y, _TINY))
    value = min(np.float32(1.0), max(np.float32(-1.0), value))
    enough = n >= min_overlap
    bad = enough & ((var_x <= n_f * guard_x) | (var_y <= n_f * guard_y))
    return (value if enough else np.float32(np.nan)), bad
