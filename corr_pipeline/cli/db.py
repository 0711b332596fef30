"""``corr-pipeline db init|url|prune``: create the schema, say where the database is, delete
old published snapshots."""

from __future__ import annotations

import argparse
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import echo, iso_date, open_engine
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.publish import delete_snapshot
from corr_pipeline.db.reads import published_dates

__all__ = [
    "add_db_commands",
    "cmd_db_init",
    "cmd_db_prune",
    "cmd_db_url",
    "where_is_the_database",
]


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


def cmd_db_init(args: argparse.Namespace) -> int:
    """Create the missing tables; print where."""
    engine = open_engine()
    echo(f"schema ready at {db_engine.describe_url(engine.url.render_as_string())}")
    return 0


def cmd_db_url(args: argparse.Namespace) -> int:
    """Print :func:`where_is_the_database`."""
    echo(where_is_the_database())
    return 0


def cmd_db_prune(args: argparse.Namespace) -> int:
    """Delete the published snapshots dated before ``--before`` (each in its own transaction,
    :func:`corr_pipeline.db.publish.delete_snapshot`); ``--dry-run`` only lists them."""
    engine = open_engine()
    dates = published_dates(engine, before=args.before)
    if not dates:
        echo(f"no published snapshot before {args.before}")
        return 0
    span = f"{dates[0]} .. {dates[-1]}" if len(dates) > 1 else str(dates[0])
    if args.dry_run:
        echo(f"would delete {len(dates)} published snapshot(s) before {args.before}: {span}")
        echo("dry run: nothing was deleted")
        return 0
    deleted = sum(bool(delete_snapshot(engine, day)) for day in dates)
    echo(
        f"deleted {deleted} published snapshot(s) before {args.before}: {span} (their matrices, "
        "now unpublished, go at the next store retention)"
    )
    return 0


def add_db_commands(commands: Any) -> None:
    """Register ``db init``, ``db url`` and ``db prune`` on the sub-command parser ``commands``."""
    db = commands.add_parser(
        "db", help="database: create the schema, show where it is, delete old snapshots"
    )
    db_commands = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    db_commands.add_parser("init", help="create missing tables (idempotent)").set_defaults(
        func=cmd_db_init
    )
    db_commands.add_parser(
        "url", help="print the database URL (credentials redacted) and where it lives"
    ).set_defaults(func=cmd_db_url)
    prune = db_commands.add_parser(
        "prune",
        help="delete the published snapshots dated before DATE (all their rows)",
        description="Deletes every published snapshot (snapshots row, neighbors, clusters, "
        "lead-lag pairs) whose snapshot_date is before DATE, one date per transaction. The "
        "prices are kept.",
    )
    prune.add_argument("--before", type=iso_date, required=True, metavar="DATE")
    prune.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted, delete nothing"
    )
    prune.set_defaults(func=cmd_db_prune)
