"""Register transposes of matrix blocks: plain copies of values, 8 × 8 at a time
(:func:`~corr_pipeline.compute.intrinsics.transpose_block8`), element by element at the
edges. Used by the standardisation (column-major copies of a window), the correlation's mirror
below the diagonal and its striped variant's second pass."""

from __future__ import annotations

from numba import njit

from corr_pipeline.compute.intrinsics import transpose_block8

__all__ = ["mirror_block", "transpose_columns"]


@njit(cache=True, nogil=True)
def transpose_columns(source, first_col, target):  # pragma: no cover - compiled
    """``target[c, r] = source[r, first_col + c]`` for every ``r`` of ``source`` and ``c`` of
    ``target`` (both C-contiguous, of one element type): columns of ``source`` from
    ``first_col`` on become rows of ``target``, in 8 × 8 register transposes
    (``intrinsics.transpose_block8``), element by element at the edges. A plain copy."""
    rows, cols = source.shape[0], target.shape[0]
    for c0 in range(0, cols, 8):
        c1 = min(c0 + 8, cols)
        for r0 in range(0, rows, 8):
            r1 = min(r0 + 8, rows)
            if c1 - c0 == 8 and r1 - r0 == 8:
                transpose_block8(source, r0, first_col + c0, target, c0, r0)
            else:
                for c in range(c0, c1):
                    for r in range(r0, r1):
                        target[c, r] = source[r, first_col + c]


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
