"""The GEMM floor every kernel benchmark is measured against, timed in the same run.

The floor is one float32 product ``R0ᵀ R0`` of the zero-filled returns ``R0`` (T × N, NaN → 0)
as numpy computes ``R0.T @ R0``: numpy sees the transposed view of the same buffer and calls
BLAS ``ssyrk`` (the upper triangle, then mirrors it), on every core BLAS uses. It is the work
every pairwise statistic over N columns must at least do once (T·N² multiply-adds), so
``stage seconds / floor seconds`` says how far a stage is from that physical limit on *this*
machine at *this* load. Its output is N × N float32 (4 N² bytes of anonymous memory while it
is timed: 2.0 GiB at N = 22,465, 15.3 GiB at N = 64,000).

Used by ``corr-pipeline bench`` (:mod:`corr_pipeline.bench.pipeline`) and by
``benchmarks/bench_correlation.py`` and ``benchmarks/bench_lead_lag.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["FLOOR_REPEAT", "GemmFloor", "best_of", "gemm_floor", "load_average", "measure_floor"]

#: The floor is the best of this many timed products.
FLOOR_REPEAT = 7


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls of ``fn``, seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def load_average() -> tuple[float, float, float] | None:
    """The 1-, 5- and 15-minute load averages, or None where the system does not give them."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    return one, five, fifteen


def gemm_floor(returns: np.ndarray, repeat: int = FLOOR_REPEAT) -> float:
    """Best-of-``repeat`` seconds of ``R0.T @ R0``, ``R0`` = ``returns`` (T × N) with NaN → 0,
    float32 (see the module docstring)."""
    filled = np.nan_to_num(returns, nan=0.0).astype(np.float32)
    return best_of(lambda: filled.T @ filled, repeat)


@dataclass(frozen=True)
class GemmFloor:
    """One floor measurement: the returns' ``t`` × ``n``, best-of-``repeat`` ``seconds``, and the
    load averages when it was taken."""

    n: int
    t: int
    seconds: float
    repeat: int
    load: tuple[float, float, float] | None

    def ratio(self, seconds: float) -> float:
        """``seconds`` in floors: ``seconds / self.seconds``."""
        return seconds / self.seconds

    def line(self) -> str:
        """``floor: R0.T @ R0 float32, N = …, T = …: … s (best of 7); load average …``."""
        load = "unknown" if self.load is None else " ".join(f"{x:.2f}" for x in self.load)
        return (
            f"floor: R0.T @ R0 float32, N = {self.n:,}, T = {self.t}: {self.seconds:.6f} s "
            f"(best of {self.repeat}); load average {load}"
        )


def measure_floor(returns: np.ndarray, repeat: int = FLOOR_REPEAT) -> GemmFloor:
    """:func:`gemm_floor` of ``returns`` with its shape and the load average at the start."""
    t, n = returns.shape
    load = load_average()
    return GemmFloor(n=n, t=t, seconds=gemm_floor(returns, repeat), repeat=repeat, load=load)
