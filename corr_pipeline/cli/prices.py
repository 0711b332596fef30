"""``corr-pipeline prices import|synth``: load a CSV, or replace prices with a synthetic
universe.

Both write the project's own ``prices`` table, never a configured price source
(``CORR_PIPELINE_PRICES_TABLE``): that one is read-only. When such a source is configured,
they say on stderr that the pipeline will not read what they load."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from corr_pipeline.cli.common import echo, iso_date, open_engine, positive_int, write_synthetic
from corr_pipeline.cli.demo import DEMO_DAYS, DEMO_SEED, DEMO_SYMBOLS
from corr_pipeline.cli.progress import cli_progress
from corr_pipeline.db.price_source import configured_price_source
from corr_pipeline.db.prices_import import import_prices_csv

__all__ = ["add_prices_commands", "cmd_prices_import", "cmd_prices_synth"]


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


def add_prices_commands(commands: Any) -> None:
    """Register ``prices import`` and ``prices synth`` on the sub-command parser ``commands``."""
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
    synth.add_argument("--symbols", type=positive_int, default=DEMO_SYMBOLS, metavar="N")
    synth.add_argument("--days", type=positive_int, default=DEMO_DAYS, metavar="T")
    synth.add_argument("--seed", type=int, default=DEMO_SEED, metavar="S")
    synth.add_argument(
        "--end-date", type=iso_date, default=None, metavar="D", help="last weekday (YYYY-MM-DD)"
    )
    synth.set_defaults(func=cmd_prices_synth)
