"""Benchmark hierarchical clustering (SPEC §5) at scale: time and memory, side by side.

Builds a random factor-model correlation matrix (T × N float32 returns from a 10-factor model,
standardised, ``corr = Z.T @ Z / T`` computed block by block into a float32 ``np.memmap`` file,
2.3 GB at N = 24,000), then runs each variant in a fresh subprocess while the parent samples the
child's ``/proc/<pid>/status`` every 2 ms:

* ``scipy``         condensed vector, then ``scipy.cluster.hierarchy.linkage`` + ``fcluster``
* ``fc_public``     condensed vector, then ``fastcluster.linkage(..., preserve_input=False)``
* ``fc_inplace``    condensed vector, then fastcluster's core ``_fastcluster.linkage_wrap`` in place
* ``ours``          ``corr_pipeline.compute.clusters.hierarchical_clusters`` (heap buffer)
* ``ours_memmap``   the same with ``work=`` a float64 ``np.memmap`` in the work directory

Columns: wall time of the call (condensed build + linkage + cut; the corr memmap opening and the
numba warm-up are excluded and shown separately), peak RSS (kernel ``VmHWM``, includes the corr
pages mapped from the page cache), peak ``RssAnon`` (anonymous memory, sampled), ``RssAnon``
before the call, K, and whether the partition equals the scipy variant's.

    python benchmarks/bench_clusters.py --n 24000 --t 252 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from corr_pipeline.bench import machine_line

VARIANTS = ("scipy", "fc_public", "fc_inplace", "ours", "ours_memmap")


# ----------------------------------------------------------------------------- data


def factor_returns(n: int, t: int, seed: int, n_factors: int = 10) -> np.ndarray:
    """T × N float32 returns: ``R = F·B + e`` with sector-like loadings and idiosyncratic noise."""
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((t, n_factors)).astype(np.float32) * 0.01
    loadings = rng.standard_normal((n_factors, n)).astype(np.float32) * 0.5
    sector = rng.integers(0, n_factors, n)
    loadings[sector, np.arange(n)] += 1.5  # each symbol loads mostly on its sector factor
    noise = (
        rng.standard_normal((t, n)).astype(np.float32)
        * 0.01
        * rng.uniform(0.5, 2.0, n).astype(np.float32)
    )
    return factors @ loadings + noise


def write_corr_memmap(R: np.ndarray, path: Path, block_rows: int = 2000) -> None:
    """``corr = Z.T @ Z / T`` of the column-standardised ``R`` into a float32 .npy memmap."""
    t, n = R.shape
    Z = (R - R.mean(axis=0)) / R.std(axis=0)
    Z = Z.astype(np.float32)
    corr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, n))
    for i0 in range(0, n, block_rows):
        i1 = min(i0 + block_rows, n)
        blk = (Z[:, i0:i1].T @ Z) / np.float32(t)
        np.clip(blk, -1.0, 1.0, out=blk)
        blk[np.arange(i1 - i0), np.arange(i0, i1)] = 1.0
        corr[i0:i1] = blk
    corr.flush()
    del corr


def ensure_corr(n: int, t: int, seed: int, workdir: Path) -> Path:
    """Path of the cached correlation file for (n, t, seed), building it if absent."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"corr_n{n}_t{t}_s{seed}.npy"
    if not path.exists():
        t0 = time.perf_counter()
        tmp = path.with_suffix(".tmp.npy")
        write_corr_memmap(factor_returns(n, t, seed), tmp)
        os.replace(tmp, path)
        print(f"# built {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


# ----------------------------------------------------------------------------- memory


def read_status(pid: int | str = "self") -> dict[str, int]:
    """``/proc/<pid>/status`` memory fields in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("Vm", "Rss")):
                key, val = line.split(":", 1)
                parts = val.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    return out


def run_sampled(cmd: list[str], interval: float = 0.002) -> tuple[dict, int]:
    """Run ``cmd`` (which prints one JSON line last) and sample its peak RssAnon from outside."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak_anon = 0
    while proc.poll() is None:
        try:
            peak_anon = max(peak_anon, read_status(proc.pid).get("RssAnon", 0))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(interval)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed with code {proc.returncode}:\n{out}")
    return json.loads(out.strip().splitlines()[-1]), peak_anon


# ----------------------------------------------------------------------------- child


def child(args: argparse.Namespace) -> None:
    import fastcluster
    from scipy.cluster.hierarchy import fcluster, linkage

    from corr_pipeline.compute.clusters import (
        _canonical_labels,
        condensed_distances,
        distance_buffer_length,
        hierarchical_clusters,
    )

    t0 = time.perf_counter()
    hierarchical_clusters(np.eye(3, dtype=np.float32), method=args.method, n_clusters=2)
    warmup = time.perf_counter() - t0
    corr = np.load(args.corr, mmap_mode="r")
    n = corr.shape[0]
    cut = {"t": args.threshold, "criterion": "distance"}
    before = read_status()
    t0 = time.perf_counter()
    c0 = time.process_time()
    timings = {}
    if args.variant == "ours":
        labels = hierarchical_clusters(corr, method=args.method, distance_threshold=args.threshold)
    elif args.variant == "ours_memmap":
        work_path = Path(args.corr).with_suffix(".work.f64")
        work = np.memmap(work_path, dtype=np.float64, mode="w+", shape=(distance_buffer_length(n),))
        try:
            labels = hierarchical_clusters(
                corr, method=args.method, distance_threshold=args.threshold, work=work
            )
        finally:
            del work
            work_path.unlink()
    else:
        cond = condensed_distances(corr)
        timings["condensed_s"] = time.perf_counter() - t0
        if args.variant == "scipy":
            Z = linkage(cond, args.method)
        elif args.variant == "fc_public":
            Z = fastcluster.linkage(cond, args.method, preserve_input=False)
        elif args.variant == "fc_inplace":
            from _fastcluster import linkage_wrap

            Z = np.empty((n - 1, 4))
            linkage_wrap(n, cond, Z, fastcluster.mthidx[args.method])
        else:
            raise SystemExit(f"unknown variant {args.variant}")
        del cond
        timings["linkage_s"] = time.perf_counter() - t0 - timings["condensed_s"]
        labels = _canonical_labels(fcluster(Z, **cut))
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    after = read_status()
    np.save(args.labels_out, labels)
    print(
        json.dumps(
            {
                "variant": args.variant,
                "seconds": elapsed,
                "cpu_s": cpu,
                "warmup_s": warmup,
                "anon_before": before["RssAnon"],
                "hwm": after["VmHWM"],
                "k": int(labels.max()) + 1,
                **timings,
            }
        )
    )


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=6000, help="number of symbols N")
    p.add_argument("--t", type=int, default=252, help="number of daily returns T")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--method", default="average", choices=["single", "complete", "average", "weighted"]
    )
    p.add_argument(
        "--threshold", type=float, default=1.0, help="distance cut (fcluster 'distance')"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    p.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "corr_pipeline_bench"
    )
    p.add_argument("--keep", action="store_true", help="keep the correlation file for reuse")
    # internal: child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--corr", help=argparse.SUPPRESS)
    p.add_argument("--labels-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return

    corr_path = ensure_corr(args.n, args.t, args.seed, args.workdir)
    gb = 1e9
    print(f"# machine: {machine_line()}; load average at start {os.getloadavg()[0]:.1f}")
    print(
        f"# N={args.n} T={args.t} seed={args.seed} method={args.method} "
        f"cut: distance <= {args.threshold}; corr file {corr_path.stat().st_size / gb:.2f} GB, "
        f"condensed float64 {8 * args.n * (args.n - 1) // 2 / gb:.2f} GB"
    )
    columns = [
        "variant", "wall s", "CPU s", "distances s", "linkage+cut s", "peak RSS GB",
        "peak RssAnon GB", "RssAnon before GB", "K", "same partition as scipy",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("-" * (len(c) + 2) for c in columns) + "|")
    ref_labels = None
    try:
        for variant in args.variants.split(","):
            labels_path = args.workdir / f"labels_{variant}.npy"
            cmd = [
                sys.executable, __file__, "--child", "--variant", variant, "--corr", str(corr_path),
                "--labels-out", str(labels_path), "--method", args.method,
                "--threshold", str(args.threshold),
            ]  # fmt: skip
            res, peak_anon = run_sampled(cmd)
            labels = np.load(labels_path)
            labels_path.unlink()
            if variant == "scipy":
                ref_labels = labels
            same = (
                "-"
                if ref_labels is None
                else ("yes" if np.array_equal(labels, ref_labels) else "NO")
            )
            cells = [
                variant,
                f"{res['seconds']:.1f}",
                f"{res['cpu_s']:.1f}",
                f"{res['condensed_s']:.1f}" if "condensed_s" in res else "-",
                f"{res['linkage_s']:.1f}" if "linkage_s" in res else "-",
                f"{res['hwm'] / gb:.2f}",
                f"{peak_anon / gb:.2f}",
                f"{res['anon_before'] / gb:.2f}",
                str(res["k"]),
                same,
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
    finally:
        if not args.keep:
            corr_path.unlink(missing_ok=True)
    print(f"# load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
