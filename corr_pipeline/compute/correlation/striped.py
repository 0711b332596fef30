"""The correlation in stripes of rows, for a runner that maps them over other processes (Dask).

:func:`correlation_stripe` writes, *in place* into the caller's output files (the memory maps'
files), rows ``[start, stop)`` of ``corr`` and ``overlap`` from the diagonal on; once all of
them are done, :func:`mirror_stripe` writes the same rows left of the diagonal, the transpose
of the column block above them. Together: the bytes the threaded
:func:`~corr_pipeline.compute.correlation.pairwise.pairwise_correlation` writes. Every byte of
the outputs is written by one task, in long runs of contiguous values (one per row; written
column-wise, the mirror would be one short write per row below the stripe,
N² / (2 · stripe_rows) calls), and a task run twice (a retried one) writes the same bytes again.

A stripe writes exactly its byte ranges with ``pwrite`` (never whole pages through a map,
which on a network file system would write back the neighbouring bytes another host wrote; on
a local one, ``pwrite`` into fresh files is also faster than maps).
"""

from __future__ import annotations

import os

import numpy as np

from corr_pipeline.compute.correlation.correlator import PairCorrelator, check_correlation_args
from corr_pipeline.compute.parallel.runners import (
    InlineExecutor,
    MappedFile,
    StripeContext,
    StripeRunner,
    budget_stripe_rows,
    stripe_context,
    stripes_of,
)
from corr_pipeline.compute.standardize import make_side
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, GEMM_TILE, Progress
from corr_pipeline.compute.transposes import transpose_columns
from corr_pipeline.compute.workers import thread_buffer

CORRELATION_STRIPE_ROWS = 16 * GEMM_TILE
"""The most rows per correlation stripe: the second pass reads the column block above its rows
back from the file, ``stripe_rows`` values of each row above it, which 512-row stripes read in
runs too short to keep up with the threads. Its buffers are up to 2 x 2,048 x N x 6 bytes
per worker thread (~590 MB at N = 24,000, ~1.6 GB at 64,000)."""


def _correlator(context: StripeContext) -> PairCorrelator:
    """The synchronous correlator of the call's window (whole window on both sides)."""
    found = context.derived.get("correlator")
    if found is None:
        w = context.window
        side = make_side(w, 0, w.z.shape[0])
        found = context.derived["correlator"] = PairCorrelator(w, side, side, InlineExecutor())
    return found


def correlation_stripe(
    R: np.ndarray,
    stripe: tuple[int, int],
    token: str,
    min_overlap: int,
    corr_file: MappedFile,
    overlap_file: MappedFile,
) -> None:
    """Rows ``[start, stop)`` of ``corr`` / ``overlap`` from column ``start`` on, written in
    place into the two files: every pair of the stripe's rows with a column at or right of
    them (the first of the two passes of :func:`striped_correlation`).

    By the same work items as the threaded path (one product per tile and column chunk), the
    strictly lower triangle of the diagonal block then copied from its upper one, as the
    threaded path mirrors it. Into the thread's reused buffers
    (:func:`~corr_pipeline.compute.workers.thread_buffer`: at most the first stripe's rows,
    ``stripe_rows x N x 6`` bytes at T >= 128, 295 MB at N = 24,000), then one ``pwrite`` per
    row.
    """
    context = stripe_context(token, R)
    start, stop = stripe
    n = corr_file.shape[0]
    upper = [
        thread_buffer(f"upper-{i}", (stop - start, n - start), f.dtype)
        for i, f in enumerate((corr_file, overlap_file))
    ]
    _correlator(context).run(
        stripe,
        symmetric=True,
        min_overlap=min_overlap,
        out_origin=(start, start),
        out_corr=upper[0],
        out_overlap=upper[1],
    )
    below = np.tril_indices(stop - start, -1)
    for file, block in zip((corr_file, overlap_file), upper, strict=True):
        diagonal = block[:, : stop - start]
        diagonal[below] = diagonal.T[below]
        _write_rows(file, block, start, start)


def mirror_stripe(
    _shared: None,
    stripe: tuple[int, int],
    token: str,
    corr_file: MappedFile,
    overlap_file: MappedFile,
) -> None:
    """Rows ``[start, stop)`` of ``corr`` / ``overlap`` left of column ``start``: the transpose
    of the column block ``matrix[:start, start:stop]`` that the first pass wrote (the second
    pass of :func:`striped_correlation`, once every stripe of the first is done), read from a
    map of the file and written back as one contiguous run per row. A plain copy of values, so
    the matrices are exactly symmetric, as the threaded path's."""
    start, stop = stripe
    if start == 0:
        return
    for i, file in enumerate((corr_file, overlap_file)):
        above = file.open_columns()
        lower = thread_buffer(f"lower-{i}", (stop - start, start), np.dtype(file.dtype))
        transpose_columns(above[:start], start, lower)
        del above
        _write_rows(file, lower, start, 0)


def _write_rows(file: MappedFile, rows: np.ndarray, first_row: int, first_col: int) -> None:
    """``matrix[first_row + r, first_col : first_col + width] = rows[r]`` in ``file``, with
    ``os.pwrite`` of exactly those byte ranges; the caller's map of the file sees them at once."""
    if rows.size == 0:
        return
    n, itemsize = file.shape[1], rows.itemsize
    width = rows.shape[1] * itemsize
    flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
    fd = os.open(file.path, os.O_WRONLY)
    try:
        for r in range(rows.shape[0]):
            at = file.offset + ((first_row + r) * n + first_col) * itemsize
            _write_exactly(fd, flat[r * width : (r + 1) * width], at, file.path)
    finally:
        os.close(fd)


def _write_exactly(fd: int, data: memoryview, at: int, path: str) -> None:
    if os.pwrite(fd, data, at) != data.nbytes:
        raise OSError(f"short write into {path} at byte {at}")


def striped_correlation(
    R: np.ndarray,
    runner: StripeRunner,
    *,
    min_overlap: int,
    out_corr: np.ndarray,
    out_overlap: np.ndarray,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    stripe_rows: int | None = None,
    progress: Progress | None = None,
) -> None:
    """:func:`~corr_pipeline.compute.correlation.pairwise.pairwise_correlation` into the file-backed
    ``out_corr`` / ``out_overlap`` on ``runner``, in two passes over the stripes: every
    :func:`correlation_stripe` (its rows from the diagonal on), then every :func:`mirror_stripe`
    (its rows left of the diagonal, the transpose of what the first pass wrote above it), so
    that every write is a long contiguous run of a row; bit-identical to the threaded function.
    ``stripe_rows`` (default: the tiles whose buffers fit ``working_memory_mb`` in a worker
    thread, at most :data:`CORRELATION_STRIPE_ROWS`) does not change the result.
    ``progress(done, tasks)`` after each task of either pass."""
    check_correlation_args(R, min_overlap, out_corr, out_overlap)
    n = R.shape[1]
    if stripe_rows is None:
        row_bytes = n * (out_corr.itemsize + out_overlap.itemsize)
        stripe_rows = budget_stripe_rows(row_bytes, working_memory_mb, n, CORRELATION_STRIPE_ROWS)
    stripes = stripes_of(n, stripe_rows)
    below = [stripe for stripe in stripes if stripe[0] > 0]
    tasks = len(stripes) + len(below)
    files = (MappedFile.of(out_corr), MappedFile.of(out_overlap))

    def offset(first: int) -> Progress | None:
        if progress is None:
            return None
        return lambda done, _total: progress(first + done, tasks)

    runner.map(correlation_stripe, R, stripes, min_overlap, *files, progress=offset(0))
    runner.map(mirror_stripe, None, below, *files, progress=offset(len(stripes)))


__all__ = [
    "CORRELATION_STRIPE_ROWS",
    "correlation_stripe",
    "mirror_stripe",
    "striped_correlation",
]
