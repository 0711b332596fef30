"""The top-k neighbors in stripes of rows, for a runner that maps them over other processes:
:func:`neighbors_stripe` returns the top-k of its rows (N_stripe x k, small), reading them from
the file of ``corr``."""

from __future__ import annotations

import numpy as np

from corr_pipeline.compute.neighbors.rows import Neighbors, check_neighbors_args, fill_top_k_rows
from corr_pipeline.compute.parallel.runners import (
    DEFAULT_STRIPE_ROWS,
    MappedFile,
    StripeRunner,
    stripes_of,
)
from corr_pipeline.compute.tiling import Progress


def neighbors_stripe(
    _R: None,
    stripe: tuple[int, int],
    _token: str,
    k: int,
    corr_file: MappedFile,
    overlap_file: MappedFile | None,
    working_memory_mb: float,
) -> Neighbors:
    """The top-k rows ``stripe`` of the file's ``corr`` (and ``overlap`` at them)."""
    corr = corr_file.open("r")
    overlap = None if overlap_file is None else overlap_file.open("r")
    return fill_top_k_rows(corr, overlap, k, stripe, working_memory_mb)


def striped_neighbors(
    corr: np.ndarray,
    runner: StripeRunner,
    *,
    k: int,
    overlap: np.ndarray | None = None,
    working_memory_mb: float,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
    progress: Progress | None = None,
) -> Neighbors:
    """:func:`~corr_pipeline.compute.neighbors.top_k.top_k_neighbors` of the file-backed
    ``corr``, one :func:`neighbors_stripe` per stripe on ``runner``; identical to it."""
    k = check_neighbors_args(corr, k, overlap, working_memory_mb)
    overlap_file = None if overlap is None else MappedFile.of(overlap)
    stripes = stripes_of(corr.shape[0], stripe_rows)
    parts = runner.map(
        neighbors_stripe,
        None,
        stripes,
        k,
        MappedFile.of(corr),
        overlap_file,
        working_memory_mb,
        progress=progress,
    )
    if not parts:
        return fill_top_k_rows(corr, overlap, k, (0, 0), working_memory_mb)
    return Neighbors(
        np.concatenate([p.index for p in parts]),
        np.concatenate([p.corr for p in parts]),
        None if overlap is None else np.concatenate([p.overlap for p in parts]),
    )


__all__ = ["neighbors_stripe", "striped_neighbors"]
