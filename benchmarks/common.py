"""Shared benchmark helpers: test universes, the GEMM floor and timing.

Memory sampling (:class:`PeakMemory`), the machine line and the git commit live in the package
(:mod:`corr_pipeline.bench`, also used by ``corr-pipeline bench``) and are re-exported here.
Memory: peak RSS counts memory-mapped pages the process touched; RssAnon counts only anonymous
memory (heap, numpy temporaries). Both are read from /proc/self/status; the peak of RssAnon is
sampled by a thread every 10 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from corr_pipeline.bench import MemoryPeak, PeakMemory, git_commit, machine_line

__all__ = [
    "MemoryPeak",
    "PeakMemory",
    "best_of",
    "gemm_floor",
    "git_commit",
    "machine_line",
    "ragged_universe",
]


def ragged_universe(
    n_rows: int,
    n_cols: int,
    *,
    seed: int = 0,
    ragged_share: float = 0.15,
    gap_share: float = 0.005,
    n_factors: int = 20,
) -> np.ndarray:
    """Factor-model float32 returns with ``ragged_share`` of columns listed late or delisted
    early (a random 10-60% of the window missing) and ``gap_share`` scattered NaN cells."""
    rng = np.random.default_rng(seed)
    market = rng.standard_normal((n_rows, 1)) * 0.01
    sectors = rng.standard_normal((n_rows, n_factors)) * 0.01
    sector_of = rng.integers(0, n_factors, n_cols)
    returns = (
        market * rng.uniform(0.5, 1.5, n_cols)
        + sectors[:, sector_of] * rng.uniform(0.5, 1.5, n_cols)
        + rng.standard_t(4, (n_rows, n_cols)) * 0.01
    ).astype(np.float32)
    ragged = np.flatnonzero(rng.random(n_cols) < ragged_share)
    missing = (rng.uniform(0.1, 0.6, ragged.size) * n_rows).astype(int)
    late = rng.random(ragged.size) < 0.5
    for col, k, is_late in zip(ragged, missing, late, strict=True):
        if is_late:
            returns[:k, col] = np.nan
        else:
            returns[n_rows - k :, col] = np.nan
    returns[rng.random((n_rows, n_cols)) < gap_share] = np.nan
    return returns


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls, seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_floor(returns: np.ndarray, repeat: int = 3) -> float:
    """Best-of-``repeat`` time of one float32 ``R0.T @ R0`` on the zero-filled returns."""
    filled = np.nan_to_num(returns, nan=0.0).astype(np.float32)
    return best_of(lambda: filled.T @ filled, repeat)
