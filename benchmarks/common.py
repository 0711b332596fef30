"""Shared benchmark helpers: the GEMM floor and timing.

Memory sampling (:class:`PeakMemory`), the machine line and the git commit live in the package
(:mod:`corr_pipeline.snapshot.measure` and :mod:`corr_pipeline.bench`, also used by ``corr-pipeline bench``) and are re-exported here; the
ragged returns matrix the kernels are timed on is :func:`corr_pipeline.synth.ragged_returns`.
Memory: peak RSS counts memory-mapped pages the process touched; RssAnon counts only anonymous
memory (heap, numpy temporaries). Both are read from /proc/self/status; the peak of RssAnon is
sampled by a thread every 10 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from corr_pipeline.bench import git_commit, machine_line
from corr_pipeline.snapshot.measure import MemoryPeak, PeakMemory

__all__ = [
    "MemoryPeak",
    "PeakMemory",
    "best_of",
    "gemm_floor",
    "gemm_floor_times",
    "git_commit",
    "machine_line",
    "wall_and_cpu_times",
    "wall_times",
]


def wall_and_cpu_times(
    fn: Callable[[], object], repeat: int = 3
) -> tuple[list[float], list[float]]:
    """Wall times and process CPU times (all threads) of ``repeat`` calls, seconds, in call
    order. On a shared machine the CPU time moves less with the load than the wall time."""
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return walls, cpus


def wall_times(fn: Callable[[], object], repeat: int = 3) -> list[float]:
    """Wall times of ``repeat`` calls, seconds, in call order."""
    return wall_and_cpu_times(fn, repeat)[0]


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls, seconds."""
    return min(wall_times(fn, repeat))


def gemm_floor_times(returns: np.ndarray, repeat: int = 3) -> tuple[list[float], list[float]]:
    """Wall and CPU times of ``repeat`` float32 ``R0.T @ R0`` on the zero-filled returns (numpy
    sees the transposed pair and calls a symmetric SYRK, on every BLAS thread)."""
    filled = np.nan_to_num(returns, nan=0.0).astype(np.float32)
    return wall_and_cpu_times(lambda: filled.T @ filled, repeat)


def gemm_floor(returns: np.ndarray, repeat: int = 3) -> float:
    """Best-of-``repeat`` time of one float32 ``R0.T @ R0`` on the zero-filled returns."""
    return min(gemm_floor_times(returns, repeat)[0])
