"""Benchmark: the snapshot_changes step (SPEC §10) against the whole snapshot, side by side.

One synthetic universe of ``--n`` symbols with ``--t + 2`` trade dates is written into a scratch
embedded PostgreSQL (``--home``/pgdata, as ``corr-pipeline bench``); the whole snapshot chain of
:mod:`corr_pipeline.snapshot.steps` runs for the previous trade date and for the last one (each
stage timed, matrices memory-mapped in ``--home``/store and pinned by the publication), then the
changes of the last date against the previous one run **in a fresh process** (so its memory
figures are its own, as a Dagster step's would be): the published rows of both dates, the
drift and top moves over the pinned matrices, turnover, clusters, lead-lag, and the publication
of the change tables. Targets: the changes step at most 10 % of the whole snapshot's
time; its peak anonymous memory (RssAnon) under 1 GiB.

    python benchmarks/bench_changes.py --n 6000 --t 252
    python benchmarks/bench_changes.py --n 24000 --t 252 --home /tmp/corr_changes_bench

Peak RSS counts the memory-mapped matrix pages the step touched (page cache, shared);
RssAnon only the process's own memory: that is the budget.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from corr_pipeline.bench import git_commit, machine_line
from corr_pipeline.bench.pipeline import bench_parameters
from corr_pipeline.cli.bench import bench_engine
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, overlap_dtype
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.db.publish_changes import publish_changes
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.snapshot import steps
from corr_pipeline.snapshot.changes import compute_changes, publication
from corr_pipeline.snapshot.measure import PeakMemory, measure_stage
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline.synth import DEFAULT_END_DATE


def snapshot(engine: sa.Engine, store: MatrixStore, day: dt.date, params: SnapshotParameters):
    """The whole chain for ``day`` (load, correlation into the store, neighbors, clusters,
    lead-lag, publication pinning the matrices); returns ``{stage: seconds}``."""
    seconds: dict[str, float] = {}
    key = day.isoformat()
    with measure_stage() as stats:
        window = steps.load_returns(engine, day, params)
    seconds["load window"] = stats.seconds
    R, symbols = window.returns, window.symbols
    n = R.shape[1]
    with measure_stage() as stats:
        labels = {"symbols": symbols}
        with (
            store.allocate("correlation_matrix", key, "corr", (n, n), "f4", labels=labels) as pc,
            store.allocate(
                "overlap_matrix", key, "overlap", (n, n), overlap_dtype(R.shape[0]), labels=labels
            ) as po,
        ):
            steps.correlation(R, params.correlation, out_corr=pc.array, out_overlap=po.array)
            corr, overlap = pc.commit(), po.commit()
    seconds["correlation"] = stats.seconds
    with measure_stage() as stats:
        found = steps.neighbors(corr.array, overlap.array, params.neighbors)
    seconds["neighbors"] = stats.seconds
    with measure_stage() as stats:
        cluster_labels = steps.clusters(corr.array, params.clusters)
    seconds["clusters"] = stats.seconds
    with measure_stage() as stats:
        pairs = steps.lead_lag(R, corr.array, params.lead_lag)
    seconds["lead-lag"] = stats.seconds
    with measure_stage() as stats:
        publish_snapshot(
            engine,
            steps.results_for_publication(
                day,
                as_of_trade_date=window.as_of_trade_date,
                symbols=symbols,
                n_dropped=len(window.dropped),
                params=params,
                found=found,
                labels=cluster_labels,
                pairs=pairs,
                recorded={"benchmark": "bench_changes"},
                matrix_versions={
                    "correlation_matrix": {"corr": corr.version},
                    "overlap_matrix": {"overlap": overlap.version},
                },
            ),
        )
    seconds["publish"] = stats.seconds
    for stored in (corr, overlap):
        stored.release_writer_lock()
    return seconds


def changes_only(args: argparse.Namespace) -> None:
    """The changes step of ``args.date`` in this (fresh) process; prints one JSON line."""
    engine, _ = bench_engine(args, Path(args.home))
    day = dt.date.fromisoformat(args.date)
    store = MatrixStore(Path(args.home) / "store")
    timings: dict[str, float] = {}
    profile = cProfile.Profile() if args.profile else None
    with PeakMemory(interval=0.01) as memory:
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        results = compute_changes(
            engine, store, day, working_memory_mb=args.working_memory_mb, log=print
        )
        if profile is not None:
            profile.disable()
            pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        assert results is not None and not results.skipped, results and results.skipped
        timings["compute"] = time.perf_counter() - start
        t = time.perf_counter()
        rows = publication(results)
        timings["rows"] = time.perf_counter() - t
        t = time.perf_counter()
        report = publish_changes(engine, rows)
        timings["publish"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - start
    print(
        json.dumps(
            {
                "timings": timings,
                "publish_timings": report.timings,
                "rows": report.rows,
                "n_pairs": results.correlation.n_pairs if results.correlation else None,
                "peak_anon_mib": memory.peak_anon / 1024,
                "base_anon_mib": memory.base_anon / 1024,
                "peak_rss_mib": memory.peak_rss / 1024,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--working-memory-mb", type=float, default=DEFAULT_WORKING_MEMORY_MB)
    parser.add_argument("--home", default="/tmp/corr_changes_bench")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of the changes step (stderr)"
    )
    parser.add_argument("--changes-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--date", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    home = Path(args.home).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    args.home = str(home)
    if args.changes_only:
        changes_only(args)
        return 0
    engine, where = bench_engine(args, home)
    print(f"# {machine_line()}; commit {git_commit()}\n# database: {where}")
    params = bench_parameters(
        args.t, max_lag=args.max_lag, k=args.k, working_memory_mb=args.working_memory_mb
    )
    write_synthetic_universe(engine, n_symbols=args.n, n_days=args.t + 2, seed=args.seed)
    with engine.connect() as conn:
        previous = conn.execute(
            sa.text("SELECT max(trade_date) FROM prices WHERE trade_date < :d"),
            {"d": DEFAULT_END_DATE},
        ).scalar_one()
    with engine.begin() as conn:  # earlier runs' changes of these dates
        conn.execute(sa.text("DELETE FROM change_summaries"))
    store = MatrixStore(home / "store")
    for key in store.files.partition_keys():
        store.collector.remove_partition(key)
    totals = {}
    for day in (previous, DEFAULT_END_DATE):
        seconds = snapshot(engine, store, day, params)
        totals[day] = sum(seconds.values())
        print(f"snapshot {day}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    url = engine.url.render_as_string(hide_password=False)
    out = subprocess.run(
        [sys.executable, __file__, "--changes-only", "--date", DEFAULT_END_DATE.isoformat(),
         "--home", str(home), "--database-url", url,
         "--working-memory-mb", str(args.working_memory_mb), *(["--profile"] * args.profile)],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout  # fmt: skip
    figures = json.loads(out.strip().splitlines()[-1])
    t = figures["timings"]
    whole = totals[DEFAULT_END_DATE]
    print(
        "\n| N | T | whole snapshot s | changes s (compute / rows / publish) | ratio "
        "| pairs compared | change rows | peak RssAnon MiB (at entry) | peak RSS MiB |"
    )
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    rows = sum(figures["rows"].values())
    print(
        f"| {args.n:,} | {args.t} | {whole:.1f} | {t['total']:.2f} ({t['compute']:.2f} / "
        f"{t['rows']:.2f} / {t['publish']:.2f}) | {t['total'] / whole:.1%} "
        f"| {figures['n_pairs']:,} | {rows:,} | {figures['peak_anon_mib']:,.0f} "
        f"({figures['base_anon_mib']:,.0f}) | {figures['peak_rss_mib']:,.0f} |"
    )
    print("change rows: " + ", ".join(f"{k} {v:,}" for k, v in figures["rows"].items()))
    print("publish: " + ", ".join(f"{k} {v:.3f}" for k, v in figures["publish_timings"].items()))
    for key in store.files.partition_keys():
        store.collector.remove_partition(key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
