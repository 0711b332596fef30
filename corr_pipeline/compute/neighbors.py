"""Top-k neighbours of every symbol by absolute correlation (SPEC §4).

For each row ``i`` of the N × N correlation matrix: the ``k`` columns ``j != i`` with the largest
``|corr[i, j]|`` among finite entries, ordered by ``|corr|`` descending and, on equal ``|corr|``,
by ``j`` ascending. A row with fewer than ``k`` finite off-diagonal entries is padded with index
−1, corr NaN and overlap 0.

Memory (N = 24,000, float32 ``corr`` possibly a read-only ``np.memmap`` of 2.3 GB): ``corr`` is
read ``rows`` rows at a time, ``rows = max(1, working_memory_mb·2^20 // row_bytes)`` with
``row_bytes = N·(2·itemsize + 2)`` (the ``|corr|`` block, its partitioned copy, two boolean masks),
as scikit-learn's ``get_chunk_n_rows``. With the default 64 MiB that is 1,664 rows per block at
N = 24,000. Outputs are N × k. No N × N temporary is ever made; ``overlap`` is only gathered at
the selected positions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Neighbors", "top_k_neighbors"]


class Neighbors(NamedTuple):
    """Result of :func:`top_k_neighbors` (SPEC §4).

    index : int32 (N, k), neighbour column, −1 where padded.
    corr : float32 (N, k), signed correlation, NaN where padded.
    overlap : (N, k) in the dtype of the ``overlap`` input, 0 where padded; ``None`` when no
        ``overlap`` was given.
    """

    index: np.ndarray
    corr: np.ndarray
    overlap: np.ndarray | None


def _chunk_rows(row_bytes: int, working_memory_mb: float) -> int:
    """Rows per block for a working-memory budget (as scikit-learn's ``get_chunk_n_rows``)."""
    return max(1, int(working_memory_mb * 2**20) // max(1, row_bytes))


def _block_top_k(block: np.ndarray, row0: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k selection for the rows ``row0 .. row0+len(block)-1``.

    Returns ``(rows, cols, rank)``: the selected entries (block-local row, column) and their
    0-based rank in the row, ordered row by row then by rank.
    """
    n_rows, n = block.shape
    score = np.abs(block)  # NaN stays NaN
    invalid = ~np.isfinite(score)
    score[invalid] = -1.0  # below every valid |corr| (>= 0)
    del invalid
    local = np.arange(n_rows)
    score[local, row0 + local] = -1.0  # j != i

    kk = min(k, n)
    # kth[r] = the kk-th largest score of row r (may be -1 when the row has < kk valid entries)
    kth = np.partition(score, n - kk, axis=1)[:, n - kk]
    kth = np.maximum(kth, 0.0)[:, None]  # rows with < kk valid entries: take all valid ones
    above = score > kth
    n_above = above.sum(axis=1)
    at = score == kth  # kth >= 0 here, so only valid entries
    n_need = np.minimum(kk - n_above, at.sum(axis=1))
    # Boundary ties: of the entries equal to the kth value keep the n_need smallest columns.
    tie_rows = np.flatnonzero(at.sum(axis=1) > n_need)
    if tie_rows.size:
        at_tie = at[tie_rows]
        at_tie &= np.cumsum(at_tie, axis=1, dtype=np.int32) <= n_need[tie_rows, None]
        at[tie_rows] = at_tie
        del at_tie
    above |= at
    del at
    rows, cols = np.nonzero(above)  # row-major: row ascending, then column ascending
    del above
    values = score[rows, cols]
    order = np.lexsort((cols, -values, rows))  # row, then |corr| desc, then column asc
    rows = rows[order]
    cols = cols[order]
    counts = np.bincount(rows, minlength=n_rows)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(rows.shape[0]) - np.repeat(starts, counts)
    return rows, cols, rank


def top_k_neighbors(
    corr: np.ndarray,
    *,
    k: int,
    overlap: np.ndarray | None = None,
    working_memory_mb: float = 64,
) -> Neighbors:
    """The ``k`` strongest neighbours of every symbol (SPEC §4).

    For row ``i``: the ``k`` columns ``j != i`` with the largest ``|corr[i, j]|`` among finite
    entries (NaN and ±inf are skipped), ordered by ``|corr|`` descending, ties to the smaller
    ``j``. ``k`` may exceed ``N − 1``: rows are then padded (index −1, corr NaN, overlap 0), as
    are rows with fewer than ``k`` finite entries.

    Parameters
    ----------
    corr : (N, N) floating array (float32 per SPEC §3), possibly a read-only ``np.memmap``;
        read in blocks of rows sized by ``working_memory_mb``.
    k : number of neighbours per row, ``>= 1``.
    overlap : optional (N, N) integer array (e.g. the int16 overlap matrix of SPEC §3); its
        values at the selected positions are returned in the same dtype.
    working_memory_mb : budget in MiB for the per-block temporaries.

    Returns
    -------
    Neighbors(index int32 (N, k), corr float32 (N, k) signed, overlap (N, k) or None)
    """
    if not hasattr(corr, "ndim") or not hasattr(corr, "dtype"):
        corr = np.asarray(corr)
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"corr must be a square 2-D array (N × N); got shape {corr.shape}")
    if not np.issubdtype(corr.dtype, np.floating):
        raise ValueError(f"corr must have a floating dtype (float32 per SPEC §3); got {corr.dtype}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be an integer >= 1; got {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    k = int(k)
    if overlap is not None:
        if not hasattr(overlap, "ndim") or not hasattr(overlap, "dtype"):
            overlap = np.asarray(overlap)
        if overlap.shape != corr.shape:
            raise ValueError(
                f"overlap must have the shape of corr {corr.shape}; got {overlap.shape}"
            )
        if not np.issubdtype(overlap.dtype, np.integer):
            raise ValueError(f"overlap must have an integer dtype; got {overlap.dtype}")
    if not working_memory_mb > 0:
        raise ValueError(f"working_memory_mb must be > 0; got {working_memory_mb!r}")

    n = corr.shape[0]
    index = np.full((n, k), -1, dtype=np.int32)
    values = np.full((n, k), np.nan, dtype=np.float32)
    overlap_out = None if overlap is None else np.zeros((n, k), dtype=overlap.dtype)
    if n == 0:
        return Neighbors(index, values, overlap_out)

    row_bytes = n * (2 * corr.dtype.itemsize + 2)
    block_rows = _chunk_rows(row_bytes, working_memory_mb)
    for row0 in range(0, n, block_rows):
        row1 = min(row0 + block_rows, n)
        block = np.asarray(corr[row0:row1])  # a view for ndarray / memmap input
        rows, cols, rank = _block_top_k(block, row0, k)
        keep = rank < k
        rows, cols, rank = rows[keep], cols[keep], rank[keep]
        index[row0 + rows, rank] = cols
        values[row0 + rows, rank] = block[rows, cols]
        if overlap_out is not None:
            overlap_out[row0 + rows, rank] = overlap[row0 + rows, cols]
    return Neighbors(index, values, overlap_out)
