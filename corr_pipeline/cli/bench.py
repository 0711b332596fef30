"""``corr-pipeline bench``: time the whole chain, or publish alone, on a synthetic universe.

The measurements are :func:`corr_pipeline.bench.run_pipeline_benchmark` and
:func:`corr_pipeline.bench.run_publish_benchmark`; this module parses the options, picks the
benchmark's database and prints the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.cli.common import UsageError, echo, positive_float, positive_int
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.migrate import ensure_schema, upgrade

__all__ = ["add_bench_command", "bench_engine", "cmd_bench"]


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
        run_publish_benchmark(engine, n=args.n, k=args.k, t=args.t, seed=args.seed)
        return 0
    report = run_pipeline_benchmark(
        engine,
        home / "store",
        n=args.n,
        t=args.t,
        max_lag=args.max_lag,
        k=args.k,
        working_memory_mb=args.working_memory_mb or DEFAULT_WORKING_MEMORY_MB,
        seed=args.seed,
        synth=not args.skip_synth,
        keep_matrices=args.keep_matrices,
        floor=not args.no_floor,
        echo=echo,
    )
    echo()
    echo(report.table())
    return 0


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
        help="keep the correlation/overlap memory maps in DIR/store (deleted by default)",
    )
    bench.add_argument(
        "--no-floor",
        action="store_true",
        help="do not time the GEMM floor (it holds 4 N^2 bytes for a moment: 15 GiB at 64,000)",
    )
    bench.add_argument(
        "--publish-only",
        action="store_true",
        help="time publish alone on random results of the size N, k give (no pipeline run)",
    )
    bench.set_defaults(func=cmd_bench)
