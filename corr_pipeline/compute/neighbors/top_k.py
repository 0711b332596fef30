"""Top-k neighbours of every symbol by absolute correlation (SPEC §4).

For each row ``i`` of the N × N correlation matrix: the ``k`` columns ``j != i`` with the largest
``|corr[i, j]|`` among finite entries, ordered by ``|corr|`` descending and, on equal ``|corr|``,
by ``j`` ascending. A row with fewer than ``k`` finite off-diagonal entries is padded with index
−1, corr NaN and overlap 0.

Algorithm and memory (N = 24,000, float32 ``corr`` possibly a read-only 2.3 GB ``np.memmap``):
``corr`` is walked in the row blocks of :func:`corr_pipeline.compute.tiling.row_blocks` for rows
of ``N · 4`` bytes and the ``working_memory_mb`` budget (blocks are views, never copies), and
each row is reduced in one pass by a compiled kernel holding a ``2k + 16``-entry candidate
buffer: once ``k`` candidates are known a later column enters only with ``|corr|`` strictly
above the current k-th best (an equal value loses the tie to the smaller column already held);
a full buffer is cut back to its best ``k`` with a stable sort on ``−|corr|``. Cost O(N²) reads
plus O(k log k) per buffer cut; no temporary larger than the buffer; outputs N × k. ``overlap``
is only gathered at the selected positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from corr_pipeline.compute.neighbors.rows import Neighbors, check_neighbors_args, fill_top_k_rows
from corr_pipeline.compute.neighbors.striped import striped_neighbors
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, Progress

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.runners import StripeRunner

__all__ = ["Neighbors", "top_k_neighbors"]


def top_k_neighbors(
    corr: np.ndarray,
    *,
    k: int,
    overlap: np.ndarray | None = None,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
) -> Neighbors:
    """The ``k`` strongest neighbours of every symbol (SPEC §4).

    For row ``i``: the ``k`` columns ``j != i`` with the largest ``|corr[i, j]|`` among finite
    entries (NaN and ±inf are skipped), ordered by ``|corr|`` descending, ties to the smaller
    ``j``. ``k`` may exceed ``N − 1``: rows are then padded (index −1, corr NaN, overlap 0), as
    are rows with fewer than ``k`` finite entries.

    Parameters
    ----------
    corr : float32 (N, N) array (SPEC §3), possibly a read-only ``np.memmap``; read in blocks
        of rows sized by ``working_memory_mb``.
    k : number of neighbours per row, an integer ``>= 1``.
    overlap : optional (N, N) integer array (e.g. the int16 overlap matrix of SPEC §3); its
        values at the selected positions are returned in the same dtype.
    working_memory_mb : budget in MiB for the per-block temporaries; the result does not
        depend on it.
    progress : ``progress(done, total)`` after each stripe of a ``runner``.
    runner : None reads the rows in this thread; a
        :class:`~corr_pipeline.compute.parallel.runners.StripeRunner` reads them in its stripes
        (:func:`~corr_pipeline.compute.neighbors.striped.striped_neighbors`; ``corr`` and
        ``overlap`` must then be file-backed memory maps). Same result either way.

    Returns
    -------
    Neighbors(index int32 (N, k), corr float32 (N, k) signed, overlap (N, k) or None)

    Raises
    ------
    TypeError : ``corr`` or ``overlap`` not a numpy array, ``corr`` not float32, ``overlap`` not
        of an integer dtype, ``k`` not an integer.
    ValueError : ``corr`` not square, ``overlap`` not of ``corr``'s shape, ``k < 1``,
        ``working_memory_mb`` not > 0.

    Examples
    --------
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> from corr_pipeline.compute import pairwise_correlation
    >>> result = pairwise_correlation(R, min_overlap=60)
    >>> neighbors = top_k_neighbors(result.corr, k=1, overlap=result.overlap)
    >>> neighbors.index[:, 0].tolist(), neighbors.overlap[:, 0].tolist()
    ([1, 0, 1, 2], [250, 250, 230, 230])
    """
    if runner is not None:
        return striped_neighbors(
            corr,
            runner,
            k=k,
            overlap=overlap,
            working_memory_mb=working_memory_mb,
            progress=progress,
        )
    k = check_neighbors_args(corr, k, overlap, working_memory_mb)
    return fill_top_k_rows(corr, overlap, k, (0, corr.shape[0]), working_memory_mb)
