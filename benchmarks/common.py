"""Shared benchmark helpers, re-exported from the package.

The GEMM floor and best-of timing are :mod:`corr_pipeline.bench.floor` (also behind
``corr-pipeline bench``); memory sampling (:class:`PeakMemory`), the machine line and the git
commit live in :mod:`corr_pipeline.snapshot.measure` and :mod:`corr_pipeline.bench`; the ragged
returns matrix the kernels are timed on is :func:`corr_pipeline.synth.ragged_returns`.
Memory: peak RSS counts memory-mapped pages the process touched; RssAnon counts only anonymous
memory (heap, numpy temporaries). Both are read from /proc/self/status; the peak of RssAnon is
sampled by a thread every 10 ms.
"""

from __future__ import annotations

import argparse

from corr_pipeline.bench import git_commit, machine_line
from corr_pipeline.bench.floor import (
    best_of,
    gemm_floor,
    gemm_floor_times,
    wall_and_cpu_times,
)
from corr_pipeline.snapshot.measure import MemoryPeak, PeakMemory

__all__ = [
    "MemoryPeak",
    "add_universe_arguments",
    "PeakMemory",
    "best_of",
    "gemm_floor",
    "gemm_floor_times",
    "git_commit",
    "machine_line",
    "wall_and_cpu_times",
]


def add_universe_arguments(parser: argparse.ArgumentParser) -> None:
    """``--n --t --min-overlap --ragged-share --gap-share``: the ragged universe the correlation
    benchmarks time (:func:`corr_pipeline.synth.ragged_returns`, seed 1)."""
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--min-overlap", type=int, default=30)
    parser.add_argument("--ragged-share", type=float, default=0.15)
    parser.add_argument("--gap-share", type=float, default=0.005)
