"""Benchmark: pairwise_correlation against its floor (one float32 SYRK) and pandas, same run.

    python benchmarks/bench_correlation.py --n 4000 --t 252 --pandas --memmap /tmp/corr_bench
    python benchmarks/bench_correlation.py --n 24000 --t 252 --memmap /tmp/corr_bench

Universe: factor model with 15% ragged symbols and 0.5% scattered gaps
(:func:`corr_pipeline.synth.ragged_returns`; ``--ragged-share`` / ``--gap-share`` change them).
Floor: ``R0.T @ R0`` on the zero-filled float32 returns as numpy computes it (a symmetric
SYRK on every BLAS thread), best of ``--floor-repeat`` (7), timed in the same process just
before the kernel; for reference also on one BLAS thread. Kernel: best of ``--repeat`` (3),
after two untimed calls at full size (a process's first calls are slower), with
the outputs in memory and, with ``--memmap DIR``, as ``.npy`` memory maps in DIR (as the
pipeline does; created fresh and flushed inside each timed call). Each kernel line
shows peak RSS and peak RssAnon above the level before the call. pandas
(``DataFrame.corr(min_periods=min_overlap)`` in float64) is timed once with ``--pandas``.

Before/after in the same run: ``--compare DIR`` also times the kernel of the package in DIR
(e.g. ``git worktree add /tmp/corr_base <commit>``), in a child process with ``PYTHONPATH=DIR``
on the same universe, alternating with this tree's kernel (base, this, base, this, ... one
call each, ``--repeat`` rounds), both against the floor measured here.

    python benchmarks/bench_correlation.py --n 4000 --pandas --compare /tmp/corr_base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import (
    PeakMemory,
    add_universe_arguments,
    gemm_floor_times,
    git_commit,
    machine_line,
    wall_and_cpu_times,
)
from threadpoolctl import threadpool_limits

import corr_pipeline
from corr_pipeline.compute import pairwise_correlation
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, overlap_dtype
from corr_pipeline.synth import ragged_returns


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _figures(walls: list[float], cpus: list[float]) -> str:
    return (
        f"wall best {min(walls):8.3f} s  median {float(np.median(walls)):8.3f} s;"
        f" CPU best {min(cpus):7.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_universe_arguments(parser)
    parser.add_argument("--working-memory-mb", type=float, default=DEFAULT_WORKING_MEMORY_MB)
    parser.add_argument("--pandas", action="store_true", help="also time pandas.DataFrame.corr")
    parser.add_argument("--memmap", type=Path, help="also time outputs as .npy memory maps here")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--floor-repeat", type=int, default=7)
    parser.add_argument(
        "--compare", type=Path, help="also time the package in this directory, alternating"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    returns = ragged_returns(
        args.t, args.n, seed=1, ragged_share=args.ragged_share, gap_share=args.gap_share
    )
    pairwise_correlation(returns[:, :256], min_overlap=args.min_overlap)  # compile
    # and two untimed calls at full size: a process's first calls are slower while its heap
    # grows (N = 4,000: ~2.5 times the steady call, then ~1.15 times), as the floor's first
    # products are among its seven
    for _ in range(2):
        pairwise_correlation(
            returns, min_overlap=args.min_overlap, working_memory_mb=args.working_memory_mb
        )
    if args.child:
        _serve_calls(returns, args.min_overlap, args.working_memory_mb)
        return
    full_history = float(np.isfinite(returns).all(axis=0).mean())
    print(f"# {machine_line()}; commit {git_commit()}")
    print(f"# code {Path(corr_pipeline.__file__).parent}")
    print(
        f"# N = {args.n}, T = {args.t}, min_overlap = {args.min_overlap}, ragged share"
        f" {args.ragged_share}, gap share {args.gap_share}: {full_history:.0%} of columns"
        f" full-history; {_load()}"
    )

    floor_walls, floor_cpus = gemm_floor_times(returns, args.floor_repeat)
    floor, floor_cpu = min(floor_walls), min(floor_cpus)
    print(f"floor   R0.T @ R0 SYRK (of {args.floor_repeat}): {_figures(floor_walls, floor_cpus)}")
    with threadpool_limits(limits=1, user_api="blas"):
        one_thread = gemm_floor_times(returns, max(1, args.floor_repeat // 2))
    print(f"        one BLAS thread:      {_figures(*one_thread)}")

    def outputs(memmap: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        if not memmap:
            return None, None
        shutil.rmtree(args.memmap, ignore_errors=True)
        args.memmap.mkdir(parents=True)
        shape = (args.n, args.n)
        return (
            np.lib.format.open_memmap(
                args.memmap / "corr.npy", mode="w+", dtype=np.float32, shape=shape
            ),
            np.lib.format.open_memmap(
                args.memmap / "overlap.npy", mode="w+", dtype=overlap_dtype(args.t), shape=shape
            ),
        )

    def run(memmap: bool) -> Callable[[], None]:
        def call() -> None:
            out_corr, out_overlap = outputs(memmap)
            result = pairwise_correlation(
                returns,
                min_overlap=args.min_overlap,
                working_memory_mb=args.working_memory_mb,
                out_corr=out_corr,
                out_overlap=out_overlap,
            )
            if memmap:
                result.corr.flush()
                result.overlap.flush()

        return call

    kernel = float("inf")
    for memmap in (False, True) if args.memmap is not None else (False,):
        with PeakMemory() as memory:
            times, cpus = wall_and_cpu_times(run(memmap), args.repeat)
        peak = memory.above
        where = "memory maps" if memmap else "in memory  "
        print(
            f"kernel  {where} (of {args.repeat}):   {_figures(times, cpus)}\n"
            f"        = {min(times) / floor:5.2f} x floor wall (median"
            f" {np.median(times) / floor:5.2f}), {min(cpus) / floor_cpu:5.2f} x floor CPU"
        )
        print(
            f"        peak RSS +{peak.rss_mib:,.0f} MiB, peak RssAnon +{peak.anon_mib:,.0f} MiB"
            f" (input {returns.nbytes / 2**20:,.0f} MiB)"
        )
        if not memmap:
            kernel = min(times)
    if args.compare is not None:
        _compare(args, returns, floor, floor_cpu)
    if args.pandas:
        import pandas as pd

        frame = pd.DataFrame(returns.astype(np.float64))
        start = time.perf_counter()
        frame.corr(min_periods=args.min_overlap)
        pandas_s = time.perf_counter() - start
        print(
            f"pandas  DataFrame.corr(min_periods={args.min_overlap}) (once): {pandas_s:8.3f} s"
            f"  = {pandas_s / kernel:5.1f} x the in-memory kernel"
        )
    print(f"# {_load()}")


def _serve_calls(returns: np.ndarray, min_overlap: int, working_memory_mb: float) -> None:
    """Child of ``--compare``: one timed in-memory call per line read on stdin, answered as
    ``{"wall": s, "cpu": s}`` on stdout (wall and process CPU seconds)."""
    print(json.dumps({"code": str(Path(corr_pipeline.__file__).parent)}), flush=True)
    for _ in sys.stdin:
        walls, cpus = wall_and_cpu_times(
            lambda: pairwise_correlation(
                returns, min_overlap=min_overlap, working_memory_mb=working_memory_mb
            ),
            1,
        )
        print(json.dumps({"wall": walls[0], "cpu": cpus[0]}), flush=True)


def _compare(args: argparse.Namespace, returns: np.ndarray, floor: float, floor_cpu: float) -> None:
    """This tree's in-memory kernel and the one in ``args.compare``, alternating call by call."""
    command = [sys.executable, __file__, "--child", "--n", str(args.n), "--t", str(args.t)]
    command += ["--min-overlap", str(args.min_overlap), "--ragged-share", str(args.ragged_share)]
    command += ["--gap-share", str(args.gap_share)]
    command += ["--working-memory-mb", str(args.working_memory_mb)]
    env = dict(os.environ, PYTHONPATH=str(args.compare))
    with subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        base_code = json.loads(child.stdout.readline())["code"]
        times: dict[str, list[tuple[float, float]]] = {"base": [], "this": []}
        for _ in range(args.repeat):
            child.stdin.write("call\n")
            child.stdin.flush()
            answer = json.loads(child.stdout.readline())
            times["base"].append((answer["wall"], answer["cpu"]))
            walls, cpus = wall_and_cpu_times(
                lambda: pairwise_correlation(
                    returns, min_overlap=args.min_overlap, working_memory_mb=args.working_memory_mb
                ),
                1,
            )
            times["this"].append((walls[0], cpus[0]))
        child.stdin.close()
    for name, code in (("base", base_code), ("this", str(Path(corr_pipeline.__file__).parent))):
        walls = [wall for wall, _ in times[name]]
        cpus = [cpu for _, cpu in times[name]]
        print(
            f"compare {name} ({code}), alternating (of {args.repeat}): {_figures(walls, cpus)}\n"
            f"        = {min(walls) / floor:5.2f} x floor wall (median"
            f" {np.median(walls) / floor:5.2f}), {min(cpus) / floor_cpu:5.2f} x floor CPU"
        )


if __name__ == "__main__":
    main()
