"""``corr-pipeline backfill --from D1 --to D2``: the snapshots of a range of sessions, through
the Dagster instance, as few runs as memory allows (:mod:`corr_pipeline.defs.backfill`).

Prints the plan (sessions, those already current, sessions per run), then every run as it goes
(each step as it ends, each session as it is published), then a summary with the sessions per
hour and every session that failed with its reason. Exit status 0 when every session of the
range is published and current, 1 when some failed; running it again computes only those.

Ctrl-C or SIGTERM asks Dagster to terminate the run in progress, says which and exits 130;
with ``--detach`` the run is left running (:func:`corr_pipeline.defs.backfill.stop_runs`).
Started with SIGINT ignored (a script's background job: ``cmd &``, ``nohup cmd &``) it keeps
ignoring SIGINT, as the shell asked, so a Ctrl-C meant for the script's foreground leaves it
running; SIGTERM (``kill PID``) stops it however it was started.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from corr_pipeline.cli.common import echo, iso_date, open_engine, parse_params, positive_int

__all__ = ["add_backfill_command", "cmd_backfill", "sigterm_interrupts"]


def cmd_backfill(args: argparse.Namespace) -> int:
    """Plan and run the backfill; exit 1 when a session failed. A range that ends before it
    starts is refused first, before Dagster is imported or anything is opened."""
    if args.to < args.from_:
        raise ValueError(f"--to {args.to} is before --from {args.from_}")
    from corr_pipeline.db.price_source import configured_price_source
    from corr_pipeline.defs.backfill import BackfillRequest, run_backfill  # imports Dagster
    from corr_pipeline.defs.resources import SnapshotParams, refuse_locations
    from corr_pipeline.defs.run import open_instance

    overrides = parse_params(args.param or [])
    refuse_locations(overrides)
    params = SnapshotParams(**overrides).to_parameters()
    request = BackfillRequest(
        first=args.from_,
        last=args.to,
        params=params,
        source=configured_price_source(),
        overrides=overrides,
        per_run=args.per_run,
        force=args.force,
        detach=args.detach,
    )
    engine = open_engine(create_if_fresh=False)
    instance = open_instance()
    try:
        with sigterm_interrupts():
            report = run_backfill(instance, engine, request, echo=echo)
    finally:
        instance.dispose()
    for line in report.lines():
        echo(line)
    return 0 if report.success else 1


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM interrupts it as Ctrl-C does (``KeyboardInterrupt``), so
    that ``kill PID`` stops the backfill's runs too; the previous handler is restored after."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def add_backfill_command(commands: Any) -> None:
    """Register ``backfill`` on the sub-command parser ``commands``."""
    parser = commands.add_parser(
        "backfill",
        help="snapshots of a range of sessions through the Dagster instance, few runs, resumable",
    )
    parser.add_argument("--from", dest="from_", type=iso_date, required=True, metavar="D1")
    parser.add_argument("--to", type=iso_date, required=True, metavar="D2")
    parser.add_argument(
        "--per-run",
        type=positive_int,
        help="sessions per run (default: as many as half the maximum runtime holds, at most 2520)",
    )
    parser.add_argument(
        "--force", action="store_true", help="recompute sessions already published and current"
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="on Ctrl-C or SIGTERM leave the run in progress running (default: ask Dagster to "
        "terminate it)",
    )
    parser.add_argument(
        "--param",
        action="append",
        metavar="NAME=VALUE",
        help="a snapshot parameter for every run (repeatable), e.g. lookback_days=126",
    )
    parser.set_defaults(func=cmd_backfill)
