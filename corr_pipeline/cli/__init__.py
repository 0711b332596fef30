"""The ``corr-pipeline`` command: a thin argparse layer over the library. Logic lives in the
library; the command modules parse, call, print.

    corr-pipeline db init                    create or upgrade the schema (= db upgrade) (cli.db)
    corr-pipeline db upgrade                 apply the pending schema migrations
    corr-pipeline db status                  schema revision, the code's, pending migrations
    corr-pipeline db url                     where the database is (credentials redacted)
    corr-pipeline db psql [PSQL ARGS]        psql on the project database (-c SQL, -f FILE, stdin)
    corr-pipeline db prune --before DATE     delete the published snapshots before DATE
    corr-pipeline prices import FILE         load a CSV (symbol,trade_date,close)   (cli.prices)
    corr-pipeline prices synth [--symbols N --days T --seed S --end-date D]
                                             replace prices with a synthetic universe
    corr-pipeline prices check [--days N --lookback-days L]
                                             check the configured price source, its first
                                             session with a full window, its fit to the calendar
    corr-pipeline calendar [--from D --to D] the sessions (partitions) and when runs start (cli.calendar)
    corr-pipeline query snapshots|peers|cluster|lead-lag|corr|changes|quality ...
                                             answers from the published snapshots (cli.query)
    corr-pipeline store list                 the matrix store's partitions          (cli.store)
    corr-pipeline store prune [--keep K --dry-run]
                                             retention: matrices of the newest K published dates
    corr-pipeline demo                       embedded database + schema + demo universe (+ pipeline)
                                                                                    (cli.demo)
    corr-pipeline backfill --from D1 --to D2 [--per-run K --force --detach --param NAME=VALUE]
                                             the snapshots of a range of sessions, few runs,
                                             resumable                              (cli.backfill)
    corr-pipeline bench [--n N --t T ...]    time the whole chain (or --publish-only) on a synthetic
                                             universe, in a scratch embedded database by default
                                                                                    (cli.bench)
    corr-pipeline ui [--port P --host H --read-only --no-token]
                                             Dagster UI + daemon on the project's instance, for
                                             the holder of the printed token; SIGINT/SIGTERM/SIGHUP
                                             stop all of it                           (cli.ui)
    corr-pipeline concurrency show|set [LIMIT] [--n N --t T ...]
                                             snapshot runs at once, sized by memory and cores
                                                                                    (cli.concurrency)
    corr-pipeline dask certs [DIR]           a private authority and certificates for a Dask cluster
                                             over TLS; prints its commands and settings
                                                                                    (cli.dask_cluster)

The project's ``.env`` (``./.env`` in the repository root, the file Dagster's commands read when
started there) applies to every command, with Dagster's precedence (its values replace the
environment's), so the command line and the UI agree (:func:`corr_pipeline.project_env.env_file_applied`);
``corr-pipeline ui`` refuses to start while it holds keys other than the project's and Dagster's.

Every file the command and the processes it starts create is its user's alone (``umask`` 077,
:func:`corr_pipeline.privacy.private_umask`).

User errors (bad input file, unreachable database, invalid arguments) print one line
``corr-pipeline: error: ...`` on stderr and exit with status 2, without a traceback
(``--debug`` shows it). An interrupt prints ``corr-pipeline: interrupted`` and exits with 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from corr_pipeline import privacy, project_env
from corr_pipeline.cli.backfill import add_backfill_command
from corr_pipeline.cli.bench import add_bench_command
from corr_pipeline.cli.calendar import add_calendar_command
from corr_pipeline.cli.common import UsageError
from corr_pipeline.cli.concurrency import add_concurrency_commands
from corr_pipeline.cli.dask_cluster import add_dask_commands
from corr_pipeline.cli.db import add_db_commands
from corr_pipeline.cli.demo import add_demo_command
from corr_pipeline.cli.prices import add_prices_commands
from corr_pipeline.cli.query import add_query_commands
from corr_pipeline.cli.store import add_store_commands
from corr_pipeline.cli.ui import add_ui_command
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.migrate import SchemaVersionError
from corr_pipeline.db.prices_import import PricesImportError

__all__ = ["PROG", "USER_ERRORS", "UsageError", "build_parser", "main"]

PROG = "corr-pipeline"

#: Exceptions that are the user's to fix: reported in one line, exit status 2.
USER_ERRORS: tuple[type[BaseException], ...] = (
    db_engine.DatabaseUnavailableError,
    SchemaVersionError,
    PricesImportError,
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
    ValueError,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``corr-pipeline`` parser; every command sets ``func(args) -> exit status``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Nightly correlation snapshot for large equity universes.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks for errors instead of one line"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also say which embedded PostgreSQL serves the command (pid, data, socket)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_db_commands(commands)
    add_prices_commands(commands)
    add_calendar_command(commands)
    add_demo_command(commands)
    add_backfill_command(commands)
    add_bench_command(commands)
    add_query_commands(commands)
    add_store_commands(commands)
    add_ui_command(commands)
    add_concurrency_commands(commands)
    add_dask_commands(commands)
    return parser


def _configure_logging(verbose: bool = False) -> None:
    """Our INFO messages on stderr; the embedded server's start-up line only with ``--verbose``
    (warnings about it always)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("corr_pipeline").setLevel(logging.INFO)
    embedded = logging.getLogger("corr_pipeline.dbserver")
    embedded.setLevel(logging.INFO if verbose else logging.WARNING)


def _one_line(exc: BaseException) -> str:
    """The error on one line; the configured database password is scrubbed as a last line of
    defence (the project's own messages never contain it)."""
    text = " ".join(str(exc).split())
    return db_engine.hide_secrets(text) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``corr-pipeline``; returns the process exit status (0 success, 2 user
    error in one line on stderr unless ``--debug``, 130 interrupted)."""
    parser = build_parser()
    # commands that pass their arguments on (db psql) take the ones argparse does not know
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    _configure_logging(args.verbose)
    try:
        strict = bool(getattr(args, "strict_env_file", False))
        with privacy.private_umask(), project_env.env_file_applied(strict=strict):
            return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
