"""Benchmark: what removing the market modes costs the clusters step (SPEC §5), beside the floor.

A factor-model universe (market, 20 sectors, noise; 2 % of the returns NaN) of T × N float32
returns; its pairwise-complete ``corr`` computed into a float32 memory map, then in the same
process, alternated ``--repeat`` times so the machine's noise falls on all alike:

* the floor ``R0.T @ R0`` over the zero-filled returns (best of 7);
* ``market_modes(corr, 1, tol=1e-6)``: the market mode every snapshot reports (``m = 0``);
* ``market_modes(corr, m)`` for m = 1, 2, 3 (full tolerance: what the clusters remove);
* the clusters (``hierarchical_clusters``, distances on the heap) with m = 0 (the step without
  modes) and with m = 1 and 3 given the modes found above.

Prints seconds, Lanczos passes, ratios to the floor and to the clusters at m = 0, and the peak
RSS / RssAnon of the whole run::

    python benchmarks/bench_market_modes.py --n 24000 --t 252 --dir /var/tmp
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from common import PeakMemory, gemm_floor, machine_line

from corr_pipeline.compute import hierarchical_clusters, pairwise_correlation
from corr_pipeline.compute.market_modes import market_modes
from corr_pipeline.compute.tiling import overlap_dtype


def universe(n: int, t: int, seed: int = 3) -> np.ndarray:
    """``R = 0.8·market + 0.6·sector + noise``, 20 sectors, 2 % NaN, float32."""
    rng = np.random.default_rng(seed)
    sector = rng.integers(0, 20, n)
    R = 0.8 * rng.standard_normal((t, 1)) + 0.6 * rng.standard_normal((t, 20))[:, sector]
    R += rng.standard_normal((t, n))
    R[rng.random((t, n)) < 0.02] = np.nan
    return R.astype(np.float32)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24_000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where corr's memory map goes")
    args = parser.parse_args()
    print(machine_line())
    R = universe(args.n, args.t)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory, PeakMemory() as memory:
        corr = np.lib.format.open_memmap(
            f"{directory}/corr.npy", "w+", np.float32, (args.n, args.n)
        )
        overlap = np.lib.format.open_memmap(
            f"{directory}/overlap.npy", "w+", overlap_dtype(args.t), (args.n, args.n)
        )
        corr_s, _ = timed(
            lambda: pairwise_correlation(R, min_overlap=60, out_corr=corr, out_overlap=overlap)
        )
        hierarchical_clusters(corr[:64, :64].copy(), distance_threshold=1.2)  # compile
        market_modes(corr[:64, :64].copy(), 1)
        rows: dict[str, list[float]] = {}
        passes: dict[str, int] = {}
        for _ in range(args.repeat):
            rows.setdefault("floor R0.T @ R0", []).append(gemm_floor(np.nan_to_num(R)))
            seconds, found = timed(lambda: market_modes(corr, 1, tol=1e-6))
            rows.setdefault("market mode reported (m = 0)", []).append(seconds)
            passes["market mode reported (m = 0)"] = found.passes
            modes = {}
            for m in (1, 2, 3):
                seconds, modes[m] = timed(lambda m=m: market_modes(corr, m))
                rows.setdefault(f"modes m = {m}", []).append(seconds)
                passes[f"modes m = {m}"] = modes[m].passes
            for m in (0, 1, 3):
                seconds, labels = timed(
                    lambda m=m, modes=modes: hierarchical_clusters(
                        corr,
                        distance_threshold=1.2,
                        market_modes_removed=m,
                        modes=modes.get(m),
                    )
                )
                rows.setdefault(f"clusters m = {m} (modes given)", []).append(seconds)
                print(f"clusters m = {m}: {labels.max() + 1:,} clusters in {seconds:.2f} s")
    floor = min(rows["floor R0.T @ R0"])
    base = min(rows["clusters m = 0 (modes given)"])
    print(f"N = {args.n:,}, T = {args.t}: corr computed in {corr_s:.1f} s")
    print("| step | best s | passes | floors | / clusters m = 0 |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        best = min(values)
        print(
            f"| {name} | {best:.2f} | {passes.get(name, '')} | {best / floor:.2f} | "
            f"{best / base:.3f} |"
        )
    print(
        f"peak RSS {memory.peak_rss / 1024:,.0f} MiB, peak RssAnon "
        f"{memory.peak_anon / 1024:,.0f} MiB (entry {memory.base_anon / 1024:,.0f})"
    )


if __name__ == "__main__":
    main()
