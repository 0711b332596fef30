"""Pairwise-complete correlation and overlap, tiled in row blocks (SPEC §3).

    overlap[i, j] = #{t : R[t, i] and R[t, j] finite}
    corr[i, j]    = Pearson correlation of R[:, i], R[:, j] over those rows,
                    NaN if overlap < min_overlap or a series is constant there;
    corr[i, i]    = 1 (NaN for a column with < min_overlap finite values or constant).

How (see ``kernels`` for the formula): one float32 product ``Z_Iᵀ Z_J`` per
tile of 128 rows and chunk of 2,048 columns from the tile on (the upper
triangle), then one fused numba pass per chunk that turns it into ``corr`` and
``overlap`` with the prefix sums and gap corrections; chunks run in parallel
threads (``workers``). Each chunk is then mirrored into the block below the
diagonal (8 × 8 register transposes), so ``corr == corr.T`` bit for bit by construction.

Memory at N = 24,000, T = 252 (block of b rows): the standardized window
(4 arrays of T × N float32/int32/uint8 plus 2 of float64, about 175 MB), the
block slab (b × N × 6 bytes), one chunk product (128 × 2,048 × 4 bytes) and the
fused pass's scratch (~1.4 MB) per thread. Nothing is N × N except the outputs, which the
caller may pass as memory-mapped files.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute import kernels
from corr_pipeline.compute.standardize import Side, Standardized, make_side, standardize
from corr_pipeline.compute.tiling import (
    DEFAULT_WORKING_MEMORY_MB,
    GEMM_TILE,
    PRODUCT_COLUMNS,
    overlap_dtype,
    row_blocks,
    tiles_covering,
)
from corr_pipeline.compute.validation import check_min_overlap, check_output, check_returns
from corr_pipeline.compute.workers import thread_buffer, worker_pool

Progress = Callable[[int, int], None]

_EMPTY_F32 = np.zeros((1, 1), dtype=np.float32)
_EMPTY_I32 = np.zeros((1, 1), dtype=np.int32)


@dataclass(frozen=True)
class CorrelationResult:
    """``corr`` (float32 N × N) and ``overlap`` (smallest signed int holding T, N × N)."""

    corr: np.ndarray
    overlap: np.ndarray


class PairCorrelator:
    """Correlates columns of side A against columns of side B of one standardized window.

    Products are issued per aligned tile of ``GEMM_TILE`` A columns against the
    B columns from ``col0`` on (``col0`` = the tile start in the symmetric case,
    0 otherwise), so every value comes from the same product call whatever the
    block size.
    """

    def __init__(self, window: Standardized, a: Side, b: Side, pool: Executor) -> None:
        self.window = window
        self.a = a
        self.b = b
        self.pool = pool

    def tile_product(self, tile_start: int, tile_stop: int, col0: int, col1: int) -> np.ndarray:
        """``Sxy = Z[a0:a0+T', tile]ᵀ Z[b0:b0+T', col0:col1]`` in float32."""
        a, b, w = self.a, self.b, self.window
        left = w.z_t[tile_start:tile_stop, a.row0 : a.row0 + a.n_rows]
        right = w.z[b.row0 : b.row0 + b.n_rows, col0:col1]
        # into the calling thread's buffer (workers.thread_buffer), the same product
        out = thread_buffer("tile_product", (left.shape[0], right.shape[1]), np.float32)
        return np.matmul(left, right, out=out)

    def finish_product(
        self,
        sxy: np.ndarray,
        tile_start: int,
        col0: int,
        rows: tuple[int, int],
        symmetric: bool,
        min_overlap: int,
        out_origin: tuple[int, int],
        out_corr: np.ndarray,
        out_overlap: np.ndarray,
    ) -> None:
        """The fused pass (``kernels.correlate_tile``) of one product: A columns ``rows`` of the
        tile at ``tile_start`` against B columns from ``col0``, written to the outputs."""
        a, b, w = self.a, self.b, self.window
        kernels.correlate_tile(
            symmetric,
            min_overlap,
            kernels.CORRELATION_TAU,
            sxy,
            tile_start,
            col0,
            rows[0],
            rows[1],
            w.z,
            w.present,
            w.raw.T,  # the exact fallback's column-major view of the returns
            w.prefix,
            w.prefix_sq,
            w.prefix_count,
            a.row0,
            a.lo,
            a.hi,
            a.gap_ptr,
            a.gap_rows,
            b.row0,
            b.lo,
            b.hi,
            b.gap_ptr,
            b.gap_rows,
            b.total,
            b.total_sq,
            a.n_rows,
            out_origin[0],
            out_origin[1],
            out_corr,
            out_overlap,
            thread_buffer(
                "correlate_tile", (2 * kernels.tile_scratch(rows[1] - rows[0]),), np.float32
            ),
            thread_buffer(
                "correlate_tile_count", (kernels.tile_scratch(rows[1] - rows[0]),), np.int32
            ),
        )

    def run(
        self,
        rows: tuple[int, int],
        *,
        symmetric: bool,
        min_overlap: int,
        out_origin: tuple[int, int] = (0, 0),
        out_corr: np.ndarray = _EMPTY_F32,
        out_overlap: np.ndarray = _EMPTY_I32,
        after_chunk: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        """Correlate A columns ``rows`` against B (all columns, or ``j >= i`` if symmetric).

        Work items are (tile, chunk of ``PRODUCT_COLUMNS`` B columns); they write disjoint
        parts of the outputs. ``after_chunk(row_lo, row_hi, col_lo, col_hi)`` runs in the
        worker once an item is done.
        """
        w = self.window

        def finish(item: tuple[int, int, int]) -> None:
            tile_start, col0, col1 = item
            tile_stop = min(tile_start + GEMM_TILE, w.n_cols)
            row_lo, row_hi = max(rows[0], tile_start), min(rows[1], tile_stop)
            sxy = self.tile_product(tile_start, tile_stop, col0, col1)
            self.finish_product(
                sxy,
                tile_start,
                col0,
                (row_lo, row_hi),
                symmetric,
                min_overlap,
                out_origin,
                out_corr,
                out_overlap,
            )
            if after_chunk is not None:
                after_chunk(row_lo, row_hi, col0, col1)

        items = [
            (tile_start, col0, min(col0 + PRODUCT_COLUMNS, w.n_cols))
            for tile_start, _ in tiles_covering(rows[0], rows[1])
            for col0 in range(tile_start if symmetric else 0, w.n_cols, PRODUCT_COLUMNS)
        ]
        list(self.pool.map(finish, items))  # list() re-raises a worker's error


def block_row_bytes(n_cols: int, overlap_itemsize: int) -> int:
    """Bytes of the outputs one block row touches (the slab written, then mirrored)."""
    return n_cols * (4 + overlap_itemsize)


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
    corr, overlap = check_correlation_args(R, min_overlap, out_corr, out_overlap)
    n_rows, n_cols = R.shape
    ov_dtype = overlap.dtype
    blocks = row_blocks(
        n_cols, block_row_bytes(n_cols, ov_dtype.itemsize), working_memory_mb, block_rows=block_rows
    )
    with worker_pool() as pool:
        window = standardize(R, pool, transposed=False)
        side = make_side(window, 0, n_rows)
        correlator = PairCorrelator(window, side, side, pool)
        for done, (start, stop) in enumerate(blocks, start=1):
            _correlate_block(correlator, start, stop, min_overlap, corr, overlap)
            if progress is not None:
                progress(done, len(blocks))
    return CorrelationResult(corr=corr, overlap=overlap)


def check_correlation_args(
    R: np.ndarray, min_overlap: int, out_corr: np.ndarray | None, out_overlap: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Validated arguments of :func:`pairwise_correlation`; the outputs, allocated if None."""
    check_returns(R)
    n_rows, n_cols = R.shape
    check_min_overlap(min_overlap, n_rows)
    corr = check_output(out_corr, "out_corr", (n_cols, n_cols), np.dtype(np.float32))
    overlap = check_output(out_overlap, "out_overlap", (n_cols, n_cols), overlap_dtype(n_rows))
    return corr, overlap


def _correlate_block(
    correlator: PairCorrelator,
    start: int,
    stop: int,
    min_overlap: int,
    corr: np.ndarray,
    overlap: np.ndarray,
) -> None:
    """Upper triangle of rows ``[start, stop)`` written in place, each chunk then mirrored below."""
    full_corr, full_overlap = np.asarray(corr), np.asarray(overlap)

    def mirror(row_lo: int, row_hi: int, col_lo: int, col_hi: int) -> None:
        kernels.mirror_block(full_corr, row_lo, row_hi, col_lo, col_hi)
        kernels.mirror_block(full_overlap, row_lo, row_hi, col_lo, col_hi)

    correlator.run(
        (start, stop),
        symmetric=True,
        min_overlap=min_overlap,
        out_corr=full_corr,  # whole (C-contiguous) arrays: the fused pass's row stores vectorise
        out_overlap=full_overlap,
        after_chunk=mirror,
    )


__all__ = ["CorrelationResult", "GEMM_TILE", "pairwise_correlation"]
