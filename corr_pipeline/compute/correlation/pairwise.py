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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from corr_pipeline.compute.correlation.correlator import (
    PairCorrelator,
    block_row_bytes,
    check_correlation_args,
)
from corr_pipeline.compute.correlation.striped import striped_correlation
from corr_pipeline.compute.standardize import make_side, standardize
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, Progress, row_blocks
from corr_pipeline.compute.transposes import mirror_block
from corr_pipeline.compute.workers import worker_pool

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.runners import StripeRunner


@dataclass(frozen=True)
class CorrelationResult:
    """``corr`` (float32 N × N) and ``overlap`` (smallest signed int holding T, N × N)."""

    corr: np.ndarray
    overlap: np.ndarray


def pairwise_correlation(
    R: np.ndarray,
    *,
    min_overlap: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    block_rows: int | None = None,
    out_corr: np.ndarray | None = None,
    out_overlap: np.ndarray | None = None,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
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
    progress : called as ``progress(blocks_done, blocks_total)`` after each block (stripe).
    runner : None computes on this process's threads; a
        :class:`~corr_pipeline.compute.parallel.runners.StripeRunner` computes on its stripes
        (:func:`~corr_pipeline.compute.correlation.striped.striped_correlation`; the outputs
        must then be file-backed memory maps every worker can open). Same bits either way.

    Examples
    --------
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> result = pairwise_correlation(R, min_overlap=60)
    >>> result.corr.astype(float).round(2).tolist()
    [[1.0, 0.73, 0.06, 0.04], [0.73, 1.0, 0.1, 0.04], [0.06, 0.1, 1.0, -0.04], [0.04, 0.04, -0.04, 1.0]]
    >>> result.overlap[2].tolist()  # symbol 2's common finite returns
    [230, 230, 230, 230]
    """
    if runner is not None:
        if out_corr is None or out_overlap is None:
            raise ValueError("a striped correlation needs out_corr and out_overlap (memory maps)")
        striped_correlation(
            R,
            runner,
            min_overlap=min_overlap,
            out_corr=out_corr,
            out_overlap=out_overlap,
            working_memory_mb=working_memory_mb,
            progress=progress,
        )
        return CorrelationResult(corr=out_corr, overlap=out_overlap)
    corr, overlap = check_correlation_args(R, min_overlap, out_corr, out_overlap)
    n_rows, n_cols = R.shape
    ov_dtype = overlap.dtype
    blocks = row_blocks(
        n_cols, block_row_bytes(n_cols, ov_dtype.itemsize), working_memory_mb, block_rows=block_rows
    )
    with worker_pool() as pool:
        window = standardize(R, pool, layout="correlation")
        side = make_side(window, 0, n_rows)
        correlator = PairCorrelator(window, side, side, pool)
        for done, (start, stop) in enumerate(blocks, start=1):
            _correlate_block(correlator, start, stop, min_overlap, corr, overlap)
            if progress is not None:
                progress(done, len(blocks))
    return CorrelationResult(corr=corr, overlap=overlap)


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
        mirror_block(full_corr, row_lo, row_hi, col_lo, col_hi)
        mirror_block(full_overlap, row_lo, row_hi, col_lo, col_hi)

    correlator.run(
        (start, stop),
        symmetric=True,
        min_overlap=min_overlap,
        out_corr=full_corr,  # whole (C-contiguous) arrays: the fused pass's row stores vectorise
        out_overlap=full_overlap,
        after_chunk=mirror,
    )


__all__ = ["CorrelationResult", "pairwise_correlation"]
