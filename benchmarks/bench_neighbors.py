"""Benchmark top-k neighbours (SPEC §4) at scale: time and memory against a full-sort baseline.

Uses the same random factor-model correlation file as ``bench_clusters.py`` (float32
``np.memmap``, 2.3 GB at N = 24,000; built if absent) plus an int16 overlap ``np.memmap``
(1.15 GB), and runs each variant in a fresh subprocess while the parent samples the child's
``/proc/<pid>/status`` every 2 ms:

* ``ours``       ``corr_pipeline.compute.neighbors.top_k_neighbors`` (partition + boundary ties)
* ``full_sort``  baseline: per block of rows a full stable ``argsort`` of ``-|corr|`` (NaN and
  the diagonal sent last), the first ``k`` kept — the textbook way to get SPEC §4's order

Columns: wall and CPU time of the call, peak RSS (``VmHWM``, includes the corr/overlap pages
mapped from the page cache), peak ``RssAnon`` (sampled), ``RssAnon`` before the call, and
whether the result equals the baseline's. Run the baseline with ``--variants ours,full_sort``.

    python benchmarks/bench_neighbors.py --n 24000 --t 252 --seed 0 --k 50
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import ensure_corr, machine_line, read_status, run_sampled  # noqa: E402


def ensure_overlap(n: int, t: int, seed: int, workdir: Path) -> Path:
    """int16 N × N overlap file (values in ``[t − 40, t]``), built block by block if absent."""
    path = workdir / f"overlap_n{n}_t{t}_s{seed}.npy"
    if not path.exists():
        tmp = path.with_suffix(".tmp.npy")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int16, shape=(n, n))
        rng = np.random.default_rng(seed + 1)
        for i0 in range(0, n, 2000):
            i1 = min(i0 + 2000, n)
            out[i0:i1] = t - rng.integers(0, 41, (i1 - i0, n), dtype=np.int16)
        out.flush()
        del out
        os.replace(tmp, path)
    return path


def full_sort_top_k(corr, k, overlap, working_memory_mb=64):
    """Baseline: stable full argsort of -|corr| per block of rows (SPEC §4 order)."""
    n = corr.shape[0]
    index = np.full((n, k), -1, np.int32)
    value = np.full((n, k), np.nan, np.float32)
    ov = np.zeros((n, k), overlap.dtype)
    rows = max(1, int(working_memory_mb * 2**20) // (n * 16))
    kk = min(k, n)
    for i0 in range(0, n, rows):
        block = np.asarray(corr[i0 : i0 + rows])
        key = -np.abs(block)
        key[~np.isfinite(key)] = np.inf
        key[np.arange(block.shape[0]), np.arange(i0, i0 + block.shape[0])] = np.inf
        order = np.argsort(key, axis=1, kind="stable")[:, :kk]
        valid = np.isfinite(np.take_along_axis(key, order, axis=1))
        r, c = np.nonzero(valid)
        j = order[r, c]
        index[i0 + r, c] = j
        value[i0 + r, c] = block[r, j]
        ov[i0 + r, c] = overlap[i0 + r, j]
    return index, value, ov


def child(args: argparse.Namespace) -> None:
    from corr_pipeline.compute.neighbors import top_k_neighbors

    corr = np.load(args.corr, mmap_mode="r")
    overlap = np.load(args.overlap, mmap_mode="r")
    top_k_neighbors(np.eye(3, dtype=np.float32), k=2)  # import / first-call costs out of the timing
    before = read_status()
    t0 = time.perf_counter()
    c0 = time.process_time()
    if args.variant == "ours":
        res = top_k_neighbors(
            corr, k=args.k, overlap=overlap, working_memory_mb=args.working_memory_mb
        )
        index, value, ov = res.index, res.corr, res.overlap
    elif args.variant == "full_sort":
        index, value, ov = full_sort_top_k(corr, args.k, overlap, args.working_memory_mb)
    else:
        raise SystemExit(f"unknown variant {args.variant}")
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    after = read_status()
    np.savez(args.result_out, index=index, value=value, overlap=ov)
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "cpu_s": cpu,
                "anon_before": before["RssAnon"],
                "hwm": after["VmHWM"],
            }
        )
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=6000, help="number of symbols N")
    p.add_argument("--t", type=int, default=252, help="number of daily returns T")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=50, help="neighbours per symbol")
    p.add_argument("--working-memory-mb", type=float, default=DEFAULT_WORKING_MEMORY_MB)
    p.add_argument("--variants", default="ours,full_sort", help="comma-separated subset")
    p.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "corr_pipeline_bench"
    )
    p.add_argument("--keep", action="store_true", help="keep the corr/overlap files for reuse")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--corr", help=argparse.SUPPRESS)
    p.add_argument("--overlap", help=argparse.SUPPRESS)
    p.add_argument("--result-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return

    corr_path = ensure_corr(args.n, args.t, args.seed, args.workdir)
    overlap_path = ensure_overlap(args.n, args.t, args.seed, args.workdir)
    gb = 1e9
    print(f"# machine: {machine_line()}; load average at start {os.getloadavg()[0]:.1f}")
    print(
        f"# N={args.n} T={args.t} seed={args.seed} k={args.k} "
        f"working_memory_mb={args.working_memory_mb:g}; corr {corr_path.stat().st_size / gb:.2f} GB"
        f" + overlap {overlap_path.stat().st_size / gb:.2f} GB memory-mapped"
    )
    columns = [
        "variant", "wall s", "CPU s", "peak RSS GB", "peak RssAnon GB", "RssAnon before GB",
        "same result as full_sort",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("-" * (len(c) + 2) for c in columns) + "|")
    results = {}
    try:
        for variant in args.variants.split(","):
            out_path = args.workdir / f"neighbors_{variant}.npz"
            cmd = [
                sys.executable, __file__, "--child", "--variant", variant, "--corr", str(corr_path),
                "--overlap", str(overlap_path), "--result-out", str(out_path),
                "--k", str(args.k), "--working-memory-mb", str(args.working_memory_mb),
            ]  # fmt: skip
            res, peak_anon = run_sampled(cmd)
            with np.load(out_path) as data:
                results[variant] = {key: data[key] for key in data.files}
            out_path.unlink()
            results_row = [
                variant,
                f"{res['seconds']:.1f}",
                f"{res['cpu_s']:.1f}",
                f"{res['hwm'] / gb:.2f}",
                f"{peak_anon / gb:.2f}",
                f"{res['anon_before'] / gb:.2f}",
                "-",
            ]
            if "full_sort" in results and "ours" in results:
                same = all(
                    np.array_equal(results["ours"][key], results["full_sort"][key], equal_nan=True)
                    for key in ("index", "value", "overlap")
                )
                results_row[-1] = "yes" if same else "NO"
            print("| " + " | ".join(results_row) + " |", flush=True)
    finally:
        if not args.keep:
            corr_path.unlink(missing_ok=True)
            overlap_path.unlink(missing_ok=True)
    print(f"# load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
