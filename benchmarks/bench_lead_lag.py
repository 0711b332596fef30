"""Benchmark: find_lead_lag_pairs against its floor (one float32 GEMM) and the brute-force scan.

    python benchmarks/bench_lead_lag.py --n 2000 --t 252 --brute-force
    python benchmarks/bench_lead_lag.py --n 6000 --t 350
    python benchmarks/bench_lead_lag.py --n 24000 --t 252 --corr-memmap /tmp/corr_bench/corr.npy

The floor is best of 3 of ``R0.T @ R0`` on the zero-filled returns in the same
run; the target is at most ``10 × max_lag`` floors. ``--brute-force`` also times
the test suite's reference (every lag's full N × N float64 matrix, then
SPEC §6 literally) and checks both give the same pairs. ``--corr-memmap`` passes
the synchronous correlation as a read-only memory map, as the pipeline does
(e.g. the one ``bench_correlation.py --memmap`` left behind for the same N, T).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from common import PeakMemory, best_of, gemm_floor, git_commit, machine_line, ragged_universe

from corr_pipeline.compute import find_lead_lag_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="k_leaders = k_laggers")
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--working-memory-mb", type=float, default=256)
    parser.add_argument("--brute-force", action="store_true")
    parser.add_argument("--corr-memmap", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    returns = ragged_universe(args.t, args.n, seed=1)
    corr = None
    if args.corr_memmap is not None:
        corr = np.load(args.corr_memmap, mmap_mode="r")
        if corr.shape != (args.n, args.n):
            raise SystemExit(f"{args.corr_memmap} is {corr.shape}, expected N = {args.n}")
    params = dict(
        max_lag=args.max_lag,
        k_leaders=args.k,
        k_laggers=args.k,
        min_overlap=args.min_overlap,
    )
    find_lead_lag_pairs(returns[:, :256], **params)  # compile / warm up
    print(f"# {machine_line()}; commit {git_commit()}")
    print(f"# N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k}")

    floor = gemm_floor(returns)
    print(f"floor   R0.T @ R0 float32 (best of 3): {floor:8.3f} s")
    pairs: list[np.ndarray] = []

    def run() -> None:
        pairs[:] = [
            find_lead_lag_pairs(
                returns, corr=corr, working_memory_mb=args.working_memory_mb, **params
            )
        ]

    with PeakMemory() as memory:
        kernel = best_of(run, args.repeat)
    peak = memory.above
    print(
        f"kernel  find_lead_lag_pairs (best of {args.repeat}): {kernel:8.3f} s"
        f"  = {kernel / floor:5.1f} x floor = {kernel / floor / args.max_lag:4.2f} x max_lag floors;"
        f" {pairs[0].size} pairs"
    )
    print(
        f"memory  peak RSS +{peak.rss_mib:,.0f} MiB, peak RssAnon +{peak.anon_mib:,.0f} MiB"
        f" (input {returns.nbytes / 2**20:,.0f} MiB"
        + (", corr memory-mapped" if corr is not None else "")
        + ")"
    )
    if args.brute_force:
        from corr_pipeline_tests.compute.reference import (
            masked_cross_correlation,
            reference_lead_lag,
        )

        start = time.perf_counter()
        sync = masked_cross_correlation(returns, returns, args.min_overlap)[0]
        reference = reference_lead_lag(returns, corr=sync, **params)
        brute = time.perf_counter() - start
        ref = reference.pairs
        ref_pairs = {
            (int(i), int(j), int(lag))
            for i, j, lag in zip(ref["leader"], ref["lagger"], ref["lag"], strict=True)
        }
        got_pairs = {
            (int(i), int(j), int(lag))
            for i, j, lag in zip(
                pairs[0]["leader"], pairs[0]["lagger"], pairs[0]["lag"], strict=True
            )
        }
        print(
            f"brute   full N x N per lag, float64 (once): {brute:8.3f} s"
            f"  = {brute / kernel:5.1f} x slower; pairs identical: {ref_pairs == got_pairs}"
            f" ({len(ref_pairs ^ got_pairs)} differ)"
        )


if __name__ == "__main__":
    main()
