"""``corr-pipeline prices import|synth|check``: load a CSV, replace prices with a synthetic
universe, or check the configured price source (and how its dates fit the calendar).

Both write the project's own ``prices`` table, never a configured price source
(``CORR_PIPELINE_PRICES_TABLE``): that one is read-only. When such a source is configured,
they say on stderr that the pipeline will not read what they load."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.cli.common import echo, iso_date, open_engine, positive_int, write_synthetic
from corr_pipeline.cli.demo import (
    DEMO_DAYS,
    DEMO_SEED,
    DEMO_SYMBOLS,
    SnapshotRunError,
    first_full_window_session,
)
from corr_pipeline.cli.progress import cli_progress
from corr_pipeline.db.price_source import (
    PriceSource,
    configured_price_source,
    resolve_price_source,
)
from corr_pipeline.db.prices_import import import_prices_csv

__all__ = ["add_prices_commands", "cmd_prices_check", "cmd_prices_import", "cmd_prices_synth"]

#: ``prices check``: how many dates are listed before "... and N more".
LISTED_DATES = 8


def warn_if_not_the_source() -> None:
    """On stderr: the pipeline reads another price source than the ``prices`` table written
    here (nothing when the source is the default)."""
    source = configured_price_source()
    if not source.is_native:
        print(
            f"note: this loads the prices table; the pipeline reads {source} "
            "(CORR_PIPELINE_PRICES_TABLE), which is never written",
            file=sys.stderr,
        )


def cmd_prices_import(args: argparse.Namespace) -> int:
    """Import the CSV ``args.file`` (a progress bar on a terminal); print the report."""
    path = Path(args.file)
    if not path.is_file():  # before starting a database for nothing
        raise FileNotFoundError(f"{path}: no such file")
    warn_if_not_the_source()
    bar = cli_progress(f"import {path.name}", unit="bytes")
    try:
        report = import_prices_csv(open_engine(), path, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    echo(report.summary())
    return 0


def cmd_prices_synth(args: argparse.Namespace) -> int:
    """Replace ``prices`` with the synthetic universe the arguments describe; print the report."""
    warn_if_not_the_source()
    report = write_synthetic(
        open_engine(), symbols=args.symbols, days=args.days, seed=args.seed, end_date=args.end_date
    )
    echo(str(report))
    return 0


def _dates(days: list[dt.date]) -> str:
    shown = ", ".join(str(d) for d in days[:LISTED_DATES])
    more = len(days) - LISTED_DATES
    return shown + (f" and {more} more" if more > 0 else "")


def _full_window_line(
    engine: sa.Engine, source: PriceSource, last: dt.date, lookback_days: int | None
) -> str:
    """The first session whose window (SPEC §2: the last ``lookback_days + 1`` trade dates on
    or before it) the source covers fully: the first session of the calendar on or after its
    ``(lookback_days + 1)``-th trade date (:func:`corr_pipeline.cli.demo.first_full_window_session`),
    where a backfill can start and ``CORR_PIPELINE_PARTITION_START`` should be."""
    if lookback_days is None:
        from corr_pipeline.snapshot.params import DEFAULTS  # numpy, numba: lazily

        lookback_days = DEFAULTS.lookback_days
    window = f"lookback_days {lookback_days}: {lookback_days + 1} trade dates"
    try:
        first = first_full_window_session(engine, lookback_days, last, source)
    except SnapshotRunError as exc:
        return f"first session with a full window ({window}): none yet ({exc})"
    line = f"first session with a full window ({window}): {first}"
    start = settings.partition_start()
    if first > start:
        return (
            f"{line}; the earlier partitions fail for lack of history: backfill from {first}, "
            f"set {settings.ENV_PARTITION_START}={first} (now {start})"
        )
    return f"{line}; every partition from {settings.ENV_PARTITION_START}={start} has one"


def cmd_prices_check(args: argparse.Namespace) -> int:
    """Check the configured price source as a run's first step does (the relation, its columns
    and their types; one line and exit status 2 when it is unusable), then say what the
    pipeline will see: the latest trade date and how complete it is (what
    ``prices_ready_sensor`` measures), the first session with a full window of
    ``args.lookback_days`` returns (default: the snapshot's), and how the source's trade dates
    of the last ``args.days`` days fit the calendar (``CORR_PIPELINE_CALENDAR``). Reads only."""
    from corr_pipeline.db.price_reads import latest_trade_date, session_prices, trade_dates
    from corr_pipeline.sessions import configured_calendar

    engine = open_engine(create_if_fresh=False)
    source = configured_price_source()
    with engine.connect() as conn:
        resolved = resolve_price_source(conn, source)
    echo(f"price source {source}: {resolved.kind} {resolved.schema}.{source.table}, readable")
    for role, column in (
        ("symbol", resolved.symbol),
        ("trade date", resolved.trade_date),
        ("price", resolved.price),
    ):
        echo(f"  {role:<10}  {column.name:<12}  {column.declared}")
    for note in resolved.notes:
        echo(f"note: {note}")
    last = latest_trade_date(engine, source)
    if last is None:
        echo("no prices in it yet")
        return 0
    day = session_prices(engine, last, source)
    line = f"latest trade date {last}: {day.symbols:,} symbols priced"
    if day.previous is not None:
        line += (
            f"; {day.carried:,} of the {day.previous_symbols:,} symbols priced on "
            f"{day.previous} ({day.completeness:.1%}; prices_ready_sensor runs a session at "
            f"{settings.sensor_min_share():.0%})"
        )
    echo(line)
    echo(_full_window_line(engine, source, last, args.lookback_days))
    calendar = configured_calendar()
    if last < calendar.first:
        echo(
            f"calendar {calendar.name}: the latest trade date is before the first partition "
            f"({calendar.first}, {settings.ENV_PARTITION_START}={settings.partition_start()})"
        )
        return 0
    first = max(last - dt.timedelta(days=args.days - 1), calendar.first)
    sessions = calendar.sessions(first, last)
    dates = trade_dates(engine, first, last, source)
    unpriced = sorted(set(sessions) - set(dates))
    extra = sorted(set(dates) - set(sessions))
    echo(
        f"calendar {calendar.name} ({calendar.timezone}), {first} .. {last}: "
        f"{len(sessions)} sessions, {len(sessions) - len(unpriced)} with prices"
    )
    if unpriced:
        echo(f"  sessions without any price: {_dates(unpriced)}")
    if extra:
        echo(
            f"  trade dates that are not {calendar.name} sessions: {_dates(extra)} (no "
            "partition of their own, but window dates of the snapshots after them: a symbol "
            "without a price that day has no return into or out of it)"
        )
    return 0


def add_prices_commands(commands: Any) -> None:
    """Register ``prices import``, ``prices synth`` and ``prices check`` on the sub-command
    parser ``commands``."""
    prices = commands.add_parser(
        "prices", help="daily prices: import a CSV, a synthetic universe, check the price source"
    )
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
    synth.add_argument("--symbols", type=positive_int, default=DEMO_SYMBOLS, metavar="N")
    synth.add_argument("--days", type=positive_int, default=DEMO_DAYS, metavar="T")
    synth.add_argument("--seed", type=int, default=DEMO_SEED, metavar="S")
    synth.add_argument(
        "--end-date", type=iso_date, default=None, metavar="D", help="last weekday (YYYY-MM-DD)"
    )
    synth.set_defaults(func=cmd_prices_synth)

    check = price_commands.add_parser(
        "check",
        help="check the configured price source (CORR_PIPELINE_PRICES_TABLE/_COLUMNS) as a run "
        "does, its latest trade date, and how its dates fit CORR_PIPELINE_CALENDAR",
    )
    check.add_argument(
        "--days",
        type=positive_int,
        default=30,
        metavar="N",
        help="compare the trade dates of the last N days with the calendar's sessions (default 30)",
    )
    check.add_argument(
        "--lookback-days",
        type=positive_int,
        default=None,
        metavar="L",
        help="the window's returns for the first session with a full window (default: the "
        "snapshot's lookback_days, 252)",
    )
    check.set_defaults(func=cmd_prices_check)
