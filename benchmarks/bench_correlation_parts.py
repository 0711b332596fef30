"""Benchmark: where pairwise_correlation's CPU goes, one thread, part by part, same run.

    python benchmarks/bench_correlation_parts.py --n 4000 --t 252
    python benchmarks/bench_correlation_parts.py --n 12000 --t 252

Runs the kernel's work items (tile × product chunk of the upper triangle, as
``pairwise_correlation`` issues them) in this thread with one BLAS thread, and sums the thread
CPU time of each part: standardising the window, the side (intervals, gaps), the float32
products, the fused pass (``kernels.correlate_tile``), the mirror (``transposes.mirror_block`` of
both outputs), and first touch of the two fresh N × N outputs. Best of ``--repeat`` (3) per
part. The physical limit printed below them is one product pass plus writing both outputs once
(``fill`` of already touched arrays), and, for scale, the one-thread SYRK of the whole matrix.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import add_universe_arguments, best_of, git_commit, machine_line
from threadpoolctl import threadpool_limits

from corr_pipeline.compute.correlation import PairCorrelator
from corr_pipeline.compute.standardize import make_side, standardize
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, overlap_dtype
from corr_pipeline.compute.transposes import mirror_block
from corr_pipeline.compute.workers import worker_pool
from corr_pipeline.synth import ragged_returns


def parts(returns: np.ndarray, min_overlap: int) -> dict[str, float]:
    """Thread CPU seconds of each part of one symmetric correlation (module docstring)."""
    n = returns.shape[1]
    clock = time.thread_time
    spent = dict.fromkeys(("standardise", "side", "products", "fused pass", "mirror"), 0.0)
    start = clock()
    window = standardize(returns, layout="correlation")  # as pairwise_correlation does
    spent["standardise"] = clock() - start
    start = clock()
    side = make_side(window, 0, window.n_rows)
    spent["side"] = clock() - start
    start = clock()
    corr = np.empty((n, n), dtype=np.float32)
    overlap = np.empty((n, n), dtype=overlap_dtype(window.n_rows))
    corr.fill(0.0)
    overlap.fill(0)
    spent["first touch of outputs"] = clock() - start
    with worker_pool() as pool:
        correlator = PairCorrelator(window, side, side, pool)
        for tile_start in range(0, n, GEMM_TILE):
            tile_stop = min(tile_start + GEMM_TILE, n)
            for col0 in range(tile_start, n, PRODUCT_COLUMNS):
                col1 = min(col0 + PRODUCT_COLUMNS, n)
                start = clock()
                sxy = correlator.tile_product(tile_start, tile_stop, col0, col1)
                middle = clock()
                correlator.finish_product(
                    sxy,
                    tile_start,
                    col0,
                    (tile_start, tile_stop),
                    True,
                    min_overlap,
                    (0, 0),
                    corr,
                    overlap,
                )
                end = clock()
                mirror_block(corr, tile_start, tile_stop, col0, col1)
                mirror_block(overlap, tile_start, tile_stop, col0, col1)
                spent["products"] += middle - start
                spent["fused pass"] += end - middle
                spent["mirror"] += clock() - end
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_universe_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    returns = ragged_returns(
        args.t, args.n, seed=1, ragged_share=args.ragged_share, gap_share=args.gap_share
    )
    parts(returns[:, :300], args.min_overlap)  # compile / warm up
    print(f"# {machine_line()}; commit {git_commit()}")
    print(f"# N = {args.n}, T = {args.t}; load average {' '.join(map(str, np.round(_load(), 2)))}")
    runs = [parts(returns, args.min_overlap) for _ in range(args.repeat)]
    best = {name: min(run[name] for run in runs) for name in runs[0]}
    for name, seconds in best.items():
        print(f"{name:24s} {seconds:8.3f} s")
    print(f"{'total':24s} {sum(best.values()):8.3f} s")

    corr = np.zeros((args.n, args.n), dtype=np.float32)
    overlap = np.zeros((args.n, args.n), dtype=overlap_dtype(args.t))
    write = best_of(lambda: (corr.fill(0.5), overlap.fill(7)), args.repeat)
    filled = np.nan_to_num(returns, nan=0.0)
    with threadpool_limits(limits=1, user_api="blas"):
        syrk = best_of(lambda: filled.T @ filled, args.repeat)
    print(f"{'write both outputs once':24s} {write:8.3f} s")
    print(f"limit: products + write   {best['products'] + write:8.3f} s")
    print(f"one-thread SYRK R0.T @ R0 {syrk:8.3f} s")
    print(f"# load average {' '.join(map(str, np.round(_load(), 2)))}")


def _load() -> tuple[float, ...]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main()
