"""Benchmark: pairwise_correlation against its floor (one float32 GEMM) and pandas, same run.

    python benchmarks/bench_correlation.py --n 4000 --t 252 --pandas
    python benchmarks/bench_correlation.py --n 24000 --t 252 --memmap /tmp/corr_bench

Universe: factor model with 15% ragged symbols and 0.5% scattered gaps
(:func:`corr_pipeline.synth.ragged_returns`). Floor: best of 7 of ``R0.T @ R0`` on the
zero-filled returns, timed in the same process just before the kernel.
With ``--memmap DIR`` the outputs are ``.npy`` memory maps in DIR (as the
pipeline does) and the table shows peak RSS and peak RssAnon above the
level before the call.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
from common import PeakMemory, git_commit, machine_line

from corr_pipeline.bench.floor import FLOOR_REPEAT, best_of, gemm_floor
from corr_pipeline.compute import pairwise_correlation
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, overlap_dtype
from corr_pipeline.synth import ragged_returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--working-memory-mb", type=float, default=DEFAULT_WORKING_MEMORY_MB)
    parser.add_argument("--pandas", action="store_true", help="also time pandas.DataFrame.corr")
    parser.add_argument("--memmap", type=Path, help="write outputs as .npy memory maps here")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    returns = ragged_returns(args.t, args.n, seed=1)
    pairwise_correlation(returns[:, :256], min_overlap=args.min_overlap)  # compile / warm up
    print(f"# {machine_line()}; commit {git_commit()}")
    print(f"# N = {args.n}, T = {args.t}, min_overlap = {args.min_overlap}")

    floor = gemm_floor(returns)
    print(f"floor   R0.T @ R0 float32 (best of {FLOOR_REPEAT}): {floor:8.3f} s")

    def run() -> None:
        out_corr = out_overlap = None
        if args.memmap is not None:
            shutil.rmtree(args.memmap, ignore_errors=True)
            args.memmap.mkdir(parents=True)
            shape = (args.n, args.n)
            out_corr = np.lib.format.open_memmap(
                args.memmap / "corr.npy", mode="w+", dtype=np.float32, shape=shape
            )
            out_overlap = np.lib.format.open_memmap(
                args.memmap / "overlap.npy", mode="w+", dtype=overlap_dtype(args.t), shape=shape
            )
        result = pairwise_correlation(
            returns,
            min_overlap=args.min_overlap,
            working_memory_mb=args.working_memory_mb,
            out_corr=out_corr,
            out_overlap=out_overlap,
        )
        if args.memmap is not None:
            result.corr.flush()
            result.overlap.flush()
        del result

    with PeakMemory() as memory:
        kernel = best_of(run, args.repeat)
    peak = memory.above
    print(
        f"kernel  pairwise_correlation (best of {args.repeat}): {kernel:8.3f} s"
        f"  = {kernel / floor:5.2f} x floor"
    )
    print(
        f"memory  peak RSS +{peak.rss_mib:,.0f} MiB, peak RssAnon +{peak.anon_mib:,.0f} MiB"
        f" (input {returns.nbytes / 2**20:,.0f} MiB)"
    )
    if args.pandas:
        import pandas as pd

        frame = pd.DataFrame(returns.astype(np.float64))
        start = time.perf_counter()
        frame.corr(min_periods=args.min_overlap)
        pandas_s = time.perf_counter() - start
        print(
            f"pandas  DataFrame.corr(min_periods) (once): {pandas_s:8.3f} s"
            f"  = {pandas_s / kernel:5.1f} x slower than the kernel"
        )


if __name__ == "__main__":
    main()
