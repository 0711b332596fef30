"""Schema migrations (Alembic): which revision a database is at, upgrading it, refusing it.

The revisions live in ``corr_pipeline/db/migrations/versions`` (shipped inside the package) and
run programmatically: :func:`alembic_config` builds the Alembic configuration in code, no
``alembic.ini`` is needed. The revision a database is at is recorded in the table
:data:`VERSION_TABLE` (not Alembic's default ``alembic_version``, so that another
Alembic-managed application sharing the database, Dagster's PostgreSQL storage for one, cannot
collide with it).

* :func:`upgrade` (``corr-pipeline db upgrade``, ``db init``) brings a database to the newest
  revision (or the one given) in ONE transaction under an advisory lock: concurrent callers wait
  and then find nothing to do; a failure leaves the database as it was.
* A database created before migrations existed (by ``init_schema``, no version table) is
  recognised by its shape -- foreign keys to ``snapshots``: revision 0001; reference triggers:
  0002 -- stamped with that revision and upgraded from there. A shape that matches neither is
  refused (nothing is touched).
* :func:`require_current` is what the pipeline and the query commands call: a database whose
  schema is older or newer than the code, or absent, raises :class:`SchemaVersionError` with one
  line naming the command to run.
* :func:`schema_status` is ``corr-pipeline db status``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "INIT_COMMAND",
    "MIGRATIONS_DIR",
    "UPGRADE_COMMAND",
    "VERSION_TABLE",
    "MigrationReport",
    "Revision",
    "SchemaStatus",
    "SchemaVersionError",
    "alembic_config",
    "downgrade",
    "ensure_schema",
    "head_revision",
    "require_current",
    "revisions",
    "schema_status",
    "upgrade",
]

logger = logging.getLogger(__name__)

#: Where Alembic records the revision of this project's schema.
VERSION_TABLE = "corr_pipeline_alembic_version"
#: The Alembic script directory (``env.py``, ``versions/``), inside the installed package.
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")

UPGRADE_COMMAND = "corr-pipeline db upgrade"
INIT_COMMAND = "corr-pipeline db init"

# pg_advisory_xact_lock key serialising schema changes of concurrent processes ("corr").
_SCHEMA_LOCK_KEY = 0x636F7272

# What the databases created before migrations hold (in the first schema of the search path).
_LEGACY_TABLES = (
    "prices",
    "snapshots",
    "peer_neighbors",
    "symbol_clusters",
    "lead_lag_pairs",
    "synthetic_lead_lag_truth",
)
_CHILD_TABLES = ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")
_LEGACY_TRIGGERS = frozenset(
    {"snapshots_children"}
    | {f"{t}_snapshot_ref_{event}" for t in _CHILD_TABLES for event in ("insert", "update")}
)
_SYMBOL_COLUMNS = ("symbol", "neighbor", "leader", "lagger")


class SchemaVersionError(RuntimeError):
    """The database schema is not the one this code needs (absent, older, newer, unrecognised).

    The message is one line naming what to run (e.g. ``database schema is at 0002, the code
    needs 0004: run corr-pipeline db upgrade``). Not retried: waiting does not change it.
    """


@dataclass(frozen=True)
class Revision:
    """One migration: its id (``"0003"``) and the first line of its docstring."""

    id: str
    title: str

    def __str__(self) -> str:
        return f"{self.id}  {self.title}"


# ---------------------------------------------------------------------------------------------
# Alembic configuration and the revisions
# ---------------------------------------------------------------------------------------------


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """The Alembic configuration, built in code (no ``alembic.ini``): the script directory
    :data:`MIGRATIONS_DIR`; ``connection`` (if given) is what ``env.py`` migrates, in its
    current transaction."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


@functools.cache
def revisions() -> tuple[Revision, ...]:
    """Every revision, oldest first."""
    found = []
    for rev in _script().walk_revisions():  # newest first
        doc = (rev.module.__doc__ or "").strip().splitlines()
        found.append(Revision(rev.revision, doc[0].strip() if doc else ""))
    return tuple(reversed(found))


def head_revision() -> str:
    """The newest revision: the schema this code reads and writes."""
    return revisions()[-1].id


def _ids() -> list[str]:
    return [rev.id for rev in revisions()]


def _between(low: str | None, high: str | None) -> list[Revision]:
    """The revisions after ``low`` up to and including ``high`` (None = before the first)."""
    ids = _ids()
    start = ids.index(low) + 1 if low is not None else 0
    stop = ids.index(high) + 1 if high is not None else 0
    return list(revisions()[start:stop])


# ---------------------------------------------------------------------------------------------
# Where a database is
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema is, relative to the code.

    ``current``: the recorded revision, or for a database without a version table the revision
    its shape matches (``versioned`` False), or None for a fresh database (``fresh``) or an
    unrecognised one (``unrecognised`` says why). ``pending``: the revisions an upgrade applies.
    """

    head: str
    current: str | None
    versioned: bool
    fresh: bool = False
    unrecognised: str | None = None
    pending: tuple[Revision, ...] = field(default_factory=tuple)

    @property
    def known(self) -> bool:
        """Whether this code knows ``current`` (a newer code's revision is unknown here)."""
        return self.current is None or self.current in _ids()

    @property
    def up_to_date(self) -> bool:
        return self.versioned and self.current == self.head

    def problem(self) -> str | None:
        """None when the code can use the database; otherwise the one-line refusal."""
        if self.up_to_date:
            return None
        if self.unrecognised is not None:
            return self.unrecognised
        if self.fresh:
            return (
                f"the database has no corr_pipeline schema, the code needs {self.head}: "
                f"run {INIT_COMMAND}"
            )
        if not self.known:
            return (
                f"database schema is at {self.current}, newer than this code (which needs "
                f"{self.head}): run the corr_pipeline version that upgraded it "
                "(pip install --upgrade corr_pipeline), or restore the backup taken before"
            )
        if not self.versioned:
            return (
                f"database schema is at {self.current} (created before versioned migrations), "
                f"the code needs {self.head}: run {UPGRADE_COMMAND}"
            )
        return (
            f"database schema is at {self.current}, the code needs {self.head}: "
            f"run {UPGRADE_COMMAND}"
        )


def _recorded_revision(conn: sa.Connection) -> tuple[bool, list[str]]:
    """(whether the version table exists, the revisions it records: Alembic's current heads)."""
    from alembic.runtime.migration import MigrationContext

    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return False, []
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return True, [str(r) for r in context.get_current_heads()]


def _legacy_shape(conn: sa.Connection) -> tuple[str | None, str | None, bool]:
    """For a database without a version table: (revision its shape matches, why it matches
    none, whether it is fresh -- none of our tables at all)."""
    present = set(
        conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_class c "
                "WHERE c.relnamespace = current_schema()::regnamespace "
                "AND c.relkind IN ('r', 'p') AND c.relname = ANY (CAST(:names AS text[]))"
            ),
            {"names": list(_LEGACY_TABLES)},
        ).scalars()
    )
    moved = conn.execute(
        sa.text("SELECT to_regclass('synthetic.lead_lag_truth') IS NOT NULL")
    ).scalar_one()
    if not present and not moved:
        return None, None, True
    missing = [t for t in _LEGACY_TABLES if t not in present]
    if missing or moved:
        found = sorted(present) + (["synthetic.lead_lag_truth"] if moved else [])
        return (
            None,
            "the database holds corr_pipeline tables but no version table and not a schema "
            f"this code recognises (present: {', '.join(found)}; missing: "
            f"{', '.join(missing) or 'none'}): restore a backup or use a fresh database",
            False,
        )
    tables = {"tables": list(_CHILD_TABLES)}
    foreign_keys = conn.execute(
        sa.text(
            "SELECT count(*) FROM pg_constraint c WHERE c.contype = 'f' "
            "AND c.confrelid = to_regclass('snapshots') AND c.conrelid = ANY (ARRAY("
            "SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t))"
        ),
        tables,
    ).scalar_one()
    triggers = set(
        conn.execute(
            sa.text(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = ANY (ARRAY("
                "SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t))"
            ),
            {"tables": ["snapshots", *_CHILD_TABLES]},
        ).scalars()
    )
    not_c = conn.execute(
        sa.text(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = ANY (CAST(:tables AS text[])) AND column_name = "
            "ANY (CAST(:columns AS text[])) AND collation_name IS DISTINCT FROM 'C'"
        ),
        {"tables": list(_LEGACY_TABLES), "columns": list(_SYMBOL_COLUMNS)},
    ).scalar_one()
    if not_c:
        return (
            None,
            'the database\'s symbol columns are not COLLATE "C": a development schema from '
            "before the first release, which this code does not migrate: restore a backup or "
            "use a fresh database",
            False,
        )
    if foreign_keys == len(_CHILD_TABLES) and not triggers & _LEGACY_TRIGGERS:
        return "0001", None, False
    if foreign_keys == 0 and triggers >= _LEGACY_TRIGGERS:
        return "0002", None, False
    return (
        None,
        "the database holds corr_pipeline tables but no version table, and neither the foreign "
        f"keys of revision 0001 ({foreign_keys} of {len(_CHILD_TABLES)} found) nor the triggers "
        "of revision 0002: restore a backup or use a fresh database",
        False,
    )


def schema_status(bind: sa.Engine | sa.Connection) -> SchemaStatus:
    """Where the schema of ``bind``'s database is (a few catalog queries, no change)."""
    if isinstance(bind, sa.Engine):
        with bind.connect() as conn:
            return schema_status(conn)
    head = head_revision()
    versioned, recorded = _recorded_revision(bind)
    if versioned and recorded:
        if len(recorded) != 1:
            return SchemaStatus(
                head,
                None,
                True,
                unrecognised=f"the version table {VERSION_TABLE} holds {len(recorded)} "
                f"revisions ({', '.join(recorded) or 'none'}), expected one: restore a backup",
            )
        current = recorded[0]
        pending = tuple(_between(current, head)) if current in _ids() else ()
        return SchemaStatus(head, current, True, pending=pending)
    # no version table, or an empty one (downgraded to base): judge by what is there
    legacy, unrecognised, fresh = _legacy_shape(bind)
    if fresh:
        return SchemaStatus(head, None, False, fresh=True, pending=tuple(_between(None, head)))
    if unrecognised is not None:
        return SchemaStatus(head, None, False, unrecognised=unrecognised)
    return SchemaStatus(head, legacy, False, pending=tuple(_between(legacy, head)))


def require_current(bind: sa.Engine | sa.Connection) -> None:
    """Raise :class:`SchemaVersionError` unless the database is at :func:`head_revision`."""
    problem = schema_status(bind).problem()
    if problem is not None:
        raise SchemaVersionError(problem)


def ensure_schema(engine: sa.Engine, *, create_if_fresh: bool = False) -> SchemaStatus:
    """:func:`require_current`, except that a fresh database (none of our tables, no version
    table) is created at the newest revision when ``create_if_fresh`` (what the commands that
    load data do: ``prices import``, ``prices synth``, ``demo``, ``bench``). Never migrates
    existing tables."""
    status = schema_status(engine)
    if status.fresh and create_if_fresh:
        upgrade(engine, only_if_fresh=True)
        status = schema_status(engine)
    problem = status.problem()
    if problem is not None:
        raise SchemaVersionError(problem)
    return status


# ---------------------------------------------------------------------------------------------
# Changing it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrationReport:
    """What :func:`upgrade` / :func:`downgrade` did. ``before`` is None for a fresh database;
    ``stamped`` is the revision an unversioned (pre-migrations) database was recognised as."""

    before: str | None
    after: str | None
    applied: tuple[Revision, ...]
    stamped: str | None = None
    direction: str = "upgrade"

    def summary(self) -> str:
        """E.g. ``upgraded from 0002 to 0004: applied 0003, 0004``."""
        stamped = (
            f" (recognised as {self.stamped}: created before versioned migrations)"
            if self.stamped
            else ""
        )
        if not self.applied:
            return f"already at {self.after}, nothing to do{stamped}"
        ids = ", ".join(rev.id for rev in self.applied)
        if self.before is None:
            return f"created: applied {ids}"
        if self.direction == "upgrade":
            return f"upgraded from {self.before}{stamped} to {self.after}: applied {ids}"
        return f"downgraded from {self.before}{stamped} to {self.after or 'base'}: undid {ids}"


@contextmanager
def _locked(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One transaction holding the schema advisory lock (released at commit/rollback)."""
    with engine.begin() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK_KEY)))
        yield conn


def _quiet_alembic() -> None:
    for name in ("alembic.runtime.migration", "alembic"):
        log = logging.getLogger(name)
        if log.level == logging.NOTSET:
            log.setLevel(logging.WARNING)


def _start(conn: sa.Connection) -> tuple[SchemaStatus, str | None]:
    """Status under the lock, refusing what cannot be migrated; stamps a recognised
    pre-migrations database. Returns (status, stamped revision)."""
    from alembic import command

    status = schema_status(conn)
    if status.unrecognised is not None:
        raise SchemaVersionError(status.unrecognised)
    if not status.known:
        raise SchemaVersionError(status.problem() or "unknown revision")
    if not status.versioned and status.current is not None:
        command.stamp(alembic_config(conn), status.current)
        logger.debug("recognised a database created before migrations as %s", status.current)
        return status, status.current
    return status, None


def upgrade(
    engine: sa.Engine, revision: str = "head", *, only_if_fresh: bool = False
) -> MigrationReport:
    """Upgrade the schema to ``revision`` (default the newest) in one transaction.

    Idempotent (nothing to do at the target). A database created before migrations is
    recognised and stamped first (see the module docstring); an unrecognised or newer one
    raises :class:`SchemaVersionError` and nothing changes. ``only_if_fresh``: do nothing
    unless the database is fresh (checked under the lock).
    """
    from alembic import command

    _quiet_alembic()
    with _locked(engine) as conn:
        status, stamped = _start(conn)
        if only_if_fresh and not status.fresh:
            return MigrationReport(status.current, status.current, ())
        target = head_revision() if revision == "head" else revision
        if target not in _ids():
            raise SchemaVersionError(f"unknown revision {revision!r} (known: {', '.join(_ids())})")
        ids = _ids()
        if status.current is not None and ids.index(status.current) > ids.index(target):
            raise SchemaVersionError(
                f"database schema is at {status.current}, past {target}: that is a downgrade "
                f"(corr-pipeline db downgrade {target})"
            )
        command.upgrade(alembic_config(conn), target)
        after = schema_status(conn).current
    report = MigrationReport(status.current, after, tuple(_between(status.current, after)), stamped)
    if report.applied:
        logger.debug("%s", report.summary())
    return report


def downgrade(engine: sa.Engine, revision: str) -> MigrationReport:
    """Downgrade the schema to ``revision`` (``"base"``: drop everything) in one transaction.

    Data of what a revision removes is lost (e.g. 0004 drops ``snapshots.matrix_versions``);
    the tables that go back to an older shape keep their rows."""
    from alembic import command

    _quiet_alembic()
    ids = _ids()
    if revision != "base" and revision not in ids:
        raise SchemaVersionError(f"unknown revision {revision!r} (known: {', '.join(ids)})")
    with _locked(engine) as conn:
        status, stamped = _start(conn)
        if status.current is None:
            return MigrationReport(None, None, (), direction="downgrade")
        target = None if revision == "base" else revision
        if target is not None and ids.index(target) > ids.index(status.current):
            raise SchemaVersionError(
                f"database schema is at {status.current}, before {target}: that is an upgrade "
                f"({UPGRADE_COMMAND})"
            )
        command.downgrade(alembic_config(conn), revision)
        after = schema_status(conn).current
    undone = tuple(reversed(_between(target, status.current)))
    return MigrationReport(status.current, after, undone, stamped, direction="downgrade")
