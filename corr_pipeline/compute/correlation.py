"""Pairwise-complete correlation and overlap, tiled in row blocks (SPEC §3).

    overlap[i, j] = #{t : R[t, i] and R[t, j] finite}
    corr[i, j]    = Pearson correlation of R[:, i], R[:, j] over those rows,
                    NaN if overlap < min_overlap or a series is constant there;
    corr[i, i]    = 1 (NaN for a column with < min_overlap finite values or constant).

How (see ``kernels`` for the formula): one float32 product ``Z_Iᵀ Z_J`` per
tile of 128 rows against the columns from the tile on (the upper triangle),
small products for the columns with many gaps, and one fused numba pass per
tile that applies the gap corrections and writes ``corr`` and ``overlap``.
Each row block's upper-triangle slab is written, then mirrored into the
columns below it, so ``corr == corr.T`` bit for bit by construction.

Memory at N = 24,000, T = 252 (block of b rows): the standardized window
(~5 arrays of T × N float32/uint8, about 100 MB), the block slab
(b × N × 6 bytes), the tile products (128 × N × 4 bytes, plus 3 × 128 × d
for d dense-gap columns) and a row buffer per thread. Nothing is N × N
except the outputs, which the caller may pass as memory-mapped files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute import kernels
from corr_pipeline.compute.standardize import Side, make_side, standardize
from corr_pipeline.compute.tiling import (
    DEFAULT_WORKING_MEMORY_MB,
    GEMM_TILE,
    overlap_dtype,
    resolve_block_rows,
    row_blocks,
    tiles_covering,
)
from corr_pipeline.compute.validation import check_min_overlap, check_output, check_returns

Progress = Callable[[int, int], None]

_EMPTY_F32 = np.zeros((1, 1), dtype=np.float32)
_EMPTY_I8 = np.zeros((1, 1), dtype=np.int8)
_EMPTY_I32 = np.zeros((1, 1), dtype=np.int32)


@dataclass(frozen=True)
class CorrelationResult:
    """``corr`` (float32 N × N) and ``overlap`` (smallest signed int holding T, N × N)."""

    corr: np.ndarray
    overlap: np.ndarray


@dataclass(frozen=True)
class TileProducts:
    """The matrix products of one tile: rows ``[row0, row0 + m)`` × columns ``[col0, N)``."""

    row0: int
    col0: int
    sxy: np.ndarray
    x_sum: np.ndarray
    x_sq: np.ndarray
    x_count: np.ndarray
    b_dense_local: np.ndarray
    y_sum: np.ndarray
    y_sq: np.ndarray
    a_dense_local: np.ndarray


def tile_products(a: Side, b: Side, row0: int, row1: int, col0: int) -> TileProducts:
    """Products for A columns ``[row0, row1)`` against B columns ``[col0, N)``.

    ``Sxy = Z_A[:, I]ᵀ Z_B[:, J]``; for dense-gap B columns ``[Z_A; Z_A²; M_A][:, I]ᵀ M_B``;
    for dense-gap A columns in ``I``, ``M_A[:, I_d]ᵀ [Z_B, Z_B²][:, J]``. Shapes depend
    only on the tile, which keeps results independent of the block size.
    """
    za = a.z_t[row0:row1]
    zb = b.z[:, col0:]
    sxy = za @ zb

    dense_start = int(np.searchsorted(b.dense_cols, col0))
    dense_b = b.dense_pos[col0:]
    b_dense_local = np.where(dense_b >= 0, dense_b - dense_start, -1)
    if dense_start < b.dense_cols.size:
        m = row1 - row0
        stacked = np.concatenate(
            [za, np.square(za), a.present_t[row0:row1].astype(np.float32)], axis=0
        )
        x_all = stacked @ b.dense_present[:, dense_start:]
        x_sum, x_sq, x_count = x_all[:m], x_all[m : 2 * m], x_all[2 * m :]
    else:
        x_sum = x_sq = x_count = _EMPTY_F32

    dense_a = a.dense_pos[row0:row1]
    is_dense_row = dense_a >= 0
    if is_dense_row.any():
        mask_rows = a.dense_present_t[dense_a[is_dense_row]]
        y_sum = mask_rows @ zb
        y_sq = mask_rows @ b.z_sq[:, col0:]
        a_dense_local = np.where(is_dense_row, np.cumsum(is_dense_row) - 1, -1)
    else:
        y_sum = y_sq = _EMPTY_F32
        a_dense_local = np.full(row1 - row0, -1, dtype=np.int64)
    return TileProducts(
        row0, col0, sxy, x_sum, x_sq, x_count, b_dense_local, y_sum, y_sq, a_dense_local
    )


def run_tile(
    products: TileProducts,
    a: Side,
    b: Side,
    *,
    mode: int,
    symmetric: bool,
    rows: tuple[int, int],
    min_overlap: int,
    out_origin: tuple[int, int] = (0, 0),
    out_corr: np.ndarray = _EMPTY_F32,
    out_overlap: np.ndarray = _EMPTY_I32,
    lag: int = 0,
    best: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """Run the fused kernel on rows ``rows`` of one tile (see ``kernels.correlate_tile``)."""
    best_abs, best_corr, best_lag, best_overlap = best or (
        _EMPTY_F32,
        _EMPTY_F32,
        _EMPTY_I8,
        _EMPTY_I32,
    )
    kernels.correlate_tile(
        mode,
        symmetric,
        products.row0,
        rows[0],
        rows[1],
        products.col0,
        min_overlap,
        kernels.FALLBACK_TAU,
        products.sxy,
        products.x_sum,
        products.x_sq,
        products.x_count,
        products.b_dense_local,
        products.y_sum,
        products.y_sq,
        products.a_dense_local,
        a.z_t,
        a.present_t,
        a.raw_t,
        a.col_sum,
        a.col_sq_sum,
        a.count,
        a.gap_ptr,
        a.gap_rows,
        b.z,
        b.z_sq,
        b.raw_t,
        b.col_sum,
        b.col_sq_sum,
        b.gap_ptr,
        b.gap_rows,
        out_origin[0],
        out_origin[1],
        out_corr,
        out_overlap,
        lag,
        best_abs,
        best_corr,
        best_lag,
        best_overlap,
    )


def block_row_bytes(n_cols: int, overlap_itemsize: int) -> int:
    """Bytes one block row keeps alive: slab (corr + overlap) plus its share of tile products."""
    return n_cols * (4 + overlap_itemsize) + n_cols * 4 * 2


def pairwise_correlation(
    R: np.ndarray,
    *,
    min_overlap: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    block_rows: int | None = None,
    out_corr: np.ndarray | None = None,
    out_overlap: np.ndarray | None = None,
    progress: Progress | None = None,
) -> CorrelationResult:
    """Pairwise-complete correlation and overlap of the columns of ``R`` (SPEC §3).

    Parameters
    ----------
    R : float32 array (T, N), NaN where a return is missing.
    min_overlap : pairs with fewer common finite rows get NaN (2 <= min_overlap <= T).
    working_memory_mb : budget for the per-block temporaries; sets the block height.
    block_rows : explicit block height (overrides the budget); results do not depend on it.
    out_corr, out_overlap : arrays to fill (e.g. ``np.lib.format.open_memmap``), shapes
        (N, N), dtypes float32 and ``overlap_dtype(T)``; allocated when not given.
    progress : called as ``progress(blocks_done, blocks_total)`` after each block.
    """
    check_returns(R)
    n_rows, n_cols = R.shape
    check_min_overlap(min_overlap, n_rows)
    ov_dtype = overlap_dtype(n_rows)
    corr = check_output(out_corr, "out_corr", (n_cols, n_cols), np.dtype(np.float32))
    overlap = check_output(out_overlap, "out_overlap", (n_cols, n_cols), ov_dtype)
    rows_per_block = resolve_block_rows(
        block_rows, block_row_bytes(n_cols, ov_dtype.itemsize), working_memory_mb, n_cols
    )
    side = make_side(standardize(R), 0, n_rows)
    blocks = row_blocks(n_cols, rows_per_block)
    for done, (start, stop) in enumerate(blocks, start=1):
        _correlate_block(side, start, stop, min_overlap, corr, overlap)
        if progress is not None:
            progress(done, len(blocks))
    return CorrelationResult(corr=corr, overlap=overlap)


def _correlate_block(
    side: Side, start: int, stop: int, min_overlap: int, corr: np.ndarray, overlap: np.ndarray
) -> None:
    """Upper-triangle slab of rows ``[start, stop)``, mirrored into the columns below."""
    n_cols = corr.shape[0]
    height = stop - start
    slab_corr = np.empty((height, n_cols - start), dtype=np.float32)
    slab_overlap = np.empty((height, n_cols - start), dtype=overlap.dtype)
    for tile_start, tile_stop in tiles_covering(start, stop):
        tile_stop = min(tile_stop, n_cols)
        products = tile_products(side, side, tile_start, tile_stop, tile_start)
        run_tile(
            products,
            side,
            side,
            mode=kernels.MODE_WRITE,
            symmetric=True,
            rows=(max(start, tile_start), min(stop, tile_stop)),
            min_overlap=min_overlap,
            out_origin=(start, start),
            out_corr=slab_corr,
            out_overlap=slab_overlap,
        )
    lower = np.tril_indices(height, -1)
    for slab in (slab_corr, slab_overlap):
        square = slab[:, :height]
        square[lower] = square.T[lower]
    corr[start:stop, start:] = slab_corr
    overlap[start:stop, start:] = slab_overlap
    corr[stop:, start:stop] = slab_corr[:, height:].T
    overlap[stop:, start:stop] = slab_overlap[:, height:].T


__all__ = ["CorrelationResult", "GEMM_TILE", "pairwise_correlation"]
