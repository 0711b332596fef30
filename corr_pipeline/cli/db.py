"""``corr-pipeline db init|url``: create the schema, say where the database is."""

from __future__ import annotations

import argparse
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import echo, open_engine
from corr_pipeline.db import engine as db_engine

__all__ = ["add_db_commands", "cmd_db_init", "cmd_db_url", "where_is_the_database"]


def where_is_the_database() -> str:
    """Human description of the configured database (redacted), starting it if embedded."""
    url = db_engine.database_url()
    server = db_engine.embedded_server()
    if server is None:
        return f"{db_engine.redact_url(url)}  (from {settings.ENV_DATABASE_URL})"
    return (
        f"{db_engine.redact_url(url)}\n"
        f"  embedded PostgreSQL, data directory {server.pgdata}\n"
        f"  Unix socket {server.socket_path} (no TCP port; only its owner can connect), "
        f"database {db_engine.EMBEDDED_DATABASE}, user {db_engine.EMBEDDED_USER}\n"
        f"  it runs while a corr-pipeline process uses it and stops when the last one is done"
    )


def cmd_db_init(args: argparse.Namespace) -> int:
    """Create the missing tables; print where."""
    engine = open_engine()
    echo(f"schema ready at {db_engine.describe_url(engine.url)}")
    return 0


def cmd_db_url(args: argparse.Namespace) -> int:
    """Print :func:`where_is_the_database`."""
    echo(where_is_the_database())
    return 0


def add_db_commands(commands: Any) -> None:
    """Register ``db init`` and ``db url`` on the sub-command parser ``commands``."""
    db = commands.add_parser("db", help="database: create the schema, show where it is")
    db_commands = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    db_commands.add_parser("init", help="create missing tables (idempotent)").set_defaults(
        func=cmd_db_init
    )
    db_commands.add_parser(
        "url", help="print the database URL (credentials redacted) and where it lives"
    ).set_defaults(func=cmd_db_url)
