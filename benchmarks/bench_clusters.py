"""Benchmark the clustering step (SPEC §5) at scale: time and memory, before/after, side by side.

Builds a random factor-model correlation matrix (T × N float32 returns from a 10-factor model,
standardised, ``corr = Z.T @ Z / T`` computed block by block into a float32 ``np.memmap`` file,
2.3 GB at N = 24,000), then runs each variant in a fresh subprocess while the parent samples the
child's ``/proc/<pid>/status`` every 2 ms. Variants, interleaved ``--repeat`` times per N so that
the machine's noise falls on all of them alike:

* ``heap``        before: ``snapshot.steps.clusters(corr, params.clusters)``, the distances (float64,
                  tiled, 8·N²/2 bytes) in anonymous memory — the step as it ran up to b577483
                  (``compute/clusters/linkage.py`` is unchanged; this path is still the default without
                  a scratch)
* ``store``       after: ``steps.clusters(corr, params.clusters, scratch=partial(store.scratch,
                  "clusters", partition))`` — the same buffer in a temp file of a matrix store
                  under the work directory (page cache), deleted after the step; the child
                  also reports whether any temp file was left
* ``scipy``       condensed vector, then ``scipy.cluster.hierarchy.linkage`` + ``fcluster``
* ``fc_public``   condensed vector, then ``fastcluster.linkage(..., preserve_input=False)``
* ``fc_inplace``  condensed vector, then fastcluster's core ``_fastcluster.linkage_wrap`` in place

Per run: wall and CPU time of the call (the corr memmap opening and the numba warm-up
excluded), peak RSS (kernel ``VmHWM``: includes the corr pages and, for ``store``, the scratch
pages, i.e. page cache), peak ``RssAnon`` (anonymous memory, sampled), K, and whether the
partition equals the first variant's. Then per N and variant the best and the median of each
figure, and the ratio of every variant's to the first variant's.

    python benchmarks/bench_clusters.py --n 12000,24000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np

from corr_pipeline.bench import machine_line

VARIANTS = ("heap", "store", "scipy", "fc_public", "fc_inplace")

#: Partition key of the benchmark's store scratch (an XNYS session).
PARTITION = "2026-11-30"


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


class PageSampler:
    """Peaks, sampled every ``interval`` s by a thread, of this process's huge-page-mapped
    memory (``/proc/self/smaps_rollup``: ``AnonHugePages`` for the heap, ``FilePmdMapped`` for
    file maps such as the scratch) and of the machine's dirty and under-writeback page cache
    (``/proc/vmstat``), all in bytes."""

    FIELDS = {"AnonHugePages": "anon_huge", "FilePmdMapped": "file_huge"}

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peaks = {"anon_huge": 0, "file_huge": 0, "dirty": 0, "writeback": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in self.FIELDS:
                    name = self.FIELDS[key]
                    self.peaks[name] = max(self.peaks[name], int(value.split()[0]) * 1024)
        with open("/proc/vmstat") as fh:
            for line in fh:
                key, value = line.split()
                if key in ("nr_dirty", "nr_writeback"):
                    name = key[3:]
                    self.peaks[name] = max(self.peaks[name], int(value) * 4096)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- child


def child(args: argparse.Namespace) -> None:
    from scipy.cluster.hierarchy import fcluster, linkage

    from corr_pipeline.compute.clusters import _canonical_labels, condensed_distances
    from corr_pipeline.snapshot import steps
    from corr_pipeline.snapshot.params import SnapshotParameters
    from corr_pipeline.store.matrix_store import MatrixStore

    params = SnapshotParameters(linkage_method=args.method, distance_threshold=args.threshold)
    t0 = time.perf_counter()
    steps.clusters(np.eye(3, dtype=np.float32), params.clusters)  # numba warm-up (cached kernels)
    warmup = time.perf_counter() - t0
    corr = np.load(args.corr, mmap_mode="r")
    n = corr.shape[0]
    store = MatrixStore(Path(args.corr).parent / "store")
    pages = PageSampler()
    before = read_status()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    pages.start()
    t0 = time.perf_counter()
    c0 = time.process_time()
    result: dict = {}
    if args.variant == "heap":
        labels = steps.clusters(corr, params.clusters)
    elif args.variant == "store":
        labels = steps.clusters(
            corr, params.clusters, scratch=partial(store.scratch, "clusters", PARTITION)
        )
    else:
        cond = condensed_distances(corr)
        result["condensed_s"] = time.perf_counter() - t0
        if args.variant == "scipy":
            Z = linkage(cond, args.method)
        else:
            import fastcluster

            if args.variant == "fc_public":
                Z = fastcluster.linkage(cond, args.method, preserve_input=False)
            elif args.variant == "fc_inplace":
                from _fastcluster import linkage_wrap

                Z = np.empty((n - 1, 4))
                linkage_wrap(n, cond, Z, fastcluster.mthidx[args.method])
            else:
                raise SystemExit(f"unknown variant {args.variant}")
        del cond
        labels = _canonical_labels(fcluster(Z, args.threshold, criterion="distance"))
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    pages.stop()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    after = read_status()
    result.update(pages.peaks)
    result["user_s"] = r1.ru_utime - r0.ru_utime
    result["sys_s"] = r1.ru_stime - r0.ru_stime
    result["minor_faults"] = r1.ru_minflt - r0.ru_minflt
    if args.variant == "store":
        result["scratch_left"] = len(
            [p for p in (store.base_dir / "clusters").rglob("*") if ".tmp-" in p.name]
        )
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
                **result,
            }
        )
    )


# ----------------------------------------------------------------------------- main

GB = 1e9


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(columns: list[str]) -> str:
    return _row(columns) + "\n|" + "|".join("-" * (len(c) + 2) for c in columns) + "|"


def run_n(args: argparse.Namespace, n: int, variants: list[str]) -> dict[str, list[dict]]:
    """Every variant ``args.repeat`` times at ``n``, interleaved; prints one row per run."""
    corr_path = ensure_corr(n, args.t, args.seed, args.workdir)
    print(
        f"\n## N = {n:,}, T = {args.t}, seed {args.seed}, {args.method} linkage, cut at distance "
        f"{args.threshold}; corr file {corr_path.stat().st_size / GB:.2f} GB, distances "
        f"{8 * n * (n - 1) // 2 / GB:.2f} GB; load average {os.getloadavg()[0]:.2f}\n"
    )
    print(
        _header(
            ["run", "variant", "wall s", "user s", "sys s", "minor faults", "peak RSS GB",
             "peak RssAnon GB", "RssAnon before GB", "heap / file huge pages GB",
             "machine dirty / writeback GB", "K", "same partition", "scratch left"]
        )
    )  # fmt: skip
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    ref_labels = None
    try:
        for repeat in range(args.repeat):
            for variant in variants:
                labels_path = args.workdir / f"labels_{variant}.npy"
                cmd = [
                    sys.executable, __file__, "--child", "--variant", variant,
                    "--corr", str(corr_path), "--labels-out", str(labels_path),
                    "--method", args.method, "--threshold", str(args.threshold),
                ]  # fmt: skip
                res, peak_anon = run_sampled(cmd)
                res["peak_anon"] = peak_anon
                labels = np.load(labels_path)
                labels_path.unlink()
                if ref_labels is None:
                    ref_labels = labels
                res["same"] = bool(np.array_equal(labels, ref_labels))
                runs[variant].append(res)
                print(
                    _row(
                        [
                            str(repeat + 1),
                            variant,
                            f"{res['seconds']:.1f}",
                            f"{res['user_s']:.1f}",
                            f"{res['sys_s']:.1f}",
                            f"{res['minor_faults']:,}",
                            f"{res['hwm'] / GB:.2f}",
                            f"{peak_anon / GB:.2f}",
                            f"{res['anon_before'] / GB:.2f}",
                            f"{res['anon_huge'] / GB:.2f} / {res['file_huge'] / GB:.2f}",
                            f"{res['dirty'] / GB:.2f} / {res['writeback'] / GB:.2f}",
                            str(res["k"]),
                            "yes" if res["same"] else "NO",
                            str(res.get("scratch_left", "-")),
                        ]
                    ),
                    flush=True,
                )
    finally:
        if not args.keep:
            corr_path.unlink(missing_ok=True)
    return runs


def summarise(n: int, runs: dict[str, list[dict]]) -> None:
    """Best and median per variant, and the ratio of the medians to the first variant's."""
    first = next(iter(runs))
    figures = {"wall s": ("seconds", 1.0), "CPU s": ("cpu_s", 1.0), "peak RSS GB": ("hwm", GB),
               "peak RssAnon GB": ("peak_anon", GB)}  # fmt: skip

    def stats(variant: str, key: str) -> tuple[float, float]:
        values = [r[key] for r in runs[variant]]
        return min(values), statistics.median(values)

    print(f"\nN = {n:,}: best / median of {len(runs[first])} runs, and median ÷ {first}'s median\n")
    columns = ["variant"]
    for name in figures:
        columns += [f"{name} best", f"{name} median", f"{name} ratio"]
    columns.append("partition = first")
    print(_header(columns))
    for variant in runs:
        cells = [variant]
        for key, scale in figures.values():
            best, median = stats(variant, key)
            ratio = median / stats(first, key)[1]
            cells += [f"{best / scale:.2f}", f"{median / scale:.2f}", f"{ratio:.2f}"]
        cells.append("yes" if all(r["same"] for r in runs[variant]) else "NO")
        print(_row(cells))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", default="12000,24000", help="numbers of symbols N, comma-separated")
    p.add_argument("--t", type=int, default=252, help="number of daily returns T")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="runs of every variant per N")
    p.add_argument(
        "--method", default="average", choices=["single", "complete", "average", "weighted"]
    )
    p.add_argument(
        "--threshold", type=float, default=1.0, help="distance cut (fcluster 'distance')"
    )
    p.add_argument(
        "--variants", default="heap,store", help=f"comma-separated, from {','.join(VARIANTS)}"
    )
    p.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "corr_pipeline_bench"
    )
    p.add_argument("--keep", action="store_true", help="keep the correlation files for reuse")
    # internal: child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--corr", help=argparse.SUPPRESS)
    p.add_argument("--labels-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}")
    print(f"# machine: {machine_line()}; load average at start {os.getloadavg()}")
    results = {n: run_n(args, n, variants) for n in (int(x) for x in args.n.split(","))}
    for n, runs in results.items():
        summarise(n, runs)
    print(f"\n# load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
