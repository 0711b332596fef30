"""Neighbor turnover between two sessions (SPEC §10.3)."""

from __future__ import annotations

import numpy as np

from corr_pipeline.compute.changes.matching import SymbolMatch
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, row_blocks
from corr_pipeline.compute.validation import check_array, check_working_memory


def neighbor_turnover(
    match: SymbolMatch,
    index_today: np.ndarray,
    index_previous: np.ndarray,
    *,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> tuple[np.ndarray, np.ndarray]:
    """Per common symbol ``p``: ``(n_today[p], n_new[p])``, the number of its neighbors today
    (``index_today`` row, −1 padding excluded) and how many of them were not among its previous
    neighbors (``index_previous`` row), compared by name. Both int64 of ``len(match.common)``.

    ``index_today`` (N_today × k) and ``index_previous`` (N_previous × k') are the top-k arrays of
    SPEC §4 (−1 = padding); k and k' may differ.
    """
    it = check_array(np.asarray(index_today), "index_today", np.integer, ndim=2)
    ip = check_array(np.asarray(index_previous), "index_previous", np.integer, ndim=2)
    check_working_memory(working_memory_mb)
    n = len(match.common)
    n_today = np.zeros(n, np.int64)
    n_new = np.zeros(n, np.int64)
    k_t, k_p = it.shape[1], ip.shape[1]
    # previous neighbors in today's index space (a symbol that left: −1, never equal to a
    # today neighbor, which is >= 0)
    to_today = np.append(match.previous_to_today, -1)  # index −1 (padding) → −1
    for p0, p1 in row_blocks(n, max(1, k_t * k_p) * 2 + 16 * (k_t + k_p), working_memory_mb):
        t = it[match.today_index[p0:p1]].astype(np.int64)
        prev = to_today[ip[match.previous_index[p0:p1]]]
        valid = t >= 0
        seen = (t[:, :, None] == prev[:, None, :]).any(axis=2)
        n_today[p0:p1] = valid.sum(axis=1)
        n_new[p0:p1] = (valid & ~seen).sum(axis=1)
    return n_today, n_new
