"""Benchmark: the whole nightly chain, database to publish, stage by stage.

A thin wrapper around ``corr-pipeline bench`` (the logic is :mod:`corr_pipeline.bench`);
every option of the command works here::

    python benchmarks/bench_pipeline.py --n 6000 --t 350
    python benchmarks/bench_pipeline.py --n 24000 --t 252 --home /tmp/corr_bench_home
    python benchmarks/bench_pipeline.py --help
"""

from __future__ import annotations

import sys

from corr_pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
