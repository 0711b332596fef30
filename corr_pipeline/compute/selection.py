"""Exact running top-k selections (numba), with ties to the smaller index.

Both selections scan candidates in increasing index order and admit a new
candidate only when it is *strictly* better than the current k-th, so among
equal scores the one seen first (the smaller index) stays: exactly the
"largest score, ties to the smaller index" order of SPEC §4 and §6.
Non-candidates carry the score ``-inf`` and are never admitted.
"""

from __future__ import annotations

from numba import njit, prange


@njit(cache=True, nogil=True, inline="always")
def _insert(scores, indices, k, score, index):  # pragma: no cover - compiled
    """Insert (score, index) into the descending list ``scores[:k]`` if it beats the last."""
    if not score > scores[k - 1]:
        return
    pos = k - 1
    while pos > 0 and score > scores[pos - 1]:
        scores[pos] = scores[pos - 1]
        indices[pos] = indices[pos - 1]
        pos -= 1
    scores[pos] = score
    indices[pos] = index


@njit(parallel=True, cache=True)
def top_k_per_row(scores, k, out_scores, out_index):  # pragma: no cover - compiled
    """For each row r: the k columns with the largest finite score, best first.

    ``out_scores`` (rows × k) must be filled with -inf and ``out_index`` with -1.
    """
    for r in prange(scores.shape[0]):
        row_scores = out_scores[r]
        row_index = out_index[r]
        for c in range(scores.shape[1]):
            _insert(row_scores, row_index, k, scores[r, c], c)


@njit(parallel=True, cache=True)
def merge_top_k_per_column(scores, row0, k, best_scores, best_rows):  # pragma: no cover
    """Fold rows ``row0 ..`` of ``scores`` (rows × N) into each column's running top k.

    ``best_scores`` / ``best_rows`` are N × k, descending; rows arrive in
    increasing order across calls, so strict improvement keeps ties to the smaller row.
    """
    n_cols = scores.shape[1]
    chunk = 256
    for start in prange((n_cols + chunk - 1) // chunk):
        lo = start * chunk
        hi = min(lo + chunk, n_cols)
        for r in range(scores.shape[0]):
            for c in range(lo, hi):
                value = scores[r, c]
                if value > best_scores[c, k - 1]:
                    _insert(best_scores[c], best_rows[c], k, value, row0 + r)
