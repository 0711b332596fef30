"""Benchmark: a backfill of S sessions, by several routes, side by side in one run.

::

    python benchmarks/bench_backfill.py --n 500 --sessions 20
    python benchmarks/bench_backfill.py --n 500 --sessions 250 --routes chain,range
    python benchmarks/bench_backfill.py --n 24000 --sessions 8 --routes chain,range,range,chain

On a synthetic universe of N symbols × (T + S + 1) weekdays in a scratch embedded PostgreSQL
(under ``--home``), the last S sessions of the calendar are computed and published by:

- ``chain``: the in-process chain of ``corr-pipeline bench`` (:mod:`corr_pipeline.bench.pipeline`:
  window, correlation into a matrix store, neighbors, clusters, lead-lag, publish) looped over
  the sessions in this process, with the work every nightly run does besides: the assets'
  checks and the changes against the session before
  (:func:`corr_pipeline.snapshot.changes.compute_and_publish`), the matrices of the newest
  ``--keep`` sessions kept on disk as retention keeps them and the others' in the store's
  memory area, as the range keeps them: the work itself, the baseline;
- ``range``: ``corr-pipeline backfill`` (:func:`corr_pipeline.defs.backfill.run_backfill`):
  runs of consecutive sessions through a Dagster instance, the code location in a code server,
  each run in a run worker computing its sessions one after the other, every check, the
  changes, the newest session's pictures;
- ``range-on-disk``: the same with the store's memory area off (``CORR_PIPELINE_MEMORY_DIR=off``):
  the matrices of sessions that retention will not keep go to disk too;
- ``per-session``: one ``snapshot_job`` run per session through the same instance
  (:func:`corr_pipeline.defs.run.launch_snapshot`): what a job backfill (``dagster job
  backfill``, the job page's *Launch backfill*) does.

A route may be listed more than once (``chain,range,range,chain``): its runs are averaged, so
the effects of the order cancel. Between routes the published tables are emptied, PostgreSQL
checkpoints, dirty pages are written and (as root) the page cache is dropped.

Printed per route: wall seconds, seconds per session, sessions per hour, the ratio to the chain
and to the chain without its checks and changes (the chain of ``corr-pipeline bench`` alone),
the peak RSS and peak RssAnon of the largest process (sampled from /proc every 20 ms:
:class:`corr_pipeline.bench.ProcessTreePeaks`; the chain's are this process's own), and the
bytes the route's processes sent to disk (``/proc/<pid>/io``: ``write_bytes`` less
``cancelled_write_bytes``; PostgreSQL's own writes, in its server processes, are not counted).
Then, per session, the seconds of each stage of the chain and of the range (the ``stage_seconds``
and ``check_seconds`` of the range's materializations) side by side, and what is left of each
route's wall time besides its stages (for the range: Dagster's bookkeeping, the runs' start,
the newest session's pictures, retention).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROUTES = ("chain", "range", "range-on-disk", "per-session")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="symbols (default 500)")
    parser.add_argument("--t", type=int, default=252, help="lookback_days (default 252)")
    parser.add_argument("--sessions", type=int, default=20, help="sessions (default 20)")
    parser.add_argument(
        "--routes",
        default=",".join(ROUTES),
        help=f"of {', '.join(ROUTES)}, in this order; one listed twice is averaged",
    )
    parser.add_argument("--per-run", type=int, help="sessions per range run (default: sized)")
    parser.add_argument(
        "--keep",
        type=int,
        default=5,
        help="CORR_PIPELINE_KEEP_MATRICES: sessions that keep their matrices (default 5)",
    )
    parser.add_argument(
        "--dagster-storage",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="the instance's run and event storage: SQLite files under DAGSTER_HOME (the "
        "project's dagster.yaml) or a database of the embedded PostgreSQL (deploy/dagster.yaml's "
        "arrangement)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--home", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument(
        "--verbose", action="store_true", help="print the backfill's own lines (steps, sessions)"
    )
    return parser.parse_args()


def main() -> int:
    args = _parse()
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    unknown = set(routes) - set(ROUTES)
    if unknown:
        raise SystemExit(f"unknown routes {sorted(unknown)}: choose from {', '.join(ROUTES)}")
    home = (args.home or Path(tempfile.mkdtemp(prefix="corr_backfill_bench_"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    days = args.t + args.sessions + 10
    first_day = _weekdays_back(dt.date(2026, 11, 27), days)
    # the code location (here and in its code server) reads these when it loads
    os.environ.update(
        {
            "CORR_PIPELINE_HOME": str(home),
            "CORR_PIPELINE_STORE_DIR": str(home / "store"),
            "DAGSTER_HOME": str(home / "dagster_home"),
            "CORR_PIPELINE_PARTITION_START": first_day.isoformat(),
            "CORR_PIPELINE_UNIVERSE_SYMBOLS": str(args.n),
            "CORR_PIPELINE_KEEP_MATRICES": str(args.keep),
        }
    )
    from corr_pipeline import settings
    from corr_pipeline.bench import ProcessTreePeaks, machine_line
    from corr_pipeline.bench.pipeline import bench_parameters
    from corr_pipeline.bench.processes import written_bytes
    from corr_pipeline.db import engine as db_engine
    from corr_pipeline.db.migrate import upgrade
    from corr_pipeline.db.price_source import NATIVE_PRICES
    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.defs.backfill import BackfillRequest, run_backfill
    from corr_pipeline.defs.partitions import snapshot_partitions
    from corr_pipeline.defs.run import launch_snapshot, open_instance
    from corr_pipeline.snapshot.measure import PeakMemory

    server = db_engine.start_embedded_server(home / "pgdata")
    engine = db_engine.get_engine(server.url())
    upgrade(engine)
    settings.export_database_url(server.url())
    if args.dagster_storage == "postgres":
        _postgres_instance(engine, server, home / "dagster_home")
    params = bench_parameters(args.t, max_lag=5, k=10, working_memory_mb=512)
    overrides = {**params.as_dict(), "clusters_memory_mb": params.clusters_memory_mb}
    written = write_synthetic_universe(
        engine, n_symbols=args.n, n_days=days, seed=args.seed, end_date=dt.date(2026, 11, 27)
    )
    sessions = [k for k in snapshot_partitions.get_partition_keys() if k <= "2026-11-27"]
    sessions = sessions[-args.sessions :]
    print(f"# {machine_line()}")
    print(
        f"# N = {args.n:,}, T = {args.t}, {len(sessions)} sessions {sessions[0]}..{sessions[-1]}"
        f", {written.rows_written:,} price rows; keep {args.keep}; Dagster storage "
        f"{args.dagster_storage}; scratch {home}"
    )
    dropped = _drop_page_cache()
    print(
        f"# between routes: PostgreSQL CHECKPOINT, sync{', page cache dropped' if dropped else ''}"
    )
    rows = []
    stage_seconds: dict[str, dict[str, float]] = {}
    for route in routes:
        for table in ("change_summaries", "snapshots"):
            with engine.begin() as conn:  # every route starts from nothing published
                conn.exec_driver_sql(f"TRUNCATE {table} CASCADE")
        # nor does it pay for the previous route's writes: its dirty pages and PostgreSQL's WAL
        with engine.connect() as conn:
            conn.exec_driver_sql("CHECKPOINT")
        os.sync()
        _drop_page_cache()
        per = stage_seconds.setdefault(route, {})
        start = time.perf_counter()
        written_before = written_bytes() or 0
        os.environ.pop(settings.ENV_MEMORY_DIR, None)
        if route == "range-on-disk":
            os.environ[settings.ENV_MEMORY_DIR] = "off"
        if route == "chain":
            with PeakMemory() as peak:
                _chain(engine, home / "chain_store", sessions, args, params, per)
            rss, anon = peak.peak_rss / 1024, peak.peak_anon / 1024  # KiB
            written = (written_bytes() or 0) - written_before
        else:
            instance = open_instance(home / "dagster_home")
            try:
                with ProcessTreePeaks() as peaks:
                    if route.startswith("range"):
                        report = run_backfill(
                            instance,
                            engine,
                            BackfillRequest(
                                first=dt.date.fromisoformat(sessions[0]),
                                last=dt.date.fromisoformat(sessions[-1]),
                                params=params,
                                source=NATIVE_PRICES,
                                overrides=overrides,
                                per_run=args.per_run,
                                force=True,
                            ),
                            echo=print if args.verbose else lambda _line: None,
                        )
                        if report.failed:
                            raise SystemExit("\n".join(report.lines()))
                        for asset, seconds in _range_stage_seconds(
                            instance, [run.run_id for run in report.runs]
                        ).items():
                            per[asset] = per.get(asset, 0.0) + seconds
                    else:
                        for key in sessions:
                            summary = launch_snapshot(
                                key,
                                instance=instance,
                                params=overrides,
                                log_level="WARNING",
                            )
                            if not summary.success:
                                raise SystemExit(str(summary))
            finally:
                instance.dispose()
            rss = max((p.peak_rss_mib for p in peaks.peaks.values()), default=float("nan"))
            anon = max((p.peak_anon_mib for p in peaks.peaks.values()), default=float("nan"))
            written = (written_bytes() or 0) - written_before
            written += sum(p.written_bytes for p in peaks.peaks.values())
        seconds = time.perf_counter() - start
        shutil.rmtree(home / "chain_store", ignore_errors=True)  # kept matrices: not timed
        rows.append((route, seconds, rss, anon, written))
        print(f"  {route:<12} {seconds:8.1f} s  ({seconds / len(sessions):.2f} s per session)")
    _print_routes(rows, stage_seconds, len(sessions))
    _print_stages(stage_seconds, rows, len(sessions))
    return 0


def _chain(engine, store_root: Path, sessions: list[str], args, params, per: dict) -> None:
    """The chain route: per session, ``corr-pipeline bench``'s chain with the assets' checks
    (:func:`corr_pipeline.bench.pipeline.run_pipeline_benchmark`), then the changes against the
    session before (:func:`corr_pipeline.snapshot.changes.compute_and_publish`), keeping the
    matrices of the newest ``--keep`` sessions as retention does; seconds per stage into
    ``per``."""
    from corr_pipeline.bench.pipeline import run_pipeline_benchmark
    from corr_pipeline.snapshot.changes import compute_and_publish
    from corr_pipeline.store.matrix_store import MatrixStore

    store = MatrixStore(store_root)
    for i, key in enumerate(sessions):
        day = dt.date.fromisoformat(key)
        chained = run_pipeline_benchmark(
            engine,
            store_root,
            n=args.n,
            t=args.t,
            working_memory_mb=params.working_memory_mb,
            synth=False,
            floor=False,
            echo=lambda _line: None,
            day=day,
            checks=True,
            keep_matrices=True,
            in_memory=i < len(sessions) - args.keep,  # history: in memory, as the range's
        )
        for stage in chained.stages:
            per[stage.name] = per.get(stage.name, 0.0) + stage.seconds
        start = time.perf_counter()
        compute_and_publish(engine, store, day, working_memory_mb=params.working_memory_mb)
        per["changes"] = per.get("changes", 0.0) + time.perf_counter() - start
        if i >= args.keep:
            store.collector.remove_partition(sessions[i - args.keep])


def _drop_page_cache() -> bool:
    """Write dirty pages and drop the page cache (root only), so that no route reads what the
    one before it left cached nor waits for its writes; False when not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _print_routes(rows: list[tuple], stage_seconds: dict, n_sessions: int) -> None:
    """One row per route: its runs' mean wall time (a route listed twice, as in
    ``chain,range,range,chain``, is averaged: the order effects cancel), its ratio to the
    chain's mean and to the chain without its checks and changes, the largest peaks and the
    mean bytes written."""
    routes = list(dict.fromkeys(row[0] for row in rows))
    runs = {route: [row for row in rows if row[0] == route] for route in routes}
    mean = {route: sum(row[1] for row in runs[route]) / len(runs[route]) for route in routes}
    chain = mean.get("chain")
    bare = None
    if chain is not None:
        extra = stage_seconds["chain"]
        bare = chain - (extra.get(CHECKS, 0.0) + extra.get("changes", 0.0)) / len(runs["chain"])
    print()
    print(
        "| route | runs | wall s (mean) | s / session | sessions / hour | × chain | × chain "
        "without checks and changes | peak RSS MiB | peak RssAnon MiB | written to disk MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for route in routes:
        seconds = mean[route]
        rss = max(row[2] for row in runs[route])
        anon = max(row[3] for row in runs[route])
        written = sum(row[4] for row in runs[route]) / len(runs[route])
        ratio = "-" if chain is None else f"{seconds / chain:.3f}"
        ratio_bare = "-" if bare is None else f"{seconds / bare:.3f}"
        print(
            f"| {route} | {len(runs[route])} | {seconds:.1f} | {seconds / n_sessions:.2f} | "
            f"{3600 * n_sessions / seconds:,.0f} | {ratio} | {ratio_bare} | {rss:,.0f} | "
            f"{anon:,.0f} | {written / 1e6:,.0f} |"
        )


#: The stage of the correlation's checks (the range's ``check_seconds``, the chain's stage).
CHECKS = "correlation checks"

#: The range's assets in the chain's stage order, with the chain's stage of the same work.
RANGE_STAGES = (
    ("returns_matrix", "load window"),
    ("correlation_matrix", "correlation"),
    (CHECKS, CHECKS),
    ("top_k_neighbors", "neighbors"),
    ("clusters", "clusters"),
    ("lead_lag_pairs", "lead-lag"),
    ("snapshot_publication", "publish"),
    ("snapshot_changes", "changes"),
)


def _range_stage_seconds(instance, run_ids: list[str]) -> dict[str, float]:
    """Seconds per asset stage summed over the sessions of the runs (their materializations'
    ``stage_seconds``; the correlation's ``check_seconds`` apart)."""
    from dagster import DagsterEventType

    out: dict[str, float] = {}
    for run_id in run_ids:
        records = instance.get_records_for_run(
            run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION, limit=1_000_000
        ).records
        for record in records:
            materialization = record.event_log_entry.asset_materialization
            metadata = materialization.metadata
            asset = materialization.asset_key.to_user_string()
            for label, name in (("stage_seconds", asset), ("check_seconds", CHECKS)):
                if label in metadata:
                    out[name] = out.get(name, 0.0) + float(metadata[label].value)
    return out


def _print_stages(stage_seconds: dict, rows: list[tuple], n_sessions: int) -> None:
    """Seconds per session of each stage, the chain's beside each range route's (means over a
    route's runs); the last row is what the route's wall time holds besides its stages."""
    routes = [route for route in stage_seconds if route == "chain" or route.startswith("range")]
    if not routes:
        return
    runs = {route: sum(1 for row in rows if row[0] == route) for route in routes}
    wall = {route: sum(row[1] for row in rows if row[0] == route) for route in routes}
    print()
    print("| stage, s / session | " + " | ".join(routes) + " |")
    print("|---|" + "---:|" * len(routes))
    for asset, chain_stage in RANGE_STAGES:
        cells = []
        for route in routes:
            name = chain_stage if route == "chain" else asset
            cells.append(f"{stage_seconds[route].get(name, 0.0) / n_sessions / runs[route]:.2f}")
        print(f"| {asset} | " + " | ".join(cells) + " |")
    rest = [
        (wall[route] - sum(stage_seconds[route].values())) / n_sessions / runs[route]
        for route in routes
    ]
    print("| besides the stages | " + " | ".join(f"{x:.2f}" for x in rest) + " |")


def _postgres_instance(engine, server, dagster_home: Path) -> None:
    """Give the instance at ``dagster_home`` the project's dagster.yaml plus run, event-log and
    schedule storage in the database ``dagster`` of the embedded server."""
    import sqlalchemy as sa

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if (
            conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = 'dagster'")).first()
            is None
        ):
            conn.execute(sa.text("CREATE DATABASE dagster"))
    url = server.url("dagster").replace("postgresql+psycopg://", "postgresql+psycopg2://", 1)
    dagster_home.mkdir(parents=True, exist_ok=True)
    project = (Path(__file__).resolve().parents[1] / "dagster.yaml").read_text()
    storage = f"\nstorage:\n  postgres:\n    postgres_url: {json.dumps(url)}\n"
    (dagster_home / "dagster.yaml").write_text(project + storage)


def _weekdays_back(end: dt.date, count: int) -> dt.date:
    """The weekday ``count - 1`` weekdays before ``end`` (the first of ``count`` weekdays)."""
    day, left = end, count - 1
    while left:
        day -= dt.timedelta(days=1)
        if day.weekday() < 5:
            left -= 1
    return day


if __name__ == "__main__":
    sys.exit(main())
