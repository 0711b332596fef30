"""Shared benchmark helpers: test universes, the GEMM floor, timing, and memory sampling.

Memory: peak RSS (VmHWM) counts memory-mapped pages the process touched;
RssAnon counts only anonymous memory (heap, numpy temporaries). Both are read
from /proc/self/status; the peak of RssAnon is sampled by a thread every 10 ms.
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


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


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@dataclass
class MemoryPeak:
    rss_mib: float
    anon_mib: float


class PeakMemory:
    """Context manager sampling RssAnon (and RSS) peaks above the level at entry."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.base_anon = 0
        self.base_rss = 0
        self.peak_anon = 0
        self.peak_rss = 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_anon = max(self.peak_anon, _status_kib("RssAnon"))
            self.peak_rss = max(self.peak_rss, _status_kib("VmRSS"))
            time.sleep(self.interval)

    def __enter__(self) -> PeakMemory:
        self.base_anon = self.peak_anon = _status_kib("RssAnon")
        self.base_rss = self.peak_rss = _status_kib("VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_anon = max(self.peak_anon, _status_kib("RssAnon"))
        self.peak_rss = max(self.peak_rss, _status_kib("VmRSS"))

    @property
    def above(self) -> MemoryPeak:
        """Peaks above the entry level, MiB."""
        return MemoryPeak(
            (self.peak_rss - self.base_rss) / 1024, (self.peak_anon - self.base_anon) / 1024
        )


def machine_line() -> str:
    """CPU model, cores, memory, numpy and BLAS, for the benchmark tables."""
    model = platform.processor() or "unknown cpu"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, numpy {np.__version__}"


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
