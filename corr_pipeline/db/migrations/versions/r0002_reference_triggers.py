"""Reference triggers instead of the foreign keys; indexes for the member/leader queries.

The child tables reference ``snapshots`` through statement-level triggers instead of foreign
keys, and the indexes of the cluster-members and leaders-of-a-symbol queries.

What the triggers enforce is what ``FOREIGN KEY (snapshot_date) REFERENCES snapshots ON DELETE
CASCADE`` enforced:

* an ``INSERT``/``COPY``/``UPDATE`` of child rows whose ``snapshot_date`` has no ``snapshots``
  row fails with SQLSTATE 23503 (``foreign_key_violation``); the referenced ``snapshots`` rows
  are locked ``FOR KEY SHARE`` meanwhile, as a foreign key check locks them;
* deleting a ``snapshots`` row deletes its child rows (same transaction);
* changing a referenced ``snapshots.snapshot_date`` fails (23503).

Why: a foreign key checks every inserted child row with its own query (~3.5 µs a row, ≈ 2.5 s of
the ≈ 740,000 rows published at N = 24,000); these check each *statement* once, with one
anti-join over its rows (transition table). Not covered: ``TRUNCATE snapshots`` alone.

The foreign keys are looked up in the catalog (whatever their names) and dropped. The indexes
are created ``IF NOT EXISTS``: databases created between their introduction (commit e2d88ea) and
the triggers (commit e747b4b) already have them. Downgrade restores the foreign keys (the
triggers guarantee there is no orphan row they could reject) and drops the indexes.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

CHILD_TABLES = ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")

CHECK_FUNCTION = "corr_pipeline_check_snapshot_reference"
CHECK_BODY = """
DECLARE
    missing date;
BEGIN
    -- the referenced snapshots rows are locked as a FOREIGN KEY check locks them, so a
    -- concurrent DELETE of one waits for this transaction (and then deletes what it committed)
    PERFORM 1 FROM snapshots s
    WHERE s.snapshot_date IN (SELECT DISTINCT r.snapshot_date FROM new_rows r)
    FOR KEY SHARE OF s;
    SELECT r.snapshot_date INTO missing
    FROM (SELECT DISTINCT snapshot_date FROM new_rows) r
    WHERE NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.snapshot_date = r.snapshot_date)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert or update on table "%" violates the snapshot reference',
            TG_TABLE_NAME
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = format('snapshot_date %s is not present in table "snapshots".',
                                  missing);
    END IF;
    RETURN NULL;
END
"""

CHILDREN_FUNCTION = "corr_pipeline_snapshot_children"
CHILDREN_BODY = """
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM peer_neighbors WHERE snapshot_date = OLD.snapshot_date;
        DELETE FROM symbol_clusters WHERE snapshot_date = OLD.snapshot_date;
        DELETE FROM lead_lag_pairs WHERE snapshot_date = OLD.snapshot_date;
    ELSIF NEW.snapshot_date IS DISTINCT FROM OLD.snapshot_date AND (
            EXISTS (SELECT 1 FROM peer_neighbors WHERE snapshot_date = OLD.snapshot_date)
            OR EXISTS (SELECT 1 FROM symbol_clusters WHERE snapshot_date = OLD.snapshot_date)
            OR EXISTS (SELECT 1 FROM lead_lag_pairs WHERE snapshot_date = OLD.snapshot_date)) THEN
        RAISE EXCEPTION 'update on table "snapshots" violates the snapshot reference'
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = format('snapshot_date %s is still referenced.', OLD.snapshot_date);
    END IF;
    RETURN NULL;
END
"""

INDEXES = {
    "ix_symbol_clusters_cluster": ("symbol_clusters", ("snapshot_date", "cluster_id")),
    "ix_lead_lag_pairs_lagger": ("lead_lag_pairs", ("snapshot_date", "lagger")),
}


def _triggers() -> dict[str, tuple[str, str]]:
    """Trigger name -> (table, CREATE TRIGGER statement)."""
    triggers = {
        "snapshots_children": (
            "snapshots",
            "CREATE TRIGGER snapshots_children AFTER DELETE OR UPDATE OF snapshot_date "
            f"ON snapshots FOR EACH ROW EXECUTE FUNCTION {CHILDREN_FUNCTION}()",
        )
    }
    for table in CHILD_TABLES:
        for event in ("insert", "update"):
            name = f"{table}_snapshot_ref_{event}"
            triggers[name] = (
                table,
                f"CREATE TRIGGER {name} AFTER {event.upper()} ON {table} "
                "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
                f"EXECUTE FUNCTION {CHECK_FUNCTION}()",
            )
    return triggers


def upgrade() -> None:
    conn = op.get_bind()
    foreign_keys = conn.execute(
        sa.text(
            "SELECT r.relname, c.conname FROM pg_constraint c "
            "JOIN pg_class r ON r.oid = c.conrelid "
            "WHERE c.contype = 'f' AND c.confrelid = to_regclass('snapshots') "
            "AND c.conrelid = ANY (ARRAY(SELECT to_regclass(t) "
            "FROM unnest(CAST(:tables AS text[])) t)) ORDER BY 1, 2"
        ),
        {"tables": list(CHILD_TABLES)},
    ).all()
    for table, name in foreign_keys:  # whatever the names: quoted by Alembic, never pasted
        op.drop_constraint(name, table, type_="foreignkey")
    for function, body in ((CHECK_FUNCTION, CHECK_BODY), (CHILDREN_FUNCTION, CHILDREN_BODY)):
        op.execute(
            sa.text(
                f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
                f"SET search_path FROM CURRENT AS $body${body}$body$"
            )
        )
    for _table, statement in _triggers().values():
        op.execute(sa.text(statement))
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, list(columns), if_not_exists=True)


def downgrade() -> None:
    for name, (table, _columns) in INDEXES.items():
        op.drop_index(name, table_name=table)
    for name, (table, _statement) in _triggers().items():
        op.execute(sa.text(f"DROP TRIGGER {name} ON {table}"))
    for function in (CHECK_FUNCTION, CHILDREN_FUNCTION):
        op.execute(sa.text(f"DROP FUNCTION {function}()"))
    for table in CHILD_TABLES:
        op.create_foreign_key(
            f"{table}_snapshot_date_fkey",
            table,
            "snapshots",
            ["snapshot_date"],
            ["snapshot_date"],
            ondelete="CASCADE",
        )
