"""Facts of a correlation matrix and its overlap, gathered in one pass: what the checks of the
correlation (SPEC §3) and of the neighbors (SPEC §4) count.

:func:`row_counts_above`: per row ``i``, the finite entries ``corr[i, j]``, ``j != i``, and how
many of them have ``|corr[i, j]| > threshold[i]``; one pass over the rows, in blocks on the
worker threads.

:func:`upper_triangle_facts`:
For every pair ``i < j``: whether ``corr[i, j]`` and ``corr[j, i]`` differ bit for bit (as
uint32, NaN patterns included), whether ``overlap[i, j]`` and ``overlap[j, i]`` differ; and of
``a = corr[i, j]`` with ``o = overlap[i, j]``: finite values with ``|a| > 1``, finite values
with ``o < min_overlap``, non-finite values with ``o >= min_overlap``; the number of pairs, of
finite values, the sum of ``|a|`` (float64), the largest ``|a|`` and the sum of ``o``.

Rows are taken in blocks of ``tile`` rows (one work item each, on the worker threads of
:mod:`corr_pipeline.compute.workers`), and each block's columns in tiles of ``tile`` from its
diagonal on, so the transposed reads of ``corr[j, i]`` stay in cache. Every row's ``|a|`` are
summed in the order of ``j`` into its own float64 total and the totals in the order of ``i``:
the sum is the same for every tile size and number of threads. No memory beyond O(N).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from corr_pipeline.compute.workers import worker_pool

__all__ = ["TILE", "UpperTriangleFacts", "row_counts_above", "upper_triangle_facts"]

#: Rows per block and columns per tile (a 64 x 64 tile of float32 is 16 KiB).
TILE = 64

# the counters of one block, in this order
_ASYMMETRIC_CORR, _ASYMMETRIC_OVERLAP, _OUT_OF_RANGE, _FINITE_BELOW = 0, 1, 2, 3
_NAN_AT_OR_ABOVE, _PAIRS, _DEFINED, _SUM_OVERLAP = 4, 5, 6, 7


@dataclass(frozen=True)
class UpperTriangleFacts:
    """The facts of the module docstring, over the ``n (n − 1) / 2`` pairs ``i < j``."""

    asymmetric_corr: int
    asymmetric_overlap: int
    out_of_range: int
    finite_below_min_overlap: int
    nan_at_or_above_min_overlap: int
    pairs_total: int
    pairs_defined: int
    sum_abs_corr: float
    max_abs_offdiag: float
    sum_overlap: int


@numba.njit(nogil=True, cache=True)
def _block_facts(
    corr, bits, overlap, min_overlap, i0, i1, tile, row_sums, counts
):  # pragma: no cover - numba
    """Facts of the pairs ``(i, j)``, ``i0 <= i < i1``, ``j > i``, into ``counts`` (8 int64)
    and ``row_sums[i]``; returns the largest finite ``|corr[i, j]|`` (0 when none)."""
    n = corr.shape[0]
    largest = np.float32(0.0)
    for j0 in range(i0, n, tile):
        j1 = min(n, j0 + tile)
        for i in range(i0, i1):
            total = row_sums[i]
            for j in range(max(j0, i + 1), j1):
                if bits[i, j] != bits[j, i]:
                    counts[_ASYMMETRIC_CORR] += 1
                o = overlap[i, j]
                if o != overlap[j, i]:
                    counts[_ASYMMETRIC_OVERLAP] += 1
                counts[_PAIRS] += 1
                counts[_SUM_OVERLAP] += o
                enough = o >= min_overlap
                a = corr[i, j]
                if np.isfinite(a):
                    v = abs(a)
                    counts[_DEFINED] += 1
                    total += v
                    if v > 1.0:
                        counts[_OUT_OF_RANGE] += 1
                    if not enough:
                        counts[_FINITE_BELOW] += 1
                    if v > largest:
                        largest = v
                elif enough:
                    counts[_NAN_AT_OR_ABOVE] += 1
            row_sums[i] = total
    return largest


def upper_triangle_facts(
    corr: np.ndarray, overlap: np.ndarray, *, min_overlap: int, tile: int = TILE
) -> UpperTriangleFacts:
    """The facts of the module docstring for the square ``corr`` (float32) and ``overlap``
    (any integer type), memory maps included."""
    n = int(corr.shape[0])
    bits = corr.view(np.uint32)
    row_sums = np.zeros(n, np.float64)
    blocks = list(range(0, n, tile))
    counts = np.zeros((len(blocks), 8), np.int64)
    largest = np.zeros(len(blocks), np.float32)

    def block(k: int) -> None:
        i0 = blocks[k]
        largest[k] = _block_facts(
            corr, bits, overlap, min_overlap, i0, min(n, i0 + tile), tile, row_sums, counts[k]
        )

    with worker_pool() as pool:  # the first blocks hold the most pairs: handed out first
        list(pool.map(block, range(len(blocks))))
    total = counts.sum(axis=0)
    return UpperTriangleFacts(
        asymmetric_corr=int(total[_ASYMMETRIC_CORR]),
        asymmetric_overlap=int(total[_ASYMMETRIC_OVERLAP]),
        out_of_range=int(total[_OUT_OF_RANGE]),
        finite_below_min_overlap=int(total[_FINITE_BELOW]),
        nan_at_or_above_min_overlap=int(total[_NAN_AT_OR_ABOVE]),
        pairs_total=int(total[_PAIRS]),
        pairs_defined=int(total[_DEFINED]),
        sum_abs_corr=float(row_sums.sum()),
        max_abs_offdiag=float(largest.max(initial=0.0)),
        sum_overlap=int(total[_SUM_OVERLAP]),
    )


@numba.njit(nogil=True, cache=True)
def _row_counts(corr, threshold, i0, i1, finite, above):  # pragma: no cover - numba
    """``finite[i]`` and ``above[i]`` (module docstring) for the rows ``i0 <= i < i1``."""
    n = corr.shape[1]
    for i in range(i0, i1):
        t = threshold[i]
        count = 0
        larger = 0
        for j in range(n):
            a = corr[i, j]
            if j != i and np.isfinite(a):
                count += 1
                if abs(a) > t:
                    larger += 1
        finite[i] = count
        above[i] = larger


def row_counts_above(corr: np.ndarray, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(finite, above)`` (int64, one per row) of the module docstring for the square
    ``corr`` (memory maps included) and a float32 ``threshold`` per row."""
    n = int(corr.shape[0])
    finite = np.zeros(n, np.int64)
    above = np.zeros(n, np.int64)
    threshold = np.ascontiguousarray(threshold, dtype=np.float32)
    starts = range(0, n, TILE)
    with worker_pool() as pool:
        list(
            pool.map(
                lambda i0: _row_counts(corr, threshold, i0, min(n, i0 + TILE), finite, above),
                starts,
            )
        )
    return finite, above
