"""Schema migrations (Alembic): the oldest schema with data upgrades to the newest with nothing
lost and the same structure as a fresh database; the revisions reproduce the released schemas;
databases created before migrations are recognised; schema.py agrees with the migrations."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from corr_pipeline.db import migrate, schema
from corr_pipeline.db.migrate import SchemaVersionError
from corr_pipeline_tests.db.legacy import schema_6a95e5e, schema_40db00b
from corr_pipeline_tests.db.migration_rows import D1, D2, HEAD, SYMBOLS, opened
from corr_pipeline_tests.fixtures.published import publish_reference as publish
from corr_pipeline_tests.fixtures.published import table_counts as counts_of

# ---------------------------------------------------------------------------------------------
# The structure of a database, from the catalog
# ---------------------------------------------------------------------------------------------

_USER_SCHEMAS = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"


def structure(conn: sa.Connection) -> dict[str, Any]:
    """Everything a migration can change, read from the catalog (the version table left out):
    schemas, columns in order (type, nullability, default, collation), constraints, indexes,
    triggers, functions."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(sa.text(sql)).all()]

    version = migrate.VERSION_TABLE
    return {
        "schemas": rows(f"SELECT nspname FROM pg_namespace n WHERE {_USER_SCHEMAS} ORDER BY 1"),
        "columns": rows(
            "SELECT n.nspname, c.relname, a.attnum, a.attname, format_type(a.atttypid, "
            "a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid), co.collname "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 "
            f"WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped "
            f"AND {_USER_SCHEMAS} AND c.relname <> '{version}' ORDER BY 1, 2, 3"
        ),
        "constraints": rows(
            "SELECT n.nspname, c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) "
            "FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE {_USER_SCHEMAS} AND c.relname <> '{version}' ORDER BY 1, 2, 3"
        ),
        "indexes": rows(
            "SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes n "
            f"WHERE schemaname NOT LIKE 'pg\\_%' AND schemaname <> 'information_schema' "
            f"AND tablename <> '{version}' ORDER BY 1, 2, 3"
        ),
        "triggers": rows(
            "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal ORDER BY 1, 2"
        ),
        "functions": rows(
            "SELECT n.nspname, p.proname, p.prosrc, p.proconfig, p.prorettype::regtype::text "
            f"FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER_SCHEMAS} "
            "ORDER BY 1, 2"
        ),
    }


def structure_of(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return structure(conn)


def assert_same_structure(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for key in expected:  # one assertion per part: a readable diff
        assert actual[key] == expected[key], key


# ---------------------------------------------------------------------------------------------
# Data in every table of the oldest schema
# ---------------------------------------------------------------------------------------------

#: Every table of revision 0001 with its columns (in order) and primary key.
TABLES_0001 = {
    "prices": ("symbol, trade_date, close", "symbol, trade_date"),
    "snapshots": (
        "snapshot_date, as_of_trade_date, n_symbols, n_dropped, lookback_days, params, created_at",
        "snapshot_date",
    ),
    "peer_neighbors": (
        "snapshot_date, symbol, rank, neighbor, corr, overlap",
        "snapshot_date, symbol, rank",
    ),
    "symbol_clusters": ("snapshot_date, symbol, cluster_id", "snapshot_date, symbol"),
    "lead_lag_pairs": (
        "snapshot_date, leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap",
        "snapshot_date, leader, lagger",
    ),
    "synthetic_lead_lag_truth": ("leader, lagger, lag, seed", "leader, lagger"),
}
#: Where each table of 0001 lives at the newest revision.
MOVED = {"synthetic_lead_lag_truth": "synthetic.lead_lag_truth"}


def fill_oldest_schema(conn: sa.Connection) -> None:
    """Rows in every table of revision 0001, with the awkward values (NaN, infinities, NULL,
    nested jsonb, non-ASCII symbols, a timestamp with a time zone)."""
    closes = [1.5, float("nan"), float("inf"), float("-inf"), 0.0, -2.25, 1e-300]
    conn.execute(
        sa.text("INSERT INTO prices VALUES (:s, :d, :c)"),
        [
            {"s": s, "d": day, "c": closes[(i + j) % len(closes)] + (0 if j % 3 else i)}
            for i, s in enumerate(SYMBOLS)
            for j, day in enumerate([D1 - dt.timedelta(days=1), D1, D2])
        ],
    )
    for day, params in ((D1, '{"k": 3, "nested": {"a": [1, 2.5, null]}}'), (D2, "{}")):
        conn.execute(
            sa.text(
                "INSERT INTO snapshots VALUES (:d, :d, 7, 1, 40, CAST(:p AS jsonb), "
                "CAST(:t AS timestamptz))"
            ),
            {"d": day, "p": params, "t": f"{day} 22:15:07.123456+02"},
        )
        conn.execute(
            sa.text("INSERT INTO peer_neighbors VALUES (:d, :s, :r, :n, :c, 40)"),
            [
                {"d": day, "s": s, "r": r, "n": SYMBOLS[(i + r) % 7], "c": 0.1234567 * r - i / 7}
                for i, s in enumerate(SYMBOLS)
                for r in (1, 2)
            ],
        )
        conn.execute(
            sa.text("INSERT INTO symbol_clusters VALUES (:d, :s, :c)"),
            [{"d": day, "s": s, "c": i % 3} for i, s in enumerate(SYMBOLS)],
        )
        conn.execute(
            sa.text("INSERT INTO lead_lag_pairs VALUES (:d, :a, :b, :l, 0.625, :sync, 0.5, 39)"),
            [
                {"d": day, "a": "AAA", "b": "日本株", "l": 1, "sync": None},
                {"d": day, "a": "Caf\u00e9", "b": "z", "l": 2, "sync": float("nan")},
                {"d": day, "a": "z", "b": "AAA", "l": 3, "sync": -0.125},
            ],
        )
    conn.execute(
        sa.text("INSERT INTO synthetic_lead_lag_truth VALUES (:a, :b, :l, 7)"),
        [{"a": "AAA", "b": "日本株", "l": 1}, {"a": "z", "b": "Cafe\u0301", "l": 4}],
    )


def dump(conn: sa.Connection, *, moved: bool) -> dict[str, list[str]]:
    """Every row of the 0001 tables (their 0001 columns), as PostgreSQL's exact text form
    (floats round-trip), by table, sorted by primary key."""
    out = {}
    for table, (columns, key) in TABLES_0001.items():
        name = MOVED.get(table, table) if moved else table
        out[table] = list(
            conn.execute(
                sa.text(f"SELECT CAST(ROW({columns}) AS text) FROM {name} ORDER BY {key}")
            ).scalars()
        )
    return out


def count_rows(conn: sa.Connection, *, moved: bool) -> dict[str, int]:
    return {
        table: conn.execute(
            sa.text(f"SELECT count(*) FROM {MOVED.get(table, table) if moved else table}")
        ).scalar_one()
        for table in TABLES_0001
    }


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------


def test_oldest_schema_with_data_upgrades_to_head_with_nothing_lost(
    new_database: Callable[[], str],
) -> None:
    """Revision 0001 with rows in every table, upgraded to the newest: the same rows (counts
    and values, byte for byte), the new column NULL, and the structure of a fresh database."""
    with opened(new_database()) as old, opened(new_database()) as fresh:
        assert migrate.upgrade(old, "0001").after == "0001"
        with old.begin() as conn:
            fill_oldest_schema(conn)
            before, counts = dump(conn, moved=False), count_rows(conn, moved=False)
        assert all(counts.values()), counts

        report = migrate.upgrade(old)
        assert (report.before, report.after) == ("0001", HEAD)
        assert [rev.id for rev in report.applied] == [
            "0002",
            "0003",
            "0004",
            "0005",
            "0006",
            "0007",
            "0008",
            "0009",
            "0010",
        ]
        with old.connect() as conn:
            assert count_rows(conn, moved=True) == counts
            assert dump(conn, moved=True) == before
            assert (
                conn.execute(
                    sa.text("SELECT count(*) FROM snapshots WHERE matrix_versions IS NULL")
                ).scalar_one()
                == counts["snapshots"]
            )
            assert (
                conn.execute(sa.text("SELECT to_regclass('synthetic_lead_lag_truth')")).scalar_one()
                is None
            )

        migrate.upgrade(fresh)
        assert_same_structure(structure_of(old), structure_of(fresh))

        # the reference triggers took over from the foreign keys: cascade and rejection
        with old.begin() as conn:
            conn.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D1})
        with old.connect() as conn:
            assert (
                conn.execute(
                    sa.text("SELECT count(*) FROM peer_neighbors WHERE snapshot_date = :d"),
                    {"d": D1},
                ).scalar_one()
                == 0
            )
        with pytest.raises(sa.exc.IntegrityError, match="snapshot reference"), old.begin() as c:
            c.execute(sa.text("INSERT INTO symbol_clusters VALUES (:d, 'A', 0)"), {"d": D1})
        # and publication replaces a snapshot of the upgraded database as it does a fresh one
        publish(old, D2, n=10)
        assert counts_of(old, D2) == [1, 30, 10, 10]


def test_schema_py_matches_the_newest_revision(engine: sa.Engine) -> None:
    """The SQLAlchemy tables the code queries are what the migrations create (Alembic's
    autogenerate comparison: no table, column, type, nullability, default or index differs)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "version_table": migrate.VERSION_TABLE,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        assert compare_metadata(context, schema.metadata) == []
        assert migrate.schema_status(conn).up_to_date


def test_revision_0001_is_the_first_released_schema(new_database: Callable[[], str]) -> None:
    """0001 creates exactly what the first release's init_schema created (its verbatim
    schema.py), and 0002 exactly what the last release before migrations created."""
    with opened(new_database()) as released, opened(new_database()) as migrated:
        schema_6a95e5e.init_schema(released)
        migrate.upgrade(migrated, "0001")
        assert_same_structure(structure_of(migrated), structure_of(released))

        with released.begin() as conn:
            for table in reversed(schema_6a95e5e.ALL_TABLES):
                conn.execute(sa.text(f"DROP TABLE {table.name} CASCADE"))
        schema_40db00b.init_schema(released)
        migrate.upgrade(migrated, "0002")
        assert_same_structure(structure_of(migrated), structure_of(released))


def _with_later_indexes(engine: sa.Engine) -> None:
    """A database created between the new indexes (e2d88ea) and the triggers (e747b4b)."""
    schema_6a95e5e.init_schema(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE INDEX ix_symbol_clusters_cluster ON symbol_clusters "
                             "(snapshot_date, cluster_id)"))  # fmt: skip
        conn.execute(sa.text("CREATE INDEX ix_lead_lag_pairs_lagger ON lead_lag_pairs "
                             "(snapshot_date, lagger)"))  # fmt: skip


@pytest.mark.parametrize(
    ("create", "recognised"),
    [
        pytest.param(schema_6a95e5e.init_schema, "0001", id="first-release-foreign-keys"),
        pytest.param(_with_later_indexes, "0001", id="foreign-keys-and-later-indexes"),
        pytest.param(schema_40db00b.init_schema, "0002", id="last-release-triggers"),
    ],
)
def test_database_created_before_migrations_is_recognised_and_upgraded(
    new_database: Callable[[], str], create: Callable[[sa.Engine], None], recognised: str
) -> None:
    """No version table: the shape says which revision it is; it is stamped and upgraded,
    keeping its rows; the pipeline refuses it until then."""
    with opened(new_database()) as legacy, opened(new_database()) as fresh:
        create(legacy)
        with legacy.begin() as conn:
            fill_oldest_schema(conn)
            before = dump(conn, moved=False)
        status = migrate.schema_status(legacy)
        assert (status.current, status.versioned, status.fresh) == (recognised, False, False)
        assert status.problem() == (
            f"database schema is at {recognised} (created before versioned migrations), "
            f"the code needs {HEAD}: run corr-pipeline db upgrade"
        )
        with pytest.raises(SchemaVersionError, match="run corr-pipeline db upgrade"):
            migrate.require_current(legacy)

        report = migrate.upgrade(legacy)
        assert (report.stamped, report.before, report.after) == (recognised, recognised, HEAD)
        assert "created before versioned migrations" in report.summary()
        with legacy.connect() as conn:
            assert dump(conn, moved=True) == before
        migrate.require_current(legacy)
        migrate.upgrade(fresh)
        assert_same_structure(structure_of(legacy), structure_of(fresh))


def _only_prices(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE prices (symbol text, trade_date date, close float8)"))


def _released_without_one_trigger(engine: sa.Engine) -> None:
    schema_40db00b.init_schema(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER lead_lag_pairs_snapshot_ref_insert ON lead_lag_pairs"))


def _symbols_not_collate_c(engine: sa.Engine) -> None:
    schema_6a95e5e.init_schema(engine)
    with engine.begin() as conn:
        conn.execute(sa.text('ALTER TABLE prices ALTER COLUMN symbol TYPE text COLLATE "POSIX"'))


@pytest.mark.parametrize(
    ("create", "fragment"),
    [
        pytest.param(_only_prices, "missing: snapshots", id="some-tables-only"),
        pytest.param(_released_without_one_trigger, "nor the triggers", id="half-migrated"),
        pytest.param(_symbols_not_collate_c, 'not COLLATE "C"', id="pre-release-collation"),
    ],
)
def test_unrecognised_database_is_refused_and_left_alone(
    new_database: Callable[[], str], create: Callable[[sa.Engine], None], fragment: str
) -> None:
    with opened(new_database()) as db:
        create(db)
        before = structure_of(db)
        status = migrate.schema_status(db)
        assert status.unrecognised is not None and fragment in status.unrecognised
        with pytest.raises(SchemaVersionError, match="restore a backup or use a fresh database"):
            migrate.upgrade(db)
        with pytest.raises(SchemaVersionError, match=fragment):
            migrate.require_current(db)
        assert structure_of(db) == before
        with db.connect() as conn:
            assert migrate._recorded_revision(conn) == (False, [])  # no version table created


def test_downgrade_to_the_oldest_and_back_keeps_the_rows(new_database: Callable[[], str]) -> None:
    """head -> 0001 gives the first release's structure back with every row (the foreign keys
    return), 0001 -> head again, and base drops everything."""
    with opened(new_database()) as db, opened(new_database()) as released:
        migrate.upgrade(db, "0001")
        with db.begin() as conn:
            fill_oldest_schema(conn)
            before = dump(conn, moved=False)
        migrate.upgrade(db)
        report = migrate.downgrade(db, "0001")
        assert (report.before, report.after) == (HEAD, "0001")
        assert [rev.id for rev in report.applied] == [
            "0010",
            "0009",
            "0008",
            "0007",
            "0006",
            "0005",
            "0004",
            "0003",
            "0002",
        ]
        schema_6a95e5e.init_schema(released)
        assert_same_structure(structure_of(db), structure_of(released))
        with db.connect() as conn:
            assert dump(conn, moved=False) == before
        migrate.upgrade(db)
        with db.connect() as conn:
            assert dump(conn, moved=True) == before

        migrate.downgrade(db, "base")
        status = migrate.schema_status(db)
        assert status.fresh and status.current is None
        assert structure_of(db)["columns"] == []


def test_upgrade_is_idempotent_and_serialised(new_database: Callable[[], str]) -> None:
    """Four processes' worth of concurrent upgrades of a fresh database: one creates it, the
    others wait on the lock and find nothing to do."""
    with opened(new_database()) as db:
        reports: list[migrate.MigrationReport] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                reports.append(migrate.upgrade(db))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert sorted(len(r.applied) for r in reports) == [0, 0, 0, len(migrate.revisions())]
        assert migrate.upgrade(db).summary() == f"already at {HEAD}, nothing to do"


def test_newer_revision_is_refused(new_database: Callable[[], str]) -> None:
    with opened(new_database()) as db:
        migrate.upgrade(db)
        with db.begin() as conn:
            conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0099'"))
        status = migrate.schema_status(db)
        assert not status.known and not status.up_to_date
        message = re.escape(
            f"database schema is at 0099, newer than this code (which needs {HEAD})"
        )
        with pytest.raises(SchemaVersionError, match=message):
            migrate.require_current(db)
        with pytest.raises(SchemaVersionError, match=message):
            migrate.upgrade(db)


def test_fresh_database(new_database: Callable[[], str]) -> None:
    """A fresh database is refused by the readers (no schema is created behind their back),
    and created by ensure_schema(create_if_fresh=True), what the loading commands use."""
    with opened(new_database()) as db:
        status = migrate.schema_status(db)
        pending = [rev.id for rev in status.pending]
        assert status.fresh and pending == [
            "0001",
            "0002",
            "0003",
            "0004",
            "0005",
            "0006",
            "0007",
            "0008",
            "0009",
            HEAD,
        ]
        with pytest.raises(SchemaVersionError) as info:
            migrate.require_current(db)
        assert str(info.value) == (
            f"the database has no corr_pipeline schema, the code needs {HEAD}: "
            "run corr-pipeline db init"
        )
        assert structure_of(db)["columns"] == []
        migrate.ensure_schema(db, create_if_fresh=True)
        assert migrate.schema_status(db).up_to_date
        migrate.downgrade(db, "0003")  # an older one is not upgraded by ensure_schema
        with pytest.raises(SchemaVersionError, match="is at 0003, the code needs"):
            migrate.ensure_schema(db, create_if_fresh=True)
