"""Benchmark: the products on threads against their stripes on a Dask LocalCluster, same run.

    python benchmarks/bench_dask.py --n 6000
    python benchmarks/bench_dask.py --n 24000 --products correlation neighbors --dir /tmp/dask_bench
    python benchmarks/bench_dask.py --n 64000 --sample-stripes 0 32000 --dir /big/dask_bench

For each product (correlation into ``.npy`` memory maps in ``--dir``, neighbors, lead-lag with
the correlation read from the map; the correlation's outputs are fresh files for every call,
allocated as the pipeline's step allocates them, ``MatrixStore.allocate``): the threaded
function (one thread per core, BLAS on one thread) and the striped one on a ``LocalCluster`` of
``--workers`` processes x 1 thread (started before the timings, numba compiled in the workers by
a small warm-up run; over ``tls://127.0.0.1``, as the pipeline reaches Dask, with certificates
made as ``corr-pipeline dask certs`` makes them, in the work directory), side by side, ``--rounds`` times: the threads first in odd rounds, Dask
first in even ones (the median and the geometric mean of the ratios at the end). The outputs
are compared byte for byte; the correlation's by a SHA-256 of each file taken after its call,
and the first call's files are deleted before the second call runs. Every timed call starts
with ``os.sync()``: at N = 24,000 the correlation writes 3.5 GB of pages, and without the sync
the next call's writes would be throttled by the kernel (``vm.dirty_ratio``) while the previous
call's pages are written back to disk.

Why the alternation and the deletion: on a virtual machine that hands free memory back to its
host (free page reporting, DAMON reclaim: this project's benchmark machine), a call that writes
its 3.5 GB while 7 GB of other files fill the page cache (the other products' input and the
other call's kept files) is given pages the host must back afresh, and takes ~1.5x as long,
whichever path it is (``--keep-first`` with neighbors or lead-lag shows it; docs/benchmarks.md).

Printed per product: wall seconds of both, their ratio, the CPU seconds of both (user + system: the client process for the threads; the
client and every worker process for Dask) and their ratio, which a shared machine's load
disturbs less than the wall time; the stripes' own compute seconds per stripe function (from
Dask's task stream: count, median, max, sum; a cluster of larger machines scales from these);
peak RSS and peak RssAnon of the client process above its level before the call, and the
workers' peak RSS (``VmHWM``, which counts the mapped matrix pages they touched) and
``RssAnon`` at the end. Before the products: the CPU the idle cluster itself spends per wall
second, over 5 s (event loops, heartbeats: Dask's share of its CPU seconds, which grows with the
wall time). ``--no-worker-profiler`` starts the workers without Dask's statistical profiler
(``distributed.worker.profile.enabled: false``, a worker setting; the default keeps Dask's).

With ``--sample-stripes START ...`` (a cluster of larger machines scales from these): no
products and no cluster; in this process, on one thread as in a worker, the correlation stripes
of ``--stripe-rows`` rows (default: the pipeline's, 2,048) starting at those rows, first pass
(the first twice: with and without standardising R, which a worker does once per step), then
their second pass, then the lead-lag stripe (default 512 rows) at the first start (its rows of
``corr`` are then whole), into sparse output files: seconds, CPU seconds, output bytes written
(correlation) or returned to the client (lead-lag), peak RSS / RssAnon above the level before,
per stripe, and R's size (what is scattered to each worker once per step).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from common import PeakMemory, git_commit, machine_line

from corr_pipeline.compute import (
    find_lead_lag_pairs,
    market_modes,
    market_residuals,
    pairwise_correlation,
    top_k_neighbors,
)
from corr_pipeline.compute.correlation.striped import (
    CORRELATION_STRIPE_ROWS,
    correlation_stripe,
    mirror_stripe,
    striped_correlation,
)
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.scan import MAX_BLOCK_ROWS
from corr_pipeline.compute.lead_lag.striped import lead_lag_stripe, striped_lead_lag
from corr_pipeline.compute.neighbors.striped import striped_neighbors
from corr_pipeline.compute.parallel.dask_runner import DaskRunner
from corr_pipeline.compute.parallel.runners import DEFAULT_STRIPE_ROWS, InProcessRunner, MappedFile
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.snapshot.measure import read_proc_status_kib, reset_peak_rss
from corr_pipeline.snapshot.scheduler_certs import cluster_security, make_certificates
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline.synth import ragged_returns

PRODUCTS = ("correlation", "neighbors", "lead_lag")
_IDLE_SECONDS = 5.0


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _worker_memory() -> dict[str, int]:
    return read_proc_status_kib(("VmHWM", "RssAnon"))


def _warm_up(t: int, min_overlap: int, max_lag: int, k: int) -> None:
    """Every product, threaded and striped, on 300 symbols in this process: numba's kernels
    loaded, so that no timed stripe pays for it (run in every worker and in the client)."""
    R = ragged_returns(t, 300, seed=2)
    with tempfile.TemporaryDirectory() as work:
        corr, overlap = (
            np.lib.format.open_memmap(f"{work}/{name}.npy", "w+", dtype, (300, 300))
            for name, dtype in (("corr", np.float32), ("overlap", overlap_dtype(t)))
        )
        runner = InProcessRunner()
        pairwise_correlation(R, min_overlap=min_overlap)
        striped_correlation(R, runner, min_overlap=min_overlap, out_corr=corr, out_overlap=overlap)
        top_k_neighbors(corr, k=k, overlap=overlap)
        striped_neighbors(corr, runner, k=k, overlap=overlap, working_memory_mb=512)
        for run in (find_lead_lag_pairs, partial(striped_lead_lag, runner=runner)):
            for sync, max_q in ((corr, 1.0), (None, 0.05)):  # the seed's scan, the pipeline's
                run(
                    R,
                    max_lag=max_lag,
                    k_leaders=k,
                    k_laggers=k,
                    min_overlap=min_overlap,
                    corr=sync,
                    max_q_value=max_q,
                )


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    return time.process_time()


def _timed(
    call: Callable[[], Any], client: Any = None
) -> tuple[Any, float, tuple[float, float], PeakMemory]:
    """``call()``'s result, wall seconds, CPU seconds (this process's, and every worker's of
    ``client`` summed) and peak memory."""

    def cpu() -> np.ndarray:
        workers = 0.0 if client is None else sum(client.run(_cpu_seconds).values())
        return np.array([_cpu_seconds(), workers])

    os.sync()  # no dirty pages of the call before: the kernel would throttle this one's writes
    cpu_before = cpu()
    with PeakMemory() as memory:
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
    here, workers = cpu() - cpu_before
    return result, seconds, (float(here), float(workers)), memory


def _sample_stripes(R: np.ndarray, args: argparse.Namespace, work: Path) -> None:
    """Per-stripe figures of the correlation and the lead-lag (see the module docstring)."""
    n = args.n
    b = args.stripe_rows or CORRELATION_STRIPE_ROWS
    ov_dtype = overlap_dtype(args.t)
    files = tuple(
        MappedFile.of(np.lib.format.open_memmap(work / f"{name}.npy", "w+", dtype, (n, n)))
        for name, dtype in (("corr", np.float32), ("overlap", ov_dtype))
    )
    print(f"# R: {R.nbytes / 2**20:,.1f} MiB, scattered once per step to each worker; {_load()}")
    starts = [min(s // b * b, n - 1) for s in args.sample_stripes]
    runs: list[tuple[int, str, Callable[..., None]]] = [
        (starts[0], "correlation, first in the process (standardises R)", correlation_stripe)
    ]
    runs += [(start, "correlation, first pass", correlation_stripe) for start in starts]
    runs += [(start, "correlation, second pass", mirror_stripe) for start in starts if start]
    for start, what, stripe_fn in runs:
        stripe = (start, min(start + b, n))
        if stripe_fn is correlation_stripe:
            columns = n - start

            def call(stripe: tuple[int, int] = stripe) -> None:
                correlation_stripe(R, stripe, "sample", args.min_overlap, *files)

        else:
            columns = start

            def call(stripe: tuple[int, int] = stripe) -> None:
                mirror_stripe(None, stripe, "sample", *files)

        written = (stripe[1] - start) * columns * (4 + ov_dtype.itemsize)
        _, seconds, cpu, memory = _timed(call)
        print(
            f"{what:<52} rows {stripe[0]:>6}-{stripe[1]:<6} {seconds:7.2f} s  CPU {sum(cpu):7.2f} s"
            f"  written {written / 2**20:8,.1f} MiB  peak RSS +{memory.above.rss_mib:6,.0f}"
            f" MiB  RssAnon +{memory.above.anon_mib:6,.0f} MiB; {_load()}"
        )
    b = args.stripe_rows or DEFAULT_STRIPE_ROWS
    stripe = (starts[0] // b * b, min(starts[0] // b * b + b, n))
    part, seconds, cpu, memory = _timed(
        lambda: lead_lag_stripe(
            R,
            stripe,
            "sample",
            files[0],
            args.max_lag,
            args.k,
            args.k,
            args.min_overlap,
            0.0,
            N_BINS,
            MAX_BLOCK_ROWS,
            True,  # the one pass of the pipeline's scan (corr given, no q-value condition)
            None,
        )
    )
    print(
        f"{'lead-lag, no floor (as a first stripe)':<52} rows {stripe[0]:>6}-{stripe[1]:<6}"
        f" {seconds:7.2f} s  CPU {sum(cpu):7.2f} s  returned {_stripe_bytes(part) / 2**20:,.1f}"
        f" MiB ({part.pool.size:,} pooled column candidates)  peak RSS"
        f" +{memory.above.rss_mib:6,.0f} MiB  RssAnon +{memory.above.anon_mib:6,.0f} MiB; {_load()}"
    )


def _stripe_bytes(part: Any) -> int:
    """The bytes a lead-lag stripe ships back: its arrays and its p-value counts."""
    arrays = [part.row_pairs, part.pool, part.column_pairs, part.lower]
    if part.counts is not None:
        arrays += [part.counts.bins, part.counts.counts]
    return sum(a.nbytes for a in arrays)


def _digest(a: np.ndarray, rows: int = 1024) -> bytes:
    """SHA-256 of the array's bytes, read ``rows`` rows at a time."""
    digest = hashlib.sha256()
    for i in range(0, a.shape[0], rows):
        digest.update(np.ascontiguousarray(a[i : i + rows]).data)
    return digest.digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--threads-per-worker",
        type=int,
        default=1,
        help="threads of each worker process (stripes of one process share its window)",
    )
    parser.add_argument(
        "--stripe-rows",
        type=int,
        help=f"rows per stripe (default: {CORRELATION_STRIPE_ROWS} for the correlation, "
        f"{DEFAULT_STRIPE_ROWS} for the others, as the pipeline runs them)",
    )
    parser.add_argument("--products", nargs="+", choices=PRODUCTS, default=list(PRODUCTS))
    parser.add_argument(
        "--market-modes",
        type=int,
        default=1,
        metavar="M",
        help="the lead-lag scans the market residuals after the M strongest modes of corr "
        "(found once, untimed), as the pipeline with lead_lag_market_modes = M (default 1); "
        "0: the returns with corr",
    )
    parser.add_argument(
        "--max-q",
        type=float,
        default=0.05,
        metavar="Q",
        help="the lead-lag's max_q_value (default 0.05, the pipeline's)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run threads and Dask side by side this many times (alternating); the median ratio",
    )
    parser.add_argument("--dir", type=Path, help="where the memory maps go (default: a temp dir)")
    parser.add_argument(
        "--no-worker-profiler",
        action="store_true",
        help="start the workers with distributed.worker.profile.enabled = false",
    )
    parser.add_argument(
        "--keep-first",
        action="store_true",
        help="keep the first call's correlation files until the second call is done (the "
        "protocol before the deletion: shows what the second call pays for it)",
    )
    parser.add_argument(
        "--sample-stripes",
        type=int,
        nargs="+",
        metavar="START",
        help="time single stripes starting at these rows in this process instead (large N)",
    )
    args = parser.parse_args()

    import dask
    from distributed import Client, LocalCluster, get_task_stream

    R = ragged_returns(args.t, args.n, seed=1)
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_dask_"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shape, ov_dtype = (args.n, args.n), overlap_dtype(args.t)
    if args.sample_stripes:
        _warm_up(args.t, args.min_overlap, args.max_lag, args.k)
        print(f"# {machine_line()}; commit {git_commit()}")
        print(
            f"# N = {args.n}, T = {args.t}, min_overlap = {args.min_overlap}, max_lag = "
            f"{args.max_lag}, k = {args.k}; stripes of {args.stripe_rows or CORRELATION_STRIPE_ROWS}"
            f" (correlation), {args.stripe_rows or DEFAULT_STRIPE_ROWS} (lead-lag) rows, one thread"
        )
        _sample_stripes(R, args, work)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
        return

    store = MatrixStore(work / "store")
    pending: list[Any] = []

    def outputs(tag: str) -> tuple[np.memmap, np.memmap]:
        """Fresh output files, allocated as the pipeline's correlation step allocates them
        (:meth:`MatrixStore.allocate`: a new file, its blocks reserved, never written)."""
        pending.extend(
            store.allocate("bench", tag, name, shape, dtype)
            for name, dtype in (("corr", np.float32), ("overlap", ov_dtype))
        )
        return pending[-2].array, pending[-1].array

    def discard() -> None:
        """Drop the files of the calls so far (the page cache holds one pair of outputs)."""
        while pending:
            pending.pop().abort()

    if args.no_worker_profiler:  # Dask's statistical profiler samples every worker's stack
        dask.config.set({"distributed.worker.profile.enabled": False})
    certs = make_certificates(work / "dask-tls")
    cluster = LocalCluster(
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        processes=True,
        protocol="tls://",
        host="127.0.0.1",
        security=cluster_security(certs),
        local_directory=str(certs.worker_space),
        dashboard_address="127.0.0.1:0",
    )
    client = Client(cluster, set_as_default=False)
    runner = DaskRunner(client)
    client.run(_warm_up, args.t, args.min_overlap, args.max_lag, args.k)
    _warm_up(args.t, args.min_overlap, args.max_lag, args.k)
    print(f"# {machine_line()}; commit {git_commit()}")
    print(
        f"# N = {args.n}, T = {args.t}, min_overlap = {args.min_overlap}, max_lag = "
        f"{args.max_lag}, k = {args.k}; LocalCluster {args.workers} workers x "
        f"{args.threads_per_worker} thread(s), stripes "
        f"of {args.stripe_rows or f'{CORRELATION_STRIPE_ROWS} (correlation), {DEFAULT_STRIPE_ROWS}'} rows"
        f"{', worker profiler off' if args.no_worker_profiler else ''}; lead-lag: market modes "
        f"{args.market_modes}, max_q_value {args.max_q}; {_load()}"
    )
    _, idle, idle_cpu, _ = _timed(lambda: time.sleep(_IDLE_SECONDS), client)
    print(
        f"# the idle cluster's own CPU per wall second (event loops, heartbeats; the client "
        f"process hosts the scheduler and the nannies): client {idle_cpu[0] / idle:.3f}, "
        f"workers {idle_cpu[1] / idle:.3f}"
    )

    read_store = MatrixStore(work / "read")  # the corr and overlap the other products read
    read_corr, read_ov = (
        read_store.allocate("bench", "read", name, shape, dtype)
        for name, dtype in (("corr", np.float32), ("overlap", ov_dtype))
    )
    corr_t, ov_t = read_corr.array, read_ov.array
    written: dict[str, tuple[np.memmap, np.memmap]] = {}

    def correlation_into(tag: str, call: Callable[..., None], *args_: Any, **kwargs: Any) -> None:
        written[tag] = outputs(tag)  # a fresh pair of files for every call
        call(R, *args_, out_corr=written[tag][0], out_overlap=written[tag][1], **kwargs)

    jobs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "correlation": (
            lambda: correlation_into("threads", pairwise_correlation, min_overlap=args.min_overlap),
            lambda: correlation_into(
                "dask",
                striped_correlation,
                runner,
                min_overlap=args.min_overlap,
                stripe_rows=args.stripe_rows or CORRELATION_STRIPE_ROWS,
            ),
        ),
        "neighbors": (
            lambda: top_k_neighbors(corr_t, k=args.k, overlap=ov_t),
            lambda: striped_neighbors(
                corr_t,
                runner,
                k=args.k,
                overlap=ov_t,
                working_memory_mb=512,
                stripe_rows=args.stripe_rows or DEFAULT_STRIPE_ROWS,
            ),
        ),
        "lead_lag": (
            lambda: find_lead_lag_pairs(
                lead_lag_input[0],
                max_lag=args.max_lag,
                k_leaders=args.k,
                k_laggers=args.k,
                min_overlap=args.min_overlap,
                corr=lead_lag_input[1],
                max_q_value=args.max_q,
            ),
            lambda: striped_lead_lag(
                lead_lag_input[0],
                runner,
                max_lag=args.max_lag,
                k_leaders=args.k,
                k_laggers=args.k,
                min_overlap=args.min_overlap,
                corr=lead_lag_input[1],
                max_q_value=args.max_q,
                stripe_rows=args.stripe_rows or DEFAULT_STRIPE_ROWS,
            ),
        ),
    }
    lead_lag_input: tuple[np.ndarray, np.ndarray | None] = (R, corr_t)
    if {"neighbors", "lead_lag"} & set(args.products):
        pairwise_correlation(R, min_overlap=args.min_overlap, out_corr=corr_t, out_overlap=ov_t)
    if "lead_lag" in args.products and args.market_modes:
        vectors = market_modes(corr_t, args.market_modes).vectors
        lead_lag_input = (market_residuals(R, vectors), None)

    def run(
        product: str, path: str, keep: bool
    ) -> tuple[Any, float, tuple[float, float], PeakMemory, Any]:
        """One timed call of ``path`` ("threads" or "dask"): its result (the digests of the
        correlation's files, which are then deleted unless ``keep``), seconds, CPU seconds,
        peak memory and, for Dask, the task stream and the workers' memory."""
        threaded, striped = jobs[product]
        if path == "threads":
            result, seconds, cpu, memory = _timed(threaded)
            extra = None
        else:
            client.run(reset_peak_rss)
            with get_task_stream(client=client) as stream:
                result, seconds, cpu, memory = _timed(striped, client)
            extra = (stream.data, client.run(_worker_memory))
        if product == "correlation":
            result = tuple(_digest(matrix) for matrix in written.pop(path))
            if not keep:
                discard()  # no map left of the files: their pages go with them
        return result, seconds, cpu, memory, extra

    ratios: dict[str, list[float]] = {}
    for round_, product in [
        (r, p) for r in range(args.rounds) for p in PRODUCTS if p in args.products
    ]:
        order = ("threads", "dask") if round_ % 2 == 0 else ("dask", "threads")
        if args.rounds > 1:
            print(f"round {round_ + 1} of {args.rounds}: {order[0]} first")
        calls = {path: run(product, path, path == order[0] and args.keep_first) for path in order}
        discard()
        expected, t_threads, cpu_threads, m_threads, _ = calls["threads"]
        found, t_dask, cpu_dask, m_dask, (stream_data, workers) = calls["dask"]
        ratios.setdefault(product, []).append(t_dask / t_threads)
        if product == "neighbors":
            same = all(a.tobytes() == b.tobytes() for a, b in zip(expected, found, strict=True))
        elif product == "correlation":
            same = expected == found
        else:
            same = expected.tobytes() == found.tobytes()
        by_function: dict[str, list[float]] = {}
        for task in stream_data:
            for span in task["startstops"]:
                if span["action"] == "compute":
                    by_function.setdefault(str(task["key"]).split("-")[0], []).append(
                        span["stop"] - span["start"]
                    )
        hwm = max(w.get("VmHWM", 0) for w in workers.values()) / 1024
        anon = max(w.get("RssAnon", 0) for w in workers.values()) / 1024
        print(
            f"{product:<12} threads {t_threads:8.2f} s  dask {t_dask:8.2f} s  ratio "
            f"{t_dask / t_threads:5.2f}  identical {same}; {_load()}"
        )
        print(
            f"  CPU s        threads {sum(cpu_threads):8.2f}    dask {sum(cpu_dask):8.2f}    ratio "
            f"{sum(cpu_dask) / sum(cpu_threads):5.2f} (client {cpu_dask[0]:.2f}, workers "
            f"{cpu_dask[1]:.2f})"
        )
        for function, compute in by_function.items():
            print(
                f"  {function} x {len(compute)}: compute median {np.median(compute):.3f} s, "
                f"max {max(compute):.3f} s, sum {sum(compute):.2f} s"
            )
        for name, memory in (("threads", m_threads), ("dask client", m_dask)):
            above = memory.above
            print(
                f"  {name:<12} peak RSS +{above.rss_mib:8,.0f} MiB  peak RssAnon "
                f"+{above.anon_mib:8,.0f} MiB"
            )
        print(f"  each worker  peak RSS {hwm:8,.0f} MiB  RssAnon at end {anon:8,.0f} MiB")
    if args.rounds > 1:
        for product, values in ratios.items():
            print(
                f"{product}: dask / threads over {len(values)} rounds: median "
                f"{np.median(values):.2f}, geometric mean {np.exp(np.mean(np.log(values))):.2f} ("
                + ", ".join(f"{v:.2f}" for v in values)
                + ")"
            )
    client.close()
    cluster.close()
    read_corr.abort()
    read_ov.abort()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
