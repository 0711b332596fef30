"""``corr-pipeline demo``: the embedded database, the schema, a demo universe, two snapshots.

The demo is a list of steps (:data:`DEMO_STEPS`) sharing a :class:`DemoContext`:

1. start (or attach to) the database and create the schema;
2. seed a synthetic universe of :data:`DEMO_SYMBOLS` x :data:`DEMO_DAYS` (seed
   :data:`DEMO_SEED`) if ``prices`` is empty, else keep what is there; with another price
   source configured (``CORR_PIPELINE_PRICES_TABLE``), check it and seed nothing;
3. choose the partitions: the demo's partition is the session of the last trade date, and the
   first partition is the first session whose window of ``lookback_days + 1`` trade dates is full
   (:func:`first_full_window_session`), written as ``CORR_PIPELINE_PARTITION_START`` to the
   project's ``.env`` when run from the repository root (the file ``corr-pipeline`` and its UI
   read), so the UI offers no partition that fails for lack of history (the sessions after
   the last trade date, up to today's, are offered too: they fail until their prices are in);
4. launch the snapshot runs of the session before that partition and of the partition through
   the Dagster instance, like any other run (:func:`corr_pipeline.defs.run.launch_snapshot`), so
   that the partition's ``snapshot_changes`` compares the two, and print their summaries; the
   runs' INFO lines go to their event log (the UI's run page), not to the terminal, where only
   their warnings and errors appear;
5. print how to explore the results (Dagster UI, tables, matrices) and end with the queries to
   try on them (:func:`suggested_queries`).

Every line goes through ``DemoContext.echo`` (stdout by default).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corr_pipeline import project_env, settings
from corr_pipeline.cli.common import echo, open_engine, positive_int, write_synthetic
from corr_pipeline.cli.db import where_is_the_database
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.price_reads import (
    count_trade_dates,
    nth_trade_date,
    prices_extent,
    trade_dates,
)
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource, configured_price_source
from corr_pipeline.sessions import get_calendar

__all__ = [
    "DEMO_DAYS",
    "DEMO_SEED",
    "DEMO_STEPS",
    "DEMO_SYMBOLS",
    "DemoContext",
    "SnapshotRunError",
    "add_demo_command",
    "cmd_demo",
    "demo_params",
    "demo_sessions",
    "first_full_window_session",
    "freshness_line",
    "suggested_queries",
    "demo_step_database",
    "demo_step_partitions",
    "demo_step_pipeline",
    "demo_step_prices",
    "run_demo",
]

DEMO_SYMBOLS = 3_000
DEMO_DAYS = 300
DEMO_SEED = 7
#: The console log level of the demo's runs: their INFO lines stay in the run's event log.
DEMO_RUN_LOG_LEVEL = "WARNING"


class SnapshotRunError(ValueError):
    """A snapshot run did not succeed (the CLI reports it in one line, exit status 2)."""


@dataclass
class DemoContext:
    """State passed from one demo step to the next."""

    symbols: int = DEMO_SYMBOLS
    days: int = DEMO_DAYS
    seed: int = DEMO_SEED
    echo: Callable[[str], None] = echo
    engine: sa.Engine | None = None
    database_url: str | None = None
    source: PriceSource = NATIVE_PRICES
    partition_key: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: ``NAME=value`` the commands that open the UI need in front of them (the first partition,
    #: when no ``.env`` of the repository root carries it)
    ui_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def require_engine(self) -> sa.Engine:
        if self.engine is None:
            raise RuntimeError("demo step needs the database step to have run first")
        return self.engine


def demo_step_database(ctx: DemoContext) -> None:
    """Start (or attach to) the database and create the schema.

    The URL is exported as CORR_PIPELINE_DATABASE_URL for the rest of this process
    (:func:`settings.export_database_url`), so subprocesses started by later steps (Dagster's
    executor) connect to the same server directly; this process keeps the embedded server alive
    until it exits.
    """
    url = db_engine.database_url()
    ctx.database_url = url
    ctx.engine = open_engine()
    settings.export_database_url(url)
    ctx.echo(f"[1] database: {where_is_the_database()}")
    ctx.echo(
        "    schema ready (prices, snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs)"
    )


def demo_step_prices(ctx: DemoContext) -> None:
    """Seed a synthetic universe if ``prices`` is empty; otherwise keep what is there. With
    another price source configured, check it (one line, exit status 2, if it is unusable) and
    read it as it is: the demo never writes to a source that is not ours."""
    engine = ctx.require_engine()
    ctx.source = configured_price_source()
    if not ctx.source.is_native:
        extent = prices_extent(engine, ctx.source)
        if not extent.rows:
            raise SnapshotRunError(f"the price source {ctx.source} is empty")
        ctx.echo(
            f"[2] prices: reading {ctx.source} (CORR_PIPELINE_PRICES_TABLE): {extent.rows:,} "
            f"rows ({extent.symbols:,} symbols, {extent.first}..{extent.last}); nothing seeded"
        )
        return
    extent = prices_extent(engine)
    if extent.rows:
        ctx.echo(
            f"[2] prices: keeping the existing {extent.rows:,} rows ({extent.symbols:,} symbols, "
            f"{extent.first}..{extent.last}); nothing seeded"
        )
        return
    ctx.echo(
        f"[2] prices: empty, seeding a synthetic universe of {ctx.symbols:,} symbols x "
        f"{ctx.days:,} days (seed {ctx.seed})"
    )
    report = write_synthetic(
        engine, symbols=ctx.symbols, days=ctx.days, seed=ctx.seed, end_date=None
    )
    for line in str(report).splitlines():
        ctx.echo(f"    {line}")


def demo_params(
    engine: sa.Engine, partition_key: str, source: PriceSource = NATIVE_PRICES
) -> dict[str, Any]:
    """Parameter overrides for the demo: none when the data holds a full default window
    (252 returns), otherwise a lookback shrunk to the history available (so a short CSV or a
    small synthetic universe still gives a snapshot), with the other windows scaled to fit.
    Raises :class:`SnapshotRunError` when fewer than 13 trade dates are available."""
    from corr_pipeline.snapshot.params import DEFAULTS as defaults  # numpy, numba: lazily

    n_dates = count_trade_dates(engine, partition_key, defaults.lookback_days + 1, source)
    n_returns = n_dates - 1
    if n_returns >= defaults.lookback_days:
        return {}
    if n_returns < 12:
        raise SnapshotRunError(
            f"only {n_dates} trade dates on or before {partition_key} in {source.relation_name}: "
            "a snapshot "
            "needs at least 13 (load more history, or let the demo seed a synthetic universe "
            "into an empty database)"
        )
    min_history = max(10, n_returns // 2)
    min_overlap = min(defaults.min_overlap, max(5, min_history // 2))
    max_lag = min(defaults.max_lag, min_history - 1, n_returns - min_overlap)
    return {
        "lookback_days": n_returns,
        "min_history_days": min_history,
        "min_overlap": min_overlap,
        "max_lag": max_lag,
    }


def first_full_window_session(
    engine: sa.Engine,
    lookback_days: int,
    last_session: dt.date,
    source: PriceSource = NATIVE_PRICES,
) -> dt.date:
    """The first session (of ``$CORR_PIPELINE_CALENDAR``) whose window of ``lookback_days + 1``
    trade dates of the price source is full: the first session on or after the source's
    ``(lookback_days + 1)``-th trade date. Every session from it to ``last_session`` has a full
    window, every earlier one fails for lack of history. Raises :class:`SnapshotRunError` when
    the source has too few trade dates for ``last_session``."""
    nth = nth_trade_date(engine, lookback_days + 1, source)
    if nth is None or nth > last_session:
        raise SnapshotRunError(
            f"{source.relation_name} holds fewer than {lookback_days + 1} trade dates up to "
            f"{last_session}: no snapshot date has a full window"
        )
    calendar = get_calendar(settings.calendar_name(), nth, last_session + dt.timedelta(days=7))
    sessions = calendar.sessions(nth, last_session)
    if not sessions:
        raise SnapshotRunError(
            f"no session of {settings.calendar_name()} from {nth} to {last_session}"
        )
    return sessions[0]


def demo_step_partitions(ctx: DemoContext) -> None:
    """The demo's partition (the session of the last trade date), its parameters
    (:func:`demo_params`) and the first partition with a full window
    (:func:`first_full_window_session`). The first partition becomes
    ``CORR_PIPELINE_PARTITION_START`` of this process (so the code location the next step loads
    has it) and, when the demo runs from the project root (the directory holding the project's
    ``dagster.yaml`` and ``pyproject.toml``: where ``corr-pipeline ui`` runs), of its ``.env``,
    where only that line and its comment are written
    (:func:`corr_pipeline.project_env.env_file_in_use`); elsewhere, or with
    ``CORR_PIPELINE_ENV_FILE=off``, the UI commands of the last step carry it."""
    from corr_pipeline.defs.run import latest_partition_key  # heavy: Dagster
    from corr_pipeline.snapshot.params import DEFAULTS  # numpy, numba: lazily

    engine = ctx.require_engine()
    key = latest_partition_key(engine, source=ctx.source)
    ctx.partition_key = key
    ctx.params = demo_params(engine, key, ctx.source)
    lookback = int(ctx.params.get("lookback_days", DEFAULTS.lookback_days))
    first_day = first_full_window_session(engine, lookback, dt.date.fromisoformat(key), ctx.source)
    settings.export_partition_start(first_day)
    first, name = first_day.isoformat(), settings.ENV_PARTITION_START
    where = project_env.env_file_in_use()
    if where is not None:
        project_env.write_env_value(
            where,
            name,
            first,
            [
                "written by `corr-pipeline demo`: the first session whose window of "
                f"{lookback} returns the demo's prices fill;",
                "corr-pipeline and its UI read this file (its values win over the "
                "environment's). Edit or delete the line below to change the first partition.",
            ],
        )
        told = f"written to {where} (read by corr-pipeline and corr-pipeline ui)"
    else:
        ctx.ui_env[name] = first
        why = (
            f"{settings.ENV_ENV_FILE}=off"
            if project_env.is_project_root(Path.cwd())
            else f"{Path.cwd()} is not the repository root"
        )
        told = f"not written ({why}): set it for the UI"
    ctx.echo(
        f"[3] partitions: {first} .. {key}, the sessions with a full window of {lookback} "
        f"returns; {name}={first} {told}"
    )


def demo_sessions(engine: sa.Engine, key: str, source: PriceSource = NATIVE_PRICES) -> list[str]:
    """The sessions the demo builds, in date order: the latest session before ``key`` that has
    prices and a full window (from ``$CORR_PIPELINE_PARTITION_START`` on), so that
    ``snapshot_changes`` of ``key`` has something to compare, and ``key``; only ``key`` when
    there is none."""
    last = dt.date.fromisoformat(key)
    first = max(settings.partition_start(), last - dt.timedelta(days=31))
    if first >= last:
        return [key]
    sessions = set(get_calendar(settings.calendar_name(), first, last).sessions(first, last))
    priced = trade_dates(engine, first, last - dt.timedelta(days=1), source)
    earlier = [d for d in priced if d in sessions]
    return [earlier[-1].isoformat(), key] if earlier else [key]


def freshness_line(evaluation: Any) -> str:
    """The verdict of ``publication_freshness`` (an ``AssetCheckEvaluation``) as the UI shows
    it: passed; failed with severity WARN, "Failed (Warning)" in yellow; or failed with severity
    ERROR, in red; then its description."""
    if evaluation.passed:
        verdict = "passed"
    elif evaluation.severity.value == "WARN":
        verdict = "failed (warning; yellow in the UI, not red)"
    else:
        verdict = "FAILED (red in the UI)"
    return f"publication_freshness {verdict}: {evaluation.description}"


def suggested_queries(engine: sa.Engine, key: str) -> list[tuple[str, str]]:
    """Three ``corr-pipeline query`` commands that answer from the snapshot of ``key`` just
    published, each with what it shows: the lead-lag pairs of the leader of its most
    significant pair (else the cluster of its first symbol), that symbol's neighbors, and the
    snapshot's suspect prices. Empty when nothing is published for ``key``."""
    import numpy as np  # lazily, as the other heavy imports

    from corr_pipeline.db.published_reads import published_rows

    rows = published_rows(engine, key)
    if rows is None or not rows.symbols:
        return []
    pairs = rows.lead_lag_pairs
    if pairs.size:
        best = pairs[np.lexsort((-pairs["improvement"], pairs["q_value"]))[0]]
        symbol = rows.symbols[int(best["leader"])]
        lag, q_value = int(best["lag"]), float(best["q_value"])
        first = (
            f"corr-pipeline query lead-lag {shlex.quote(symbol)} --limit 3",
            f"{symbol} leads {rows.symbols[int(best['lagger'])]} by {lag} day{'s' * (lag > 1)}"
            + (f", q {q_value:.1e}" if np.isfinite(q_value) else ""),
        )
    else:
        symbol = rows.symbols[0]
        first = (f"corr-pipeline query cluster {shlex.quote(symbol)}", f"the cluster of {symbol}")
    return [
        first,
        (
            f"corr-pipeline query peers {shlex.quote(symbol)} --limit 5",
            f"the 5 symbols most correlated with {symbol}",
        ),
        ("corr-pipeline query quality", f"the suspect prices of {key}"),
    ]


def demo_step_pipeline(ctx: DemoContext) -> None:
    """Launch the snapshot runs of the demo's sessions (:func:`demo_sessions`: the session
    before the demo's partition, then the partition) through the Dagster instance (the code
    location loaded as the UI loads it, so each run has its origin: Overview timeline,
    re-execution), their INFO lines kept to their event log (:data:`DEMO_RUN_LOG_LEVEL` on the
    console), evaluate ``publication_freshness`` (so the UI shows its verdict and why, not
    "not evaluated") and print the summaries, how to open the UI and the queries to try
    (:func:`suggested_queries`). Raises :class:`SnapshotRunError` when a run fails."""
    from corr_pipeline.defs.location import build_resources  # heavy: Dagster
    from corr_pipeline.defs.monitoring import evaluate_publication_freshness
    from corr_pipeline.defs.run import launch_snapshot, open_instance

    if ctx.partition_key is None:
        demo_step_partitions(ctx)
    key = ctx.partition_key
    assert key is not None
    params = ctx.params
    keys = demo_sessions(ctx.require_engine(), key, ctx.source)
    instance = open_instance()
    home = Path(instance.root_directory)
    try:
        ctx.echo(
            f"[4] pipeline: materializing snapshot_job for partition{'s' * (len(keys) > 1)} "
            f"{' and '.join(keys)} (Dagster instance {home})"
        )
        if params:
            ctx.echo(f"    short price history: using {params}")
        for session in keys:
            summary = launch_snapshot(
                session, instance=instance, params=params or None, log_level=DEMO_RUN_LOG_LEVEL
            )
            for line in str(summary).splitlines():
                ctx.echo(f"    {line}")
            if not summary.success:
                raise SnapshotRunError(
                    f"the snapshot run for {session} failed (steps: "
                    f"{', '.join(summary.failed_steps) or '?'}); "
                    f"open the UI (below) or see run {summary.run_id} in {home}"
                )
        freshness = evaluate_publication_freshness(instance, build_resources())
        ctx.echo(f"    {freshness_line(freshness)}")
    finally:
        instance.dispose()
    env = " ".join(
        f"{name}={shlex.quote(value)}"
        for name, value in {
            "CORR_PIPELINE_HOME": str(settings.corr_pipeline_home()),
            "DAGSTER_HOME": str(home),
            **ctx.ui_env,
        }.items()
    )
    ctx.echo("[5] explore the results:")
    ctx.echo(f"    Dagster UI:  {env} corr-pipeline ui")
    ctx.echo(
        "                 (from the repository root; open the address with ?token=... it prints; "
        "menu Lineage: the asset graph; Catalog: each asset's checks and metadata plots; Runs: "
        "these runs and their logs; Ctrl-C or SIGTERM stops it)"
    )
    ctx.echo(f"    tables:      snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs ({key})")
    ctx.echo(
        f"    matrices:    {summary.store_dir}/<asset>/{key}/*.npy (np.load(..., mmap_mode='r'))"
    )
    queries = suggested_queries(ctx.require_engine(), key)
    width = max((len(command) for command, _ in queries), default=0)
    for i, (command, what) in enumerate(queries):
        ctx.echo(f"    {'try next:' if i == 0 else '':<13}{command:<{width}}  # {what}")


#: The demo, in order. Each step takes the shared DemoContext.
DEMO_STEPS: list[Callable[[DemoContext], None]] = [
    demo_step_database,
    demo_step_prices,
    demo_step_partitions,
    demo_step_pipeline,
]


def run_demo(
    ctx: DemoContext | None = None,
    steps: Sequence[Callable[[DemoContext], None]] | None = None,
) -> DemoContext:
    """Run ``steps`` (default: every step of :data:`DEMO_STEPS`) in order; return the context.
    What the steps export for the runs they start (the first partition) is this call's only:
    the process environment is restored afterwards."""
    ctx = ctx or DemoContext()
    with project_env.environment_restored():
        for step in DEMO_STEPS if steps is None else steps:
            step(ctx)
    return ctx


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the whole demo with the sizes of the arguments."""
    run_demo(DemoContext(symbols=args.symbols, days=args.days, seed=args.seed))
    return 0


def add_demo_command(commands: Any) -> None:
    """Register ``demo`` on the sub-command parser ``commands``."""
    demo = commands.add_parser(
        "demo",
        help="start the embedded database, seed a demo universe if prices is empty, run the demo",
    )
    demo.add_argument("--symbols", type=positive_int, default=DEMO_SYMBOLS, metavar="N")
    demo.add_argument("--days", type=positive_int, default=DEMO_DAYS, metavar="T")
    demo.add_argument("--seed", type=int, default=DEMO_SEED, metavar="S")
    demo.set_defaults(func=cmd_demo)
