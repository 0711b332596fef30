"""The ``corr-pipeline`` command: a thin argparse layer over ``corr_pipeline.db`` (and, for
``demo``, the pipeline). Logic lives in the library; this module parses, calls, prints.

    corr-pipeline db init                    create the tables (idempotent)
    corr-pipeline db url                     where the database is (credentials redacted)
    corr-pipeline prices import FILE         load a CSV (symbol,trade_date,close)
    corr-pipeline prices synth [--symbols N --days T --seed S --end-date D]
                                             replace prices with a synthetic universe
    corr-pipeline demo                       embedded database + schema + demo universe (+ pipeline)
    corr-pipeline bench [--n N --t T ...]    time the whole chain (or --publish-only) on a synthetic
                                             universe, in a scratch embedded database by default

User errors (bad input file, unreachable database, invalid arguments) print one line
``corr-pipeline: error: ...`` on stderr and exit with status 2, without a traceback
(``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.prices_import import PricesImportError, import_prices_csv
from corr_pipeline.db.schema import init_schema
from corr_pipeline.progress import cli_progress

PROG = "corr-pipeline"

#: Exceptions that are the user's to fix: reported in one line, exit status 2.
USER_ERRORS: tuple[type[BaseException], ...] = (
    db_engine.DatabaseUnavailableError,
    PricesImportError,
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
    ValueError,
)

DEMO_SYMBOLS = 3_000
DEMO_DAYS = 300
DEMO_SEED = 7


class UsageError(ValueError):
    """Invalid command-line usage detected after argparse (exit status 2)."""


def _echo(message: str = "") -> None:
    print(message, flush=True)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _iso_date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date YYYY-MM-DD, got {text!r}") from None


def _engine() -> sa.Engine:
    engine = db_engine.get_engine()
    init_schema(engine)
    return engine


def where_is_the_database() -> str:
    """Human description of the configured database (redacted), starting it if embedded."""
    url = db_engine.database_url()
    server = db_engine.embedded_server()
    if server is None:
        return f"{db_engine.redact_url(url)}  (from {settings.ENV_DATABASE_URL})"
    return (
        f"{db_engine.redact_url(url)}\n"
        f"  embedded PostgreSQL, data directory {server.pgdata}\n"
        f"  Unix socket {server.socket_dir}/.s.PGSQL.{server.port} (no TCP port), "
        f"database {db_engine.EMBEDDED_DATABASE}, user {db_engine.EMBEDDED_USER}\n"
        f"  it runs while a corr-pipeline process uses it and stops when the last one exits"
    )


# ---------------------------------------------------------------------------------------------
# db / prices commands
# ---------------------------------------------------------------------------------------------


def cmd_db_init(args: argparse.Namespace) -> int:
    engine = _engine()
    _echo(f"schema ready at {db_engine.describe_url(engine.url.render_as_string())}")
    return 0


def cmd_db_url(args: argparse.Namespace) -> int:
    _echo(where_is_the_database())
    return 0


def cmd_prices_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():  # before starting a database for nothing
        raise FileNotFoundError(f"{path}: no such file")
    bar = cli_progress(f"import {path.name}", unit="bytes")
    try:
        report = import_prices_csv(_engine(), path, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    _echo(report.summary())
    return 0


def _write_synthetic(
    engine: sa.Engine, *, symbols: int, days: int, seed: int, end_date: Any
) -> Any:
    from corr_pipeline.db.synth import write_synthetic_universe  # heavy; only when needed

    return write_synthetic_universe(
        engine,
        n_symbols=symbols,
        n_days=days,
        seed=seed,
        end_date=end_date,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )


def cmd_prices_synth(args: argparse.Namespace) -> int:
    report = _write_synthetic(
        _engine(), symbols=args.symbols, days=args.days, seed=args.seed, end_date=args.end_date
    )
    _echo(str(report))
    return 0


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


@dataclass
class DemoContext:
    """State passed from one demo step to the next."""

    symbols: int = DEMO_SYMBOLS
    days: int = DEMO_DAYS
    seed: int = DEMO_SEED
    echo: Callable[[str], None] = _echo
    engine: sa.Engine | None = None
    database_url: str | None = None
    notes: list[str] = field(default_factory=list)

    def require_engine(self) -> sa.Engine:
        if self.engine is None:
            raise RuntimeError("demo step needs the database step to have run first")
        return self.engine


def demo_step_database(ctx: DemoContext) -> None:
    """Start (or attach to) the database and create the schema.

    The URL is exported as CORR_PIPELINE_DATABASE_URL for the rest of this process, so
    subprocesses started by later steps (Dagster's executor) connect to the same server
    directly; this process keeps the embedded server alive until it exits.
    """
    url = db_engine.database_url()
    ctx.database_url = url
    ctx.engine = _engine()
    os.environ[settings.ENV_DATABASE_URL] = url
    ctx.echo(f"[1] database: {where_is_the_database()}")
    ctx.echo(
        "    schema ready (prices, snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs)"
    )


def demo_step_prices(ctx: DemoContext) -> None:
    """Seed a synthetic universe if ``prices`` is empty; otherwise keep what is there."""
    engine = ctx.require_engine()
    with engine.connect() as conn:
        summary = conn.execute(
            sa.text(
                "SELECT count(*), count(DISTINCT symbol), min(trade_date), max(trade_date) "
                "FROM prices"
            )
        ).one()
    rows, n_symbols, first, last = summary
    if rows:
        ctx.echo(
            f"[2] prices: keeping the existing {rows:,} rows ({n_symbols:,} symbols, "
            f"{first}..{last}); nothing seeded"
        )
        return
    ctx.echo(
        f"[2] prices: empty, seeding a synthetic universe of {ctx.symbols:,} symbols x "
        f"{ctx.days:,} days (seed {ctx.seed})"
    )
    report = _write_synthetic(
        engine, symbols=ctx.symbols, days=ctx.days, seed=ctx.seed, end_date=None
    )
    for line in str(report).splitlines():
        ctx.echo(f"    {line}")


def demo_step_pipeline(ctx: DemoContext) -> None:
    """Materialize the snapshot graph for the latest partition and print a summary and how to
    open the Dagster UI (:func:`corr_pipeline.defs.run.demo_step_pipeline`)."""
    from corr_pipeline.defs.run import demo_step_pipeline as run_pipeline  # heavy: Dagster

    run_pipeline(ctx)


#: The demo, in order. Each step takes the shared DemoContext; later steps are appended here.
DEMO_STEPS: list[Callable[[DemoContext], None]] = [
    demo_step_database,
    demo_step_prices,
    demo_step_pipeline,
]


def run_demo(
    ctx: DemoContext | None = None,
    steps: Sequence[Callable[[DemoContext], None]] | None = None,
) -> DemoContext:
    """Run ``steps`` (default: every step of :data:`DEMO_STEPS`) in order; return the context."""
    ctx = ctx or DemoContext()
    for step in DEMO_STEPS if steps is None else steps:
        step(ctx)
    return ctx


def cmd_demo(args: argparse.Namespace) -> int:
    run_demo(DemoContext(symbols=args.symbols, days=args.days, seed=args.seed))
    return 0


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------


def _bench_engine(args: argparse.Namespace, home: Path) -> tuple[sa.Engine, str]:
    """The benchmark's database: ``--database-url`` if given, else a scratch embedded server in
    ``home/pgdata`` (never the project database: the benchmark replaces ``prices``)."""
    if args.database_url:
        url = db_engine.normalize_url(args.database_url)
        where = f"{db_engine.redact_url(url)} (--database-url; its prices are replaced)"
    else:
        server = db_engine.start_embedded_server(home / "pgdata")
        url = server.url()
        where = f"scratch embedded PostgreSQL in {server.pgdata}"
    engine = db_engine.get_engine(url)
    init_schema(engine)
    return engine, where


def cmd_bench(args: argparse.Namespace) -> int:
    from corr_pipeline import bench  # heavy (compute kernels); only when needed

    home = (args.home or settings.corr_pipeline_home() / "bench").expanduser().resolve()
    if args.publish_only and args.skip_synth:
        raise UsageError("--skip-synth has no effect with --publish-only")
    engine, where = _bench_engine(args, settings.ensure_dir(home))
    _echo(f"# database: {where}")
    if args.publish_only:
        bench.run_publish_benchmark(engine, n=args.n, k=args.k, t=args.t, seed=args.seed)
        return 0
    report = bench.run_pipeline_benchmark(
        engine,
        home / "store",
        n=args.n,
        t=args.t,
        max_lag=args.max_lag,
        k=args.k,
        working_memory_mb=args.working_memory_mb,
        seed=args.seed,
        synth=not args.skip_synth,
        keep_matrices=args.keep_matrices,
        echo=_echo,
    )
    _echo()
    _echo(report.table())
    return 0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_bench_command(commands: Any) -> None:
    """``corr-pipeline bench``: see :mod:`corr_pipeline.bench`."""
    bench = commands.add_parser(
        "bench",
        help="time the whole chain (database load to publish) on a synthetic universe",
        description=(
            "Writes a synthetic universe into the benchmark database (REPLACING its prices), "
            "then runs window load, correlation, neighbors, clusters, lead-lag and publish in "
            "this process, printing per stage: wall seconds, peak RSS, peak RssAnon (sampled), "
            "rows published; with the machine line and git commit. By default the database is a "
            "scratch embedded PostgreSQL under --home, never the project database."
        ),
    )
    bench.add_argument("--n", type=_positive_int, default=6000, help="symbols (default 6000)")
    bench.add_argument(
        "--t", type=_positive_int, default=252, help="lookback_days, returns rows (default 252)"
    )
    bench.add_argument("--max-lag", type=_positive_int, default=5, metavar="L")
    bench.add_argument(
        "--k",
        type=_positive_int,
        default=10,
        help="k_neighbors = k_leaders = k_laggers (default 10)",
    )
    bench.add_argument("--working-memory-mb", type=_positive_float, default=256.0, metavar="MB")
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
        "--publish-only",
        action="store_true",
        help="time publish alone on random results of the size N, k give (no pipeline run)",
    )
    bench.set_defaults(func=cmd_bench)


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Nightly correlation snapshot for large equity universes.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks for errors instead of one line"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    db = commands.add_parser("db", help="database: create the schema, show where it is")
    db_commands = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    db_commands.add_parser("init", help="create missing tables (idempotent)").set_defaults(
        func=cmd_db_init
    )
    db_commands.add_parser(
        "url", help="print the database URL (credentials redacted) and where it lives"
    ).set_defaults(func=cmd_db_url)

    prices = commands.add_parser("prices", help="load daily prices")
    price_commands = prices.add_subparsers(
        dest="prices_command", metavar="SUBCOMMAND", required=True
    )
    importer = price_commands.add_parser(
        "import",
        help="import a CSV with columns symbol,trade_date,close (upsert; all-or-nothing)",
    )
    importer.add_argument("file", help="path of the CSV file")
    importer.set_defaults(func=cmd_prices_import)

    synth = price_commands.add_parser(
        "synth", help="replace prices with a synthetic universe (with injected lead-lag pairs)"
    )
    synth.add_argument("--symbols", type=_positive_int, default=DEMO_SYMBOLS, metavar="N")
    synth.add_argument("--days", type=_positive_int, default=DEMO_DAYS, metavar="T")
    synth.add_argument("--seed", type=int, default=DEMO_SEED, metavar="S")
    synth.add_argument(
        "--end-date", type=_iso_date, default=None, metavar="D", help="last weekday (YYYY-MM-DD)"
    )
    synth.set_defaults(func=cmd_prices_synth)

    demo = commands.add_parser(
        "demo",
        help="start the embedded database, seed a demo universe if prices is empty, run the demo",
    )
    demo.add_argument("--symbols", type=_positive_int, default=DEMO_SYMBOLS, metavar="N")
    demo.add_argument("--days", type=_positive_int, default=DEMO_DAYS, metavar="T")
    demo.add_argument("--seed", type=int, default=DEMO_SEED, metavar="S")
    demo.set_defaults(func=cmd_demo)

    add_bench_command(commands)

    # corr-pipeline query peers|cluster|lead-lag|corr|snapshots (corr_pipeline.query)
    from corr_pipeline.query import add_query_commands

    add_query_commands(commands)
    return parser


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("corr_pipeline").setLevel(logging.INFO)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return db_engine.redact_url(text) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``corr-pipeline``; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
