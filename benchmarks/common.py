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

from corr_pipeline.bench import git_commit, machine_line
from corr_pipeline.bench.floor import best_of, gemm_floor
from corr_pipeline.snapshot.measure import MemoryPeak, PeakMemory

__all__ = [
    "MemoryPeak",
    "PeakMemory",
    "best_of",
    "gemm_floor",
    "git_commit",
    "machine_line",
]
