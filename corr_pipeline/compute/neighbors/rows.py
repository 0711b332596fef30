"""The top-k of rows of the correlation (SPEC §4): the compiled kernel and the row loop that
both :func:`~corr_pipeline.compute.neighbors.top_k.top_k_neighbors` and every stripe of
:func:`~corr_pipeline.compute.neighbors.striped.striped_neighbors` run (the algorithm:
:mod:`corr_pipeline.compute.neighbors.top_k`)."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from corr_pipeline.compute.tiling import row_blocks
from corr_pipeline.compute.validation import (
    check_array,
    check_positive_int,
    check_square_corr,
    check_working_memory,
)


class Neighbors(NamedTuple):
    """Result of :func:`~corr_pipeline.compute.neighbors.top_k.top_k_neighbors` (SPEC §4).

    index : int32 (N, k), neighbour column, −1 where padded.
    corr : float32 (N, k), signed correlation, NaN where padded.
    overlap : (N, k) in the dtype of the ``overlap`` input, 0 where padded; ``None`` when no
        ``overlap`` was given.
    """

    index: np.ndarray  # type: ignore[assignment]  # the field shadows tuple.index, on purpose
    corr: np.ndarray
    overlap: np.ndarray | None


@numba.njit(cache=True, nogil=True)
def _merge_pass(src_a, src_j, dst_a, dst_j, m, width):  # pragma: no cover - compiled
    """Merge consecutive sorted runs of ``width`` pairs of ``src`` into ``dst`` (``a`` desc)."""
    for lo in range(0, m, 2 * width):
        mid = min(lo + width, m)
        hi = min(lo + 2 * width, m)
        p = lo
        q = mid
        for o in range(lo, hi):
            # the right run goes first only when strictly greater: ties keep the left run
            # (smaller j) first, so the sort is stable
            if q < hi and (p >= mid or src_a[q] > src_a[p]):
                dst_a[o] = src_a[q]
                dst_j[o] = src_j[q]
                q += 1
            else:
                dst_a[o] = src_a[p]
                dst_j[o] = src_j[p]
                p += 1


@numba.njit(cache=True, nogil=True)
def _sort_desc_stable(a, j, m, tmp_a, tmp_j):  # pragma: no cover - compiled
    """Sort the pairs ``(a[:m], j[:m])`` in place by ``a`` descending, stably (bottom-up merge)."""
    width = 1
    in_tmp = False
    while width < m:
        if in_tmp:
            _merge_pass(tmp_a, tmp_j, a, j, m, width)
        else:
            _merge_pass(a, j, tmp_a, tmp_j, m, width)
        in_tmp = not in_tmp
        width *= 2
    if in_tmp:
        for t in range(m):
            a[t] = tmp_a[t]
            j[t] = tmp_j[t]


@numba.njit(cache=True, nogil=True)
def _top_k_rows(block, row0, k, out_index, out_value):  # pragma: no cover - compiled
    """Top-k of every row of ``block`` (global rows ``row0 ..``) by (|corr| desc, j asc).

    One pass per row with a candidate buffer of ``2k + 16`` entries, filled in ``j`` order:
    once ``k`` candidates are known, a later ``j`` enters only with ``|corr|`` strictly above
    the current k-th best (an equal value loses the tie to the smaller ``j`` already held). A
    full buffer is cut back to its best ``k`` by a stable sort on ``|corr|`` descending —
    stable, so equal values stay in ``j`` order — and the answer is the buffer's best ``k``.
    """
    n_rows, n = block.shape
    cap = 2 * k + 16
    buf_a = np.empty(cap, dtype=np.float64)
    buf_j = np.empty(cap, dtype=np.int64)
    tmp_a = np.empty(cap, dtype=np.float64)
    tmp_j = np.empty(cap, dtype=np.int64)
    for r in range(n_rows):
        i = row0 + r
        m = 0
        full = False
        kth = -1.0
        for j in range(n):
            a = abs(np.float64(block[r, j]))
            if not a < np.inf or j == i:  # NaN, ±inf, diagonal
                continue
            if full and not a > kth:
                continue
            buf_a[m] = a
            buf_j[m] = j
            m += 1
            if m == cap:
                _sort_desc_stable(buf_a, buf_j, m, tmp_a, tmp_j)
                m = k
                full = True
                kth = buf_a[k - 1]
        _sort_desc_stable(buf_a, buf_j, m, tmp_a, tmp_j)
        for t in range(min(m, k)):
            j = buf_j[t]
            out_index[r, t] = j
            out_value[r, t] = block[r, j]


def check_neighbors_args(
    corr: np.ndarray, k: int, overlap: np.ndarray | None, working_memory_mb: float
) -> int:
    """Validated arguments of
    :func:`~corr_pipeline.compute.neighbors.top_k.top_k_neighbors` (see its Raises); ``k`` as an int."""
    check_square_corr(corr)
    check_positive_int(k, "k")
    if overlap is not None:
        check_array(overlap, "overlap", np.integer, shape=corr.shape)
    check_working_memory(working_memory_mb)
    return int(k)


def fill_top_k_rows(
    corr: np.ndarray,
    overlap: np.ndarray | None,
    k: int,
    rows: tuple[int, int],
    working_memory_mb: float,
) -> Neighbors:
    """:func:`~corr_pipeline.compute.neighbors.top_k.top_k_neighbors` of rows ``[rows[0], rows[1])`` of ``corr`` only (arguments
    already validated): ``(rows[1] - rows[0]) x k`` arrays, read in blocks of the budget."""
    n = corr.shape[0]
    first, last = rows
    index = np.full((last - first, k), -1, dtype=np.int32)
    values = np.full((last - first, k), np.nan, dtype=np.float32)
    overlap_out = None if overlap is None else np.zeros((last - first, k), dtype=overlap.dtype)
    for start, stop in row_blocks(last - first, n * corr.dtype.itemsize, working_memory_mb):
        row0, row1 = first + start, first + stop
        block = np.asarray(corr[row0:row1])  # a view for ndarray / memmap input
        _top_k_rows(block, row0, k, index[start:stop], values[start:stop])
        if overlap is not None and overlap_out is not None:
            local, rank = np.nonzero(index[start:stop] >= 0)
            overlap_out[start + local, rank] = overlap[row0 + local, index[start + local, rank]]
    return Neighbors(index, values, overlap_out)


__all__ = ["Neighbors", "check_neighbors_args", "fill_top_k_rows"]
