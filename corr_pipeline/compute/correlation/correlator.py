"""The engine of the correlation (SPEC §3): products of one standardized window's columns on
the fixed tile grid, each turned into ``corr`` and ``overlap`` by the fused pass of
:mod:`~corr_pipeline.compute.correlation.kernels`. The threaded path
(:mod:`~corr_pipeline.compute.correlation.pairwise`) and every stripe of the striped one
(:mod:`~corr_pipeline.compute.correlation.striped`) issue the very same calls, so both write
the same bits."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from corr_pipeline.compute.correlation import kernels
from corr_pipeline.compute.standardize import Side, Standardized
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, overlap_dtype, tiles_covering
from corr_pipeline.compute.validation import check_min_overlap, check_output, check_returns
from corr_pipeline.compute.workers import thread_buffer

_EMPTY_F32 = np.zeros((1, 1), dtype=np.float32)
_EMPTY_I32 = np.zeros((1, 1), dtype=np.int32)


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
        tau = kernels.CORRELATION_TAU
        kernels.correlate_tile(
            (sxy, tile_start, col0, rows[0], rows[1], symmetric, min_overlap, tau),
            # the raw returns column-major: the exact fallback's view
            (w.z, w.present, w.raw.T, w.prefix, w.prefix_sq, w.prefix_count, a.n_rows),
            (a.row0, a.lo, a.hi, a.gap_ptr, a.gap_rows),
            (b.row0, b.lo, b.hi, b.gap_ptr, b.gap_rows, b.total, b.total_sq),
            (out_origin[0], out_origin[1], out_corr, out_overlap),
            (
                thread_buffer(
                    "correlate_tile", (2 * kernels.tile_scratch(rows[1] - rows[0]),), np.float32
                ),
                thread_buffer(
                    "correlate_tile_count", (kernels.tile_scratch(rows[1] - rows[0]),), np.int32
                ),
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


__all__ = ["PairCorrelator", "block_row_bytes", "check_correlation_args"]
