"""``corr-pipeline bench``: time the whole chain, or publish alone, on a synthetic universe.

The measurements are :func:`corr_pipeline.bench.run_pipeline_benchmark` and
:func:`corr_pipeline.bench.run_publish_benchmark`; this module parses the options, picks the
benchmark's database and prints the report. ``--through-dagster`` (:func:`bench_through_dagster`)
runs the snapshot as Dagster runs it instead, which needs Dagster and so lives here rather than
in :mod:`corr_pipeline.bench`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.cli.common import (
    UsageError,
    echo,
    non_negative_int,
    parse_params,
    positive_float,
    positive_int,
)
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.migrate import ensure_schema, upgrade

if TYPE_CHECKING:
    from corr_pipeline.bench import PipelineBenchReport

__all__ = ["add_bench_command", "bench_engine", "bench_through_dagster", "cmd_bench"]


def bench_engine(args: argparse.Namespace, home: Path) -> tuple[sa.Engine, str]:
    """The benchmark's database and a description of it: ``--database-url`` if given, else a
    scratch embedded server in ``home/pgdata`` (never the project database: the benchmark
    replaces ``prices``). The scratch database is brought to the code's schema revision; a
    ``--database-url`` one gets the schema if it is fresh and is refused if it is older or
    newer (``corr-pipeline db upgrade`` is for the user to run on their databases)."""
    if args.database_url:
        url = db_engine.normalize_url(args.database_url)
        where = f"{db_engine.redact_url(url)} (--database-url; its prices are replaced)"
        engine = db_engine.get_engine(url)
        ensure_schema(engine, create_if_fresh=True)
    else:
        server = db_engine.start_embedded_server(home / "pgdata")
        url = server.url()
        where = f"scratch embedded PostgreSQL in {server.pgdata}"
        engine = db_engine.get_engine(url)
        upgrade(engine)  # a scratch database of the benchmark's own: kept at the code's revision
    return engine, where


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark the arguments describe; print the database line and the report."""
    # heavy (compute kernels); only when needed
    from corr_pipeline.bench import run_pipeline_benchmark, run_publish_benchmark
    from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB

    home = (args.home or settings.corr_pipeline_home() / "bench").expanduser().resolve()
    if args.publish_only and args.skip_synth:
        raise UsageError("--skip-synth has no effect with --publish-only")
    engine, where = bench_engine(args, settings.ensure_dir(home))
    echo(f"# database: {where}")
    if args.publish_only:
        if args.through_dagster:
            raise UsageError("--through-dagster and --publish-only exclude each other")
        run_publish_benchmark(engine, n=args.n, k=args.k, t=args.t, seed=args.seed)
        return 0
    if args.through_dagster:
        report = bench_through_dagster(args, engine, home)
        echo()
        echo(report.table())
        return 0
    report = run_pipeline_benchmark(
        engine,
        home / "store",
        n=args.n,
        t=args.t,
        max_lag=args.max_lag,
        k=args.k,
        working_memory_mb=args.working_memory_mb or DEFAULT_WORKING_MEMORY_MB,
        clusters_memory_mb=args.clusters_memory_mb,
        overrides=parse_params(args.param),
        seed=args.seed,
        synth=not args.skip_synth,
        keep_matrices=args.keep_matrices,
        floor=not args.no_floor,
        echo=echo,
    )
    echo()
    echo(report.table())
    return 0


def bench_through_dagster(
    args: argparse.Namespace, engine: sa.Engine, home: Path
) -> PipelineBenchReport:
    """The whole snapshot through Dagster, as the nightly job runs it: ``snapshot_job`` for the
    synthetic universe's last date (:func:`corr_pipeline.defs.run.materialize_snapshot`, its one
    step in the run's process) on a scratch Dagster instance in ``home/dagster_home`` and a
    matrix store in ``home/store``, with the benchmark's parameters
    (:func:`corr_pipeline.bench.pipeline.bench_parameters`).

    Per asset: the seconds of its stage (its checks included) and the peak RSS and RssAnon the
    stage measured (its ``stage_seconds``, ``check_seconds``, ``peak_rss_mib`` and
    ``rss_anon_mib``: the run's process is this one). The total is the run's wall time,
    Dagster's bookkeeping included. The floor is timed afterwards
    in this process on the same window, loaded again. The run's matrices are deleted afterwards
    unless ``--keep-matrices``; the published snapshot stays in the benchmark database.
    """
    from corr_pipeline.bench import measure_floor
    from corr_pipeline.bench.pipeline import start_benchmark
    from corr_pipeline.cli.demo import SnapshotRunError
    from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
    from corr_pipeline.defs.run import materialize_snapshot, open_instance
    from corr_pipeline.snapshot import steps
    from corr_pipeline.store.matrix_store import MatrixStore
    from corr_pipeline.synth import DEFAULT_END_DATE

    working_memory_mb = args.working_memory_mb or DEFAULT_WORKING_MEMORY_MB
    params, report = start_benchmark(
        engine,
        n=args.n,
        t=args.t,
        max_lag=args.max_lag,
        k=args.k,
        working_memory_mb=working_memory_mb,
        clusters_memory_mb=args.clusters_memory_mb,
        overrides=parse_params(args.param),
        seed=args.seed,
        synth=not args.skip_synth,
        echo=echo,
        how=", through Dagster",
    )
    # the run worker connects to the same database (the embedded server lives as long as
    # this process)
    settings.export_database_url(engine.url.render_as_string(hide_password=False))
    key = DEFAULT_END_DATE.isoformat()
    store_dir = home / "store"
    os.environ[settings.ENV_STORE_DIR] = str(store_dir)  # the run's store (deployment setting)
    overrides = {
        **params.as_dict(),
        "clusters_memory_mb": params.clusters_memory_mb,
    }
    instance = open_instance(home / "dagster_home")
    try:
        echo(f"snapshot_job for {key} (Dagster instance {instance.root_directory})")
        start = time.perf_counter()
        summary = materialize_snapshot(
            key, instance=instance, params=overrides, in_process=True, log_level="WARNING"
        )
        report.run_seconds = time.perf_counter() - start
    finally:
        instance.dispose()
    try:
        report.stages += _run_stages(summary)
        if not summary.success:
            echo(report.table())
            raise SnapshotRunError(
                f"the snapshot run failed (steps: {', '.join(summary.failed_steps) or '?'}; "
                f"run {summary.run_id} in {home / 'dagster_home'})"
            )
        if not args.no_floor:
            # the steps' figures first: the floor holds 4 N² bytes (numpy's product segfaulted
            # inside OpenBLAS at N = 44,885 here), and a run's figures must survive it
            echo(report.table())
            echo("# timing the floor on the same window (--no-floor skips it)")
            window = steps.load_returns(engine, DEFAULT_END_DATE, params)
            report.floor = measure_floor(window.returns)
            for stage in report.stages:
                if stage.name == "lead_lag_pairs":
                    report.note_floors_per_lag(stage, args.max_lag)
    finally:
        if not args.keep_matrices:
            MatrixStore(store_dir).collector.remove_partition(key)
    return report


def _run_stages(summary: Any) -> list[Any]:
    """A :class:`~corr_pipeline.bench.StageResult` per asset of the run that has a
    ``stage_seconds`` (its ``check_seconds`` added; the publication's rows per table): the
    session's steps (the overlap matrix shares the correlation's), then its changes."""
    from corr_pipeline.bench import StageResult
    from corr_pipeline.snapshot.chain import STEPS

    stages = []
    for asset in (*STEPS, "snapshot_changes"):
        seconds = summary.value(asset, "stage_seconds")
        if seconds is None:
            continue
        seconds = float(seconds) + float(summary.value(asset, "check_seconds", 0.0))
        rows = None
        note = []
        if asset == "snapshot_publication":
            counts = {
                name: int(summary.value(asset, f"{name}_rows", 0))
                for name in ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")
            }
            rows = sum(counts.values())
            note += [f"{name} {count:,}" for name, count in counts.items()]
        stages.append(
            StageResult(
                asset,
                seconds,
                float(summary.value(asset, "peak_rss_mib", float("nan"))),
                float(summary.value(asset, "rss_anon_mib", float("nan"))),
                rows,
                ", ".join(note),
            )
        )
    return stages


def add_bench_command(commands: Any) -> None:
    """Register ``bench`` on the sub-command parser ``commands`` (see :mod:`corr_pipeline.bench`)."""
    bench = commands.add_parser(
        "bench",
        help="time the whole chain (database load to publish) on a synthetic universe",
        description=(
            "Writes a synthetic universe into the benchmark database (REPLACING its prices), "
            "then runs window load, correlation, neighbors, clusters, lead-lag and publish in "
            "this process, printing per stage: wall seconds, the same in GEMM floors, peak RSS, "
            "peak RssAnon (sampled), rows published; with the machine line and git commit. The "
            "floor is R0.T @ R0 (float32, the loaded window's T x N returns zero-filled, best of "
            "7), timed in the same run after the window load, with the load average. By default "
            "the database is a scratch embedded PostgreSQL under --home, never the project "
            "database."
        ),
    )
    bench.add_argument("--n", type=positive_int, default=6000, help="symbols (default 6000)")
    bench.add_argument(
        "--t", type=positive_int, default=252, help="lookback_days, returns rows (default 252)"
    )
    bench.add_argument("--max-lag", type=positive_int, default=5, metavar="L")
    bench.add_argument(
        "--k",
        type=positive_int,
        default=10,
        help="k_neighbors = k_leaders = k_laggers (default 10)",
    )
    bench.add_argument(
        "--working-memory-mb",
        type=positive_float,
        default=None,
        metavar="MB",
        help="budget for each stage's temporaries (default: the package's, 512)",
    )
    bench.add_argument(
        "--clusters-memory-mb",
        type=non_negative_int,
        default=None,
        metavar="MB",
        help="the clusters step's distances stay in anonymous memory up to this size, else "
        "in a store scratch file (default: the snapshot_params default, 1024)",
    )
    bench.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a snapshot parameter (repeatable), e.g. max_q_value=1 lead_lag_market_modes=0 for "
        "the seed's lead-lag, market_modes_removed=1 for the clusters (default: the "
        "pipeline's)",
    )
    bench.add_argument("--seed", type=int, default=11, metavar="S")
    bench.add_argument(
        "--home",
        type=Path,
        default=None,
        metavar="DIR",
        help="scratch directory: embedded database DIR/pgdata, matrices DIR/store "
        "(default: $CORR_PIPELINE_HOME/bench)",
    )
    bench.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="use this PostgreSQL instead of the scratch embedded one (its prices are replaced)",
    )
    bench.add_argument(
        "--skip-synth", action="store_true", help="reuse the prices already in the database"
    )
    bench.add_argument(
        "--keep-matrices",
        action="store_true",
        help="keep the session's matrices (the correlation/overlap memory maps and the other "
        "bundles) in DIR/store (deleted by default)",
    )
    bench.add_argument(
        "--through-dagster",
        action="store_true",
        help="run the snapshot through Dagster (snapshot_job, as the nightly run) on a scratch "
        "instance in DIR/dagster_home: per asset its stage's wall s, peak RSS and RssAnon; the "
        "run's wall time",
    )
    bench.add_argument(
        "--no-floor",
        action="store_true",
        help="do not time the GEMM floor (it holds 4 N^2 bytes for a moment, N the symbols kept)",
    )
    bench.add_argument(
        "--publish-only",
        action="store_true",
        help="time publish alone on random results of the size N, k give (no pipeline run)",
    )
    bench.set_defaults(func=cmd_bench)
