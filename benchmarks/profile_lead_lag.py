"""Profile of find_lead_lag_pairs: thread CPU seconds per part, and pairs evaluated exactly.

    python benchmarks/profile_lead_lag.py --n 6000 --t 350

Wraps, for the duration of one call (after a warm-up call), the float32 products
(``np.matmul``), each numba kernel of
:mod:`corr_pipeline.compute.lead_lag_kernels` the scan calls, the standardisation and the screen
set-up, and accumulates the CPU time of the calling thread (``time.thread_time``) per part;
"rest" is the process CPU time less their sum (numpy selections, pool merging, sorting). Also
prints the pairs evaluated exactly (the selection kernels return their counts) against the pairs
reported, and the parts in *CPU floors*: CPU seconds over the best process CPU seconds of the
floor ``R0.T @ R0`` (both cores' BLAS threads, best of 7, same process). CPU seconds move less
with the machine's load than wall seconds.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict

import numpy as np
from common import machine_line

from corr_pipeline.bench.floor import gemm_floor_times
from corr_pipeline.compute import find_lead_lag_pairs
from corr_pipeline.compute import lead_lag as ll
from corr_pipeline.compute import lead_lag_kernels as llk
from corr_pipeline.synth import ragged_returns


class Parts:
    """Thread CPU seconds and call results per part, thread-safe."""

    def __init__(self) -> None:
        self.cpu: defaultdict[str, float] = defaultdict(float)
        self.count: defaultdict[str, int] = defaultdict(int)
        self.lock = threading.Lock()

    def add(self, name: str, seconds: float, count: int = 0) -> None:
        with self.lock:
            self.cpu[name] += seconds
            self.count[name] += count


def timed(parts: Parts, name, fn, counted: bool = False):
    """``fn`` wrapped: its thread CPU time goes to ``name(args)`` (a str or a function of the
    call's arguments); with ``counted`` its integer result is summed too."""

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        result = fn(*args, **kwargs)
        label = name if isinstance(name, str) else name(*args, **kwargs)
        parts.add(label, time.thread_time() - start, int(result) if counted else 0)
        return result

    return wrapper


def profile(returns: np.ndarray, params: dict) -> tuple[Parts, float, int]:
    """One call of find_lead_lag_pairs with every part wrapped; (parts, process CPU s, pairs)."""
    parts = Parts()
    patches = [
        (
            np,
            "matmul",
            timed(parts, "GEMM products (every lag)", np.matmul),
        ),
        (llk, "screen_tile", timed(parts, "bound kernel (screen_tile)", llk.screen_tile)),
        (llk, "select_rows", timed(parts, "rows: select + exact", llk.select_rows, True)),
        (llk, "fold_columns", timed(parts, "columns: fold lower + pool", llk.fold_columns)),
        (llk, "select_columns", timed(parts, "columns: select + exact", llk.select_columns, True)),
        (ll, "standardize", timed(parts, "standardize", ll.standardize)),
        (ll, "_make_screen", timed(parts, "screen set-up", ll._make_screen)),
    ]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    for module, attr, fn in patches:
        setattr(module, attr, fn)
    try:
        cpu = time.process_time()
        pairs = find_lead_lag_pairs(returns, **params)
        cpu = time.process_time() - cpu
    finally:
        for module, attr, fn in saved:
            setattr(module, attr, fn)
    return parts, cpu, int(pairs.size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--t", type=int, default=350)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="k_leaders = k_laggers")
    parser.add_argument("--min-overlap", type=int, default=60)
    args = parser.parse_args()
    returns = ragged_returns(args.t, args.n, seed=1)
    params = dict(
        max_lag=args.max_lag, k_leaders=args.k, k_laggers=args.k, min_overlap=args.min_overlap
    )
    find_lead_lag_pairs(returns[:, :256], **params)  # compile / warm up
    floor_walls, floor_cpus = gemm_floor_times(returns)
    floor, floor_cpu = min(floor_walls), min(floor_cpus)
    wall = time.perf_counter()
    parts, cpu, reported = profile(returns, params)
    wall = time.perf_counter() - wall
    print(f"# {machine_line()}")
    print(f"# N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k}")
    print(f"# floor R0.T @ R0: {floor:.3f} s wall, {floor_cpu:.3f} s CPU (each the best of 7)")
    print("| part | thread CPU s | share | CPU floors | pairs evaluated |")
    print("|---|---:|---:|---:|---:|")
    rest = cpu - sum(parts.cpu.values())
    for name, seconds in sorted(parts.cpu.items()) + [("rest", rest)]:
        evaluated = f"{parts.count[name]:,}" if parts.count.get(name) else ""
        print(
            f"| {name} | {seconds:.3f} | {seconds / cpu:.0%} | {seconds / floor_cpu:.2f}"
            f" | {evaluated} |"
        )
    evaluated = parts.count["rows: select + exact"] + parts.count["columns: select + exact"]
    print(f"| **total** | **{cpu:.3f}** | | {cpu / floor_cpu:.2f} | {evaluated:,} |")
    print(f"wall {wall:.3f} s = {wall / floor:.1f} floors; {reported:,} pairs reported")


if __name__ == "__main__":
    main()
