"""Benchmark: publishing one snapshot (SPEC §7) at full size, per phase and per table.

A thin wrapper around ``corr-pipeline bench --publish-only`` (the logic is
:func:`corr_pipeline.bench.run_publish_benchmark`): random results with the pipeline's dtypes
for N symbols (N × k neighbors, N cluster labels, ≈ 2·N·k lead-lag pairs) are published three
times into the benchmark database — an earlier date, a new date, the same date again
(replacing it) — and each call's timings are printed::

    python benchmarks/bench_publish.py --n 24000 --k 10
"""

from __future__ import annotations

import sys

from corr_pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--publish-only", *sys.argv[1:]]))
