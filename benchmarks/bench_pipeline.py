"""Benchmark: the whole nightly chain, database to publish, stage by stage.

    python benchmarks/bench_pipeline.py --n 6000 --t 350
    python benchmarks/bench_pipeline.py --n 24000 --t 252 --home /tmp/corr_bench_home

Stages are the functions the Dagster assets call, run in this process one
after the other, on a synthetic universe written into the project database
(the embedded PostgreSQL under ``--home`` unless CORR_PIPELINE_DATABASE_URL is
set): window load → correlation + overlap (memory-mapped into the matrix
store, as the asset does) → neighbors → clusters → lead-lag (sync corr read
from the memory map) → publish (one transaction). Per stage it prints wall
seconds, the process's peak RSS and peak RssAnon during the stage (sampled
every 10 ms from /proc/self/status; memory maps count in RSS, not in RssAnon),
and rows published. With Dagster's multiprocess executor every stage is its
own process, so the per-stage peaks are what each step needs.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from common import PeakMemory, git_commit, machine_line

STAGES = ("load window", "correlation", "neighbors", "clusters", "lead-lag", "publish")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000, help="symbols")
    parser.add_argument("--t", type=int, default=252, help="lookback_days (returns rows)")
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--k", type=int, default=10, help="k_neighbors = k_leaders = k_laggers")
    parser.add_argument("--working-memory-mb", type=float, default=256)
    parser.add_argument("--home", type=Path, default=Path("/tmp/corr_bench_home"))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--skip-synth", action="store_true", help="reuse the prices already there")
    args = parser.parse_args()

    os.environ.setdefault("CORR_PIPELINE_HOME", str(args.home))
    from corr_pipeline.compute import (
        find_lead_lag_pairs,
        hierarchical_clusters,
        pairwise_correlation,
        top_k_neighbors,
    )
    from corr_pipeline.compute.tiling import overlap_dtype
    from corr_pipeline.db.engine import get_engine
    from corr_pipeline.db.publish import publish_snapshot
    from corr_pipeline.db.schema import init_schema
    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.db.window import load_returns_window
    from corr_pipeline.store.matrix_store import MatrixStore
    from corr_pipeline.synth_model import DEFAULT_END_DATE

    engine = get_engine()
    init_schema(engine)
    print(f"# {machine_line()}; commit {git_commit()}")
    print(
        f"# N = {args.n}, T = {args.t}, max_lag = {args.max_lag}, k = {args.k},"
        f" working_memory_mb = {args.working_memory_mb}"
    )
    if not args.skip_synth:
        start = time.perf_counter()
        report = write_synthetic_universe(
            engine, n_symbols=args.n, n_days=args.t + 1, seed=args.seed
        )
        print(
            f"synth   {report.rows_written:,} price rows written in"
            f" {time.perf_counter() - start:.1f} s (not part of the nightly run)"
        )
    snapshot = DEFAULT_END_DATE
    store = MatrixStore(args.home / "bench_store")
    partition = snapshot.isoformat()
    min_overlap = max(2, min(60, args.t // 4))
    results: dict[str, object] = {}
    rows: list[tuple[str, float, float, float, str]] = []

    def stage(name: str, fn) -> None:
        with PeakMemory() as memory:
            start = time.perf_counter()
            note = fn()
            seconds = time.perf_counter() - start
        rows.append((name, seconds, memory.peak_rss / 1024, memory.peak_anon / 1024, note or ""))
        print(
            f"  {name:<12} {seconds:8.1f} s  peak RSS {memory.peak_rss / 1024:8,.0f} MiB"
            f"  peak RssAnon {memory.peak_anon / 1024:8,.0f} MiB  {note or ''}",
            flush=True,
        )

    def load() -> str:
        window = load_returns_window(
            engine, snapshot, lookback_days=args.t, min_history_days=min_overlap * 2
        )
        results["window"] = window
        return f"T x N = {window.returns.shape[0]} x {window.returns.shape[1]}"

    def correlation() -> str:
        returns = results["window"].returns
        n = returns.shape[1]
        pending_corr = store.allocate("correlation_matrix", partition, "corr", (n, n), np.float32)
        pending_overlap = store.allocate(
            "overlap_matrix", partition, "overlap", (n, n), overlap_dtype(returns.shape[0])
        )
        pairwise_correlation(
            returns,
            min_overlap=min_overlap,
            working_memory_mb=args.working_memory_mb,
            out_corr=pending_corr.array,
            out_overlap=pending_overlap.array,
        )
        results["corr"] = pending_corr.commit().array
        results["overlap"] = pending_overlap.commit().array
        size = (results["corr"].nbytes + results["overlap"].nbytes) / 2**30
        return f"{size:.2f} GiB memory-mapped"

    def neighbors() -> str:
        results["neighbors"] = top_k_neighbors(
            results["corr"],
            k=args.k,
            overlap=results["overlap"],
            working_memory_mb=args.working_memory_mb,
        )
        return ""

    def clusters() -> str:
        labels = hierarchical_clusters(results["corr"], method="average", distance_threshold=1.2)
        results["labels"] = labels
        return f"{labels.max() + 1} clusters"

    def lead_lag() -> str:
        pairs = find_lead_lag_pairs(
            results["window"].returns,
            max_lag=args.max_lag,
            k_leaders=args.k,
            k_laggers=args.k,
            min_overlap=min_overlap,
            corr=results["corr"],
            working_memory_mb=args.working_memory_mb,
        )
        results["pairs"] = pairs
        return f"{pairs.size:,} pairs"

    def publish() -> str:
        window, found = results["window"], results["neighbors"]
        report = publish_snapshot(
            engine,
            snapshot_date=snapshot,
            as_of_trade_date=window.as_of_trade_date,
            symbols=window.symbols,
            n_dropped=len(window.dropped),
            lookback_days=args.t,
            params={"benchmark": True, "max_lag": args.max_lag, "k": args.k},
            neighbor_index=found.index,
            neighbor_corr=found.corr,
            neighbor_overlap=found.overlap,
            cluster_labels=results["labels"],
            lead_lag_pairs=results["pairs"],
        )
        return ", ".join(f"{table} {count:,}" for table, count in report.rows.items())

    total = time.perf_counter()
    for name, fn in zip(
        STAGES, (load, correlation, neighbors, clusters, lead_lag, publish), strict=True
    ):
        stage(name, fn)
    print(f"  {'total':<12} {time.perf_counter() - total:8.1f} s")
    print()
    print("| stage | wall s | peak RSS MiB | peak RssAnon MiB | note |")
    print("|---|---:|---:|---:|---|")
    for name, seconds, rss, anon, note in rows:
        print(f"| {name} | {seconds:.1f} | {rss:,.0f} | {anon:,.0f} | {note} |")


if __name__ == "__main__":
    main()
