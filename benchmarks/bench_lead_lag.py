"""Benchmark: find_lead_lag_pairs against its floor (one float32 GEMM) and the brute-force scan.

    python benchmarks/bench_lead_lag.py --n 2000 --t 252 --brute-force
    python benchmarks/bench_lead_lag.py --n 6000 --t 350
    python benchmarks/bench_lead_lag.py --n 24000 --t 252 --corr-memmap /tmp/corr_bench/corr.npy
    python benchmarks/bench_lead_lag.py --n 6000 --t 350 --corr-memmap corr.npy --market-modes 1 --max-q 0.05
    git archive a48e1b9 | tar -x -C /tmp/ll_base   # the white-noise q-values
    python benchmarks/bench_lead_lag.py --n 6000 --t 350 --corr-memmap corr.npy --compare /tmp/ll_base

The floor is the best of 7 of ``R0.T @ R0`` on the zero-filled float32 returns (numpy's
symmetric product on both cores), timed in the same process as the kernel (best of
``--repeat``, default 3); the kernel is reported in floors, in total and per lag, and in
*CPU floors* (best process CPU seconds, all threads, of the kernel over those of the floor:
steadier than wall time on a loaded machine). Peak RSS
and peak RssAnon are sampled over the kernel calls. ``--brute-force`` also times a plain scan
(:func:`brute_force_lead_lag`: every lag's full N × N float64 matrix, then SPEC §6 literally) and
checks both give the same pairs. ``--corr-memmap`` passes the synchronous correlation as a
read-only memory map, as the pipeline does (e.g. the one ``bench_correlation.py --memmap`` left
behind for the same N, T). ``--market-modes M`` (needs ``--corr-memmap``) scans the market
residuals after the ``M`` strongest modes of that ``corr``, as the pipeline does with
``lead_lag_market_modes = M``: the kernel is then the residuals and the scan (the modes
themselves, shared with the clusters, are timed apart); ``--max-q Q`` is ``max_q_value``.

``--compare DIR`` measures, in alternating fresh processes (``--rounds`` each), this tree and
the package found in ``DIR`` (e.g. an export of an older commit) on the same returns, and
prints each one's best and median time and floor ratio side by side: the machine's load moves
both alike. ``DIR``'s package is called as its pipeline called it: the returns themselves,
``corr`` given, no q-value condition (``--market-modes`` and ``--max-q`` apply to this tree
only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import PeakMemory, git_commit, machine_line

from corr_pipeline.bench.floor import gemm_floor_times, wall_and_cpu_times
from corr_pipeline.compute import find_lead_lag_pairs
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.synth import ragged_returns

THIS_TREE_ONLY = ("--market-modes", "--max-q")
"""Options the ``--compare`` directories' (older) packages are not given."""


def masked_correlation(X: np.ndarray, Y: np.ndarray, min_overlap: int) -> np.ndarray:
    """Pairwise-complete Pearson correlation (float64) of every column of ``X`` with every
    column of ``Y`` (same rows), from masked moments of the columns shifted by their finite mean:
    ``n = Mxᵀ My``, ``cov = Sxy − Sx·Sy/n``, ``var = Sxx − Sx²/n``; NaN where ``n < min_overlap``
    or a variance is not positive. Plain float64, no special care for series constant on part
    of the window (the benchmark universe has none)."""
    mx = np.isfinite(X)
    my = np.isfinite(Y)
    x0 = np.where(mx, X - np.nanmean(X, axis=0), 0.0)
    y0 = np.where(my, Y - np.nanmean(Y, axis=0), 0.0)
    fx = mx.astype(np.float64)
    fy = my.astype(np.float64)
    n = fx.T @ fy
    sx = x0.T @ fy
    sy = fx.T @ y0
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = x0.T @ y0 - sx * sy / n
        var_x = (x0 * x0).T @ fy - sx * sx / n
        var_y = fx.T @ (y0 * y0) - sy * sy / n
        corr = cov / np.sqrt(var_x * var_y)
    undefined = (n < min_overlap) | ~(var_x > 0) | ~(var_y > 0)
    return np.where(undefined, np.nan, np.clip(corr, -1.0, 1.0))


def brute_force_lead_lag(
    returns: np.ndarray,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
) -> set[tuple[int, int, int]]:
    """SPEC §6 literally over full N × N float64 matrices: the selected ``(leader, lagger, lag)``.

    ``lagged[ℓ] = masked_correlation(R[:T−ℓ], R[ℓ:])`` for ``ℓ = 1..max_lag``; best lag = first
    maximum of the finite ``|lagged|``; ``improvement = |lagged[ℓ*]| − |corr|`` (NaN ``corr``
    read as 0, ``corr = masked_correlation(R, R)``); candidates ``i != j`` with a finite lag and
    ``improvement > min_improvement``; per symbol its ``k_laggers`` best in its row and
    ``k_leaders`` best in its column (largest improvement, ties to the smaller index); union.
    """
    R = returns.astype(np.float64)
    n_rows, n_cols = R.shape
    sync = masked_correlation(R, R, min_overlap)
    best_abs = np.full((n_cols, n_cols), -np.inf)
    best_lag = np.zeros((n_cols, n_cols), dtype=np.int64)
    for lag in range(1, max_lag + 1):
        lagged = np.abs(masked_correlation(R[: n_rows - lag], R[lag:], min_overlap))
        better = lagged > best_abs  # NaN never wins; ties keep the smaller lag
        best_abs[better] = lagged[better]
        best_lag[better] = lag
    improvement = best_abs - np.where(np.isfinite(sync), np.abs(sync), 0.0)
    candidate = (best_lag > 0) & ~np.eye(n_cols, dtype=bool) & (improvement > min_improvement)
    key = np.where(candidate, -improvement, np.inf)
    index = np.arange(n_cols)
    selected: set[tuple[int, int, int]] = set()
    for s in range(n_cols):
        for i, j, k in (
            (np.full(n_cols, s), index, k_laggers),
            (index, np.full(n_cols, s), k_leaders),
        ):
            ordered = np.lexsort((index, key[i, j]))[:k]  # by -improvement, then index
            for t in ordered[candidate[i[ordered], j[ordered]]]:
                selected.add((int(i[t]), int(j[t]), int(best_lag[i[t], j[t]])))
    return selected


def measure(args: argparse.Namespace) -> dict:
    """One process's figures: floor (best of 7), kernel (best of ``args.repeat``), each in wall and
    in process CPU seconds (all threads), memory."""
    returns = ragged_returns(args.t, args.n, seed=1)
    corr = None
    if args.corr_memmap is not None:
        corr = np.load(args.corr_memmap, mmap_mode="r")
        if corr.shape != (args.n, args.n):
            raise SystemExit(f"{args.corr_memmap} is {corr.shape}, expected N = {args.n}")
    params = dict(
        max_lag=args.max_lag, k_leaders=args.k, k_laggers=args.k, min_overlap=args.min_overlap
    )
    extra = {} if args.max_q is None else {"max_q_value": args.max_q}
    find_lead_lag_pairs(returns[:, :256], **params, **extra)  # compile / warm up
    floor_walls, floor_cpus = gemm_floor_times(returns)
    pairs: list[np.ndarray] = []
    vectors, modes_seconds = None, None
    if args.market_modes:
        from corr_pipeline.compute import market_modes, market_residuals

        if corr is None:
            raise SystemExit("--market-modes needs --corr-memmap (the modes are corr's)")
        start = time.perf_counter()
        vectors = market_modes(corr, args.market_modes).vectors
        modes_seconds = time.perf_counter() - start
        market_residuals(returns[:, :256], vectors[:256])  # warm up

    def run() -> None:
        if vectors is None:
            series, sync = returns, corr
        else:
            series, sync = market_residuals(returns, vectors), None
        pairs[:] = [
            find_lead_lag_pairs(
                series, corr=sync, working_memory_mb=args.working_memory_mb, **params, **extra
            )
        ]

    with PeakMemory() as memory:
        kernel_walls, kernel_cpus = wall_and_cpu_times(run, args.repeat)
    peak = memory.above
    return {
        "commit": git_commit(),
        "floor": min(floor_walls),
        "kernel": min(kernel_walls),
        "floor_cpu": min(floor_cpus),
        "kernel_cpu": min(kernel_cpus),
        "pairs": int(pairs[0].size),
        "rss_mib": peak.rss_mib,
        "anon_mib": peak.anon_mib,
        "input_mib": returns.nbytes / 2**20,
        "modes_s": modes_seconds,
        "_pairs": pairs[0],
        "_returns": returns,
        "_params": params,
    }


def compare(args: argparse.Namespace) -> None:
    """Alternate fresh processes of this tree and of each ``--compare`` directory."""
    here = str(Path(__file__).resolve().parents[1])
    variants = [("this tree", here)] + [(d, str(Path(d).resolve())) for d in args.compare]
    child = [sys.executable, __file__, "--json"] + [
        a for a in sys.argv[1:] if a not in args.compare and a not in ("--compare",)
    ]
    older = _without(child, THIS_TREE_ONLY)
    results: dict[str, list[dict]] = {name: [] for name, _ in variants}
    print(f"# {machine_line()}; N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k}")
    for _ in range(args.rounds):
        for name, path in variants:
            env = dict(os.environ, PYTHONPATH=path)
            command = child if path == here else older
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {name}: {results[name][-1]} (load {os.getloadavg()[0]:.1f})", flush=True)
    print(
        "| code | commit | floor s (best / median) | kernel s (best / median) | floors"
        " (best / median) | per lag | CPU floors (best / median) | pairs | peak RSS | peak RssAnon |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        floors = [r["floor"] for r in runs]
        kernels = [r["kernel"] for r in runs]
        ratios = [r["kernel"] / r["floor"] for r in runs]
        cpu_ratios = [r["kernel_cpu"] / r["floor_cpu"] for r in runs]
        print(
            f"| {name} | {runs[0]['commit']} | {min(floors):.3f} / {statistics.median(floors):.3f}"
            f" | {min(kernels):.3f} / {statistics.median(kernels):.3f}"
            f" | {min(ratios):.1f} / {statistics.median(ratios):.1f}"
            f" | {min(ratios) / args.max_lag:.2f} / {statistics.median(ratios) / args.max_lag:.2f}"
            f" | {min(cpu_ratios):.1f} / {statistics.median(cpu_ratios):.1f}"
            f" | {runs[0]['pairs']:,} | +{max(r['rss_mib'] for r in runs):,.0f} MiB"
            f" | +{max(r['anon_mib'] for r in runs):,.0f} MiB |"
        )


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less each of ``options`` and its value."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item in options:
            skip = True
        else:
            out.append(item)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="k_leaders = k_laggers")
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--working-memory-mb", type=float, default=DEFAULT_WORKING_MEMORY_MB)
    parser.add_argument("--brute-force", action="store_true")
    parser.add_argument("--corr-memmap", type=Path)
    parser.add_argument("--market-modes", type=int, default=0, metavar="M")
    parser.add_argument("--max-q", type=float, default=None, metavar="Q")
    parser.add_argument("--repeat", type=int, default=3, help="kernel calls (best of)")
    parser.add_argument("--compare", nargs="+", default=[], metavar="DIR")
    parser.add_argument("--rounds", type=int, default=3, help="processes per variant (--compare)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        compare(args)
        return
    result = measure(args)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}))
        return
    floor, kernel = result["floor"], result["kernel"]
    floor_cpu, kernel_cpu = result["floor_cpu"], result["kernel_cpu"]
    print(f"# {machine_line()}; commit {result['commit']}")
    print(
        f"# N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k}, "
        f"market modes {args.market_modes}, max_q_value {args.max_q or 1.0}"
    )
    if result["modes_s"] is not None:
        print(
            f"modes   market_modes (Lanczos over corr, shared with the clusters): "
            f"{result['modes_s']:.3f} s = {result['modes_s'] / floor:.1f} floors"
        )
    print(f"floor   R0.T @ R0 float32 (best of 7): {floor:8.3f} s")
    print(
        f"kernel  find_lead_lag_pairs (best of {args.repeat}): {kernel:8.3f} s"
        f"  = {kernel / floor:5.1f} floors = {kernel / floor / args.max_lag:4.2f} floors per lag;"
        f" {result['pairs']} pairs"
    )
    print(
        f"cpu     process CPU s (all threads), best: floor {floor_cpu:.3f}, kernel {kernel_cpu:.3f}"
        f"  = {kernel_cpu / floor_cpu:5.1f} CPU floors"
    )
    print(
        f"memory  peak RSS +{result['rss_mib']:,.0f} MiB, peak RssAnon +{result['anon_mib']:,.0f}"
        f" MiB (input {result['input_mib']:,.0f} MiB"
        + (", corr memory-mapped" if args.corr_memmap is not None else "")
        + ")"
    )
    if args.brute_force:
        start = time.perf_counter()
        ref_pairs = brute_force_lead_lag(result["_returns"], **result["_params"])
        brute = time.perf_counter() - start
        got = result["_pairs"]
        got_pairs = {
            (int(i), int(j), int(lag))
            for i, j, lag in zip(got["leader"], got["lagger"], got["lag"], strict=True)
        }
        print(
            f"brute   full N x N per lag, float64 (once): {brute:8.3f} s"
            f"  = {brute / kernel:5.1f} x slower; pairs identical: {ref_pairs == got_pairs}"
            f" ({len(ref_pairs ^ got_pairs)} differ)"
        )


if __name__ == "__main__":
    main()
