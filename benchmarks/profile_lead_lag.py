"""Profile of find_lead_lag_pairs: thread CPU seconds per part, and pairs evaluated exactly.

    python benchmarks/profile_lead_lag.py --n 6000 --t 350
    python benchmarks/profile_lead_lag.py --n 6000 --t 350 --corr-memmap /tmp/corr6000/corr.npy
    python benchmarks/profile_lead_lag.py --n 6000 --t 350 --corr-memmap corr.npy --market-modes 1 --max-q 0.05
    python benchmarks/profile_lead_lag.py --n 12000 --t 252 --stripes 512 --workers 2

Wraps, for the duration of one call (after a warm-up call), the sweep's float32 products
(``np.matmul``), its kernel (``sweep_kernels.sweep_tile``) and the exact evaluation of the pairs
it defers, each selection kernel of :mod:`corr_pipeline.compute.lead_lag.kernels`, the
standardisation and the sweep's set-up, and accumulates the CPU time of the calling thread
(``time.thread_time``) per part;
"rest" is the process CPU time less their sum (numpy selections, pool merging, sorting). Also
prints the pairs evaluated exactly (the selection kernels return their counts) and the column
candidates pooled, against the pairs reported, and the parts in *CPU floors*: CPU seconds over
the best process CPU seconds of the floor ``R0.T @ R0`` (both cores' BLAS threads, best of 7,
same process). CPU seconds move less with the machine's load than wall seconds.
``--corr-memmap`` passes the synchronous correlation (a read-only map of
``bench_correlation.py --memmap``'s ``corr.npy`` for the same N and T); with ``--market-modes
M`` the call scans the market residuals after that ``corr``'s ``M`` strongest modes instead, as
the pipeline does (the residuals in the profiled call, the modes before it); ``--max-q Q`` is
``max_q_value``.

With ``--stripes ROWS``: the threaded call, then
:func:`~corr_pipeline.compute.lead_lag.striped.striped_lead_lag` in stripes of ``ROWS`` leaders run one
after the other in this process, as ``--workers`` workers would get them (stripe i is given the
:class:`~corr_pipeline.compute.lead_lag.striped.LaggerFloor` of stripes 0 .. i − workers, those finished
when it is submitted), both profiled alike; the results must be identical.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import git_commit, machine_line

from corr_pipeline.bench.floor import gemm_floor_times
from corr_pipeline.compute import find_lead_lag_pairs, market_modes, market_residuals
from corr_pipeline.compute.lead_lag import kernels as llk
from corr_pipeline.compute.lead_lag import pairs as ll
from corr_pipeline.compute.lead_lag import striped as ls
from corr_pipeline.compute.lead_lag import sweep as sw
from corr_pipeline.compute.lead_lag.striped import striped_lead_lag
from corr_pipeline.compute.parallel import runners as st
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


def timed(parts: Parts, name, fn, counted: bool | Callable[[Any], int] = False):
    """``fn`` wrapped: its thread CPU time goes to ``name(args)`` (a str or a function of the
    call's arguments); with ``counted`` its integer result (or ``counted(result)``) is summed
    too."""

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        result = fn(*args, **kwargs)
        label = name if isinstance(name, str) else name(*args, **kwargs)
        count = counted(result) if callable(counted) else int(result) if counted else 0
        parts.add(label, time.thread_time() - start, count)
        return result

    return wrapper


class FloorAfter:
    """A stripe runner in this thread: stripe i gets the floor of stripes 0 .. i − ``workers``
    (those a cluster of ``workers`` single-threaded workers has finished when it submits i)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def map(self, fn, shared, stripes, *args, progress=None, feedback=None):  # type: ignore[no-untyped-def]
        results, floors, token = [], [], uuid.uuid4().hex  # a token per call (StripeRunner)
        for i, stripe in enumerate(stripes):
            if feedback is None:  # stripes without a floor (the significance count)
                results.append(fn(shared, stripe, token, *args))
                continue
            floor = floors[i - self.workers] if i >= self.workers else None
            results.append(feedback.update(fn(shared, stripe, token, *args, floor)))
            floors.append(feedback.current())
        return results


def profile(call: Callable[[], np.ndarray]) -> tuple[Parts, float, np.ndarray]:
    """``call()`` with every part wrapped; (parts, process CPU s, its result)."""
    parts = Parts()
    patches = [
        (
            np,
            "matmul",
            timed(parts, "GEMM products (every lag)", np.matmul),
        ),
        (sw, "sweep_tile", timed(parts, "sweep kernel (sweep_tile)", sw.sweep_tile)),
        (sw, "exact_bins", timed(parts, "deferred pairs, exact", sw.exact_bins)),
        (llk, "select_rows", timed(parts, "rows: select + exact", llk.select_rows, True)),
        (
            llk,
            "fold_columns",
            timed(parts, "columns: fold lower + pool", llk.fold_columns, lambda r: r[0].size),
        ),
        (llk, "select_columns", timed(parts, "columns: select + exact", llk.select_columns, True)),
        (ll, "standardize", timed(parts, "standardize", ll.standardize)),
        (st, "standardize", timed(parts, "standardize", st.standardize)),
        (ls, "standardize", timed(parts, "standardize", ls.standardize)),
        (ll, "sweep_inputs", timed(parts, "sweep set-up", ll.sweep_inputs)),
        (ls, "sweep_inputs", timed(parts, "sweep set-up", ls.sweep_inputs)),
    ]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    for module, attr, fn in patches:
        setattr(module, attr, fn)
    try:
        cpu = time.process_time()
        pairs = call()
        cpu = time.process_time() - cpu
    finally:
        for module, attr, fn in saved:
            setattr(module, attr, fn)
    return parts, cpu, pairs


def report(title: str, parts: Parts, cpu: float, wall: float, floor: float, floor_cpu: float):
    """The table of one profiled call."""
    print(f"\n{title}\n")
    print("| part | thread CPU s | share | CPU floors | pairs evaluated / pooled |")
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
    print(f"\nwall {wall:.3f} s = {wall / floor:.1f} floors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--t", type=int, default=350)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="k_leaders = k_laggers")
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--stripes", type=int, metavar="ROWS", help="also the striped scan")
    parser.add_argument("--workers", type=int, default=2, help="workers the stripes simulate")
    parser.add_argument("--corr-memmap", type=Path, help="corr.npy of the same N and T")
    parser.add_argument("--market-modes", type=int, default=0, metavar="M")
    parser.add_argument("--max-q", type=float, default=1.0, metavar="Q")
    args = parser.parse_args()
    returns = ragged_returns(args.t, args.n, seed=1)
    corr = None if args.corr_memmap is None else np.load(args.corr_memmap, mmap_mode="r")
    if corr is not None and corr.shape != (args.n, args.n):
        raise SystemExit(f"{args.corr_memmap} is {corr.shape}, expected N = {args.n}")
    params = dict(
        max_lag=args.max_lag,
        k_leaders=args.k,
        k_laggers=args.k,
        min_overlap=args.min_overlap,
        max_q_value=args.max_q,
    )
    series, sync = returns, corr
    if args.market_modes:
        if corr is None:
            raise SystemExit("--market-modes needs --corr-memmap (the modes are corr's)")
        vectors = market_modes(corr, args.market_modes).vectors
        series, sync = market_residuals(returns, vectors), None
    calls = {"threads": lambda: find_lead_lag_pairs(series, corr=sync, **params)}
    if args.stripes:
        runner = FloorAfter(args.workers)
        calls[f"stripes of {args.stripes} rows, floors as {args.workers} workers get them"] = (
            lambda: striped_lead_lag(series, runner, corr=sync, stripe_rows=args.stripes, **params)
        )
    small = returns[:, :300]
    find_lead_lag_pairs(small, **params)  # compile / warm up
    striped_lead_lag(small, FloorAfter(1), stripe_rows=128, **params)
    floor_walls, floor_cpus = gemm_floor_times(returns)
    floor, floor_cpu = min(floor_walls), min(floor_cpus)
    print(f"# {machine_line()}; commit {git_commit()}")
    print(
        f"# N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k}, market modes "
        f"{args.market_modes}, max_q_value {args.max_q}"
    )
    print(f"# floor R0.T @ R0: {floor:.3f} s wall, {floor_cpu:.3f} s CPU (each the best of 7)")
    results = []
    for title, call in calls.items():
        wall = time.perf_counter()
        parts, cpu, pairs = profile(call)
        wall = time.perf_counter() - wall
        report(title, parts, cpu, wall, floor, floor_cpu)
        print(f"{pairs.size:,} pairs reported")
        results.append(pairs)
    if len(results) > 1:
        print(f"identical: {results[0].tobytes() == results[1].tobytes()}")


if __name__ == "__main__":
    main()
