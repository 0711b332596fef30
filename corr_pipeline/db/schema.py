"""The PostgreSQL schema (SQLAlchemy Core): input prices (SPEC §1) and published snapshots (SPEC §7).

Tables
------
``prices``                   (symbol, trade_date) -> close. Index on trade_date for the window query
                             (SPEC §2 filters by a date range).
``snapshots``                one row per snapshot_date; params is the jsonb of the run config;
                             matrix_versions (jsonb, NULL-able) the matrix-store versions the
                             snapshot was computed from, ``{asset: {array: version}}`` (SPEC §8).
``peer_neighbors``           (snapshot_date, symbol, rank) -> neighbor, corr, overlap; rank starts at 1.
                             Padding entries (fewer than k finite neighbors, SPEC §4) are not stored.
``symbol_clusters``          (snapshot_date, symbol) -> cluster_id; indexed by (snapshot_date, cluster_id)
                             for "members of this cluster".
``lead_lag_pairs``           (snapshot_date, leader, lagger) -> lag, lagged_corr, sync_corr (NULL-able,
                             NaN allowed), improvement, overlap; indexed by (snapshot_date, lagger)
                             for "who leads this symbol".
``synthetic_lead_lag_truth`` (leader, lagger) -> lag, seed: the lead-lag pairs the synthetic
                             universe generator injected, so tests and the demo can check recovery.

The three per-snapshot child tables reference ``snapshots`` (every child row's ``snapshot_date``
has a ``snapshots`` row; deleting a ``snapshots`` row deletes its children) through triggers, not a
``FOREIGN KEY``: see :func:`install_snapshot_reference`. Replacing a snapshot is a delete + inserts
in one transaction (:func:`corr_pipeline.db.publish.publish_snapshot`; SPEC §7: never duplicated,
never half-written).

Symbol columns use ``COLLATE "C"`` (code-point order, see ``SYMBOL``).
Correlations are float32 in the pipeline (SPEC §3), so they are stored as ``real``: exact, and half
the size of ``double precision``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData()

#: Symbols are text compared byte-wise (``COLLATE "C"``): for UTF-8 that is code-point order, the
#: order SPEC §2 uses for matrix columns, whatever the server's default locale; it is also the
#: cheapest comparison for the primary-key B-trees.
SYMBOL = sa.Text(collation="C")

prices = sa.Table(
    "prices",
    metadata,
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("trade_date", sa.Date, primary_key=True),
    sa.Column("close", sa.Double, nullable=False),
    sa.Index("ix_prices_trade_date", "trade_date"),
)

snapshots = sa.Table(
    "snapshots",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("as_of_trade_date", sa.Date, nullable=False),
    sa.Column("n_symbols", sa.Integer, nullable=False),
    sa.Column("n_dropped", sa.Integer, nullable=False),
    sa.Column("lookback_days", sa.Integer, nullable=False),
    sa.Column("params", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # {asset: {array: version}} pinned in the matrix store; NULL: published without a store
    # (or before versions were recorded), readers then use the store's current versions
    sa.Column("matrix_versions", JSONB, nullable=True),
)


peer_neighbors = sa.Table(
    "peer_neighbors",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("rank", sa.SmallInteger, primary_key=True),
    sa.Column("neighbor", SYMBOL, nullable=False),
    sa.Column("corr", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
    sa.CheckConstraint("rank >= 1", name="ck_peer_neighbors_rank_positive"),
)

symbol_clusters = sa.Table(
    "symbol_clusters",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=False),
    sa.Index("ix_symbol_clusters_cluster", "snapshot_date", "cluster_id"),
)

lead_lag_pairs = sa.Table(
    "lead_lag_pairs",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("lag", sa.SmallInteger, nullable=False),
    sa.Column("lagged_corr", sa.REAL, nullable=False),
    sa.Column("sync_corr", sa.REAL, nullable=True),
    sa.Column("improvement", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
    sa.Index("ix_lead_lag_pairs_lagger", "snapshot_date", "lagger"),
)

synthetic_lead_lag_truth = sa.Table(
    "synthetic_lead_lag_truth",
    metadata,
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("lag", sa.SmallInteger, nullable=False),
    sa.Column("seed", sa.Integer, nullable=False),
)

#: Tables holding data, children before parents (safe order for TRUNCATE/DELETE).
ALL_TABLES: tuple[sa.Table, ...] = (
    peer_neighbors,
    symbol_clusters,
    lead_lag_pairs,
    snapshots,
    prices,
    synthetic_lead_lag_truth,
)

# Arbitrary constant key for pg_advisory_xact_lock: serialises concurrent init_schema calls
# (several Dagster step processes may start at once), which CREATE TABLE IF NOT EXISTS alone
# does not make safe.
_SCHEMA_LOCK_KEY = 0x636F7272  # "corr"


#: The per-snapshot tables that reference ``snapshots``.
SNAPSHOT_CHILD_TABLES = ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")

#: Every table a snapshot publication writes, parent first.
PUBLISHED_TABLES = ("snapshots", *SNAPSHOT_CHILD_TABLES)

_CHECK_FUNCTION = "corr_pipeline_check_snapshot_reference"
_CHECK_BODY = """
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

_CHILDREN_FUNCTION = "corr_pipeline_snapshot_children"
_CHILDREN_BODY = """
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


def _snapshot_reference_triggers() -> dict[str, tuple[str, str]]:
    """Trigger name -> (table, CREATE TRIGGER statement)."""
    triggers = {
        "snapshots_children": (
            "snapshots",
            "CREATE TRIGGER snapshots_children AFTER DELETE OR UPDATE OF snapshot_date "
            f"ON snapshots FOR EACH ROW EXECUTE FUNCTION {_CHILDREN_FUNCTION}()",
        )
    }
    for table in SNAPSHOT_CHILD_TABLES:
        for event in ("insert", "update"):
            name = f"{table}_snapshot_ref_{event}"
            triggers[name] = (
                table,
                f"CREATE TRIGGER {name} AFTER {event.upper()} ON {table} "
                "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
                f"EXECUTE FUNCTION {_CHECK_FUNCTION}()",
            )
    return triggers


def install_snapshot_reference(conn: sa.Connection) -> list[str]:
    """Make the child tables reference ``snapshots`` through triggers; returns what it changed.

    What it enforces, the semantics of ``FOREIGN KEY (snapshot_date) REFERENCES snapshots
    ON DELETE CASCADE``:

    * an ``INSERT``/``COPY``/``UPDATE`` of child rows whose ``snapshot_date`` has no
      ``snapshots`` row fails with SQLSTATE 23503 (``foreign_key_violation``); the referenced
      ``snapshots`` rows are locked ``FOR KEY SHARE`` meanwhile, as a foreign key does;
    * deleting a ``snapshots`` row deletes its child rows (same transaction);
    * changing a referenced ``snapshots.snapshot_date`` fails (23503).

    Why triggers: a foreign key checks every inserted child row with its own query (~3.5 µs
    a row here, ≈ 2.5 s of the ≈ 740,000 rows published at N = 24,000); these check each
    *statement* once, with one anti-join over its rows (transition table). Not covered:
    ``TRUNCATE snapshots`` alone (use :func:`truncate_all`, or delete).

    A foreign key from a child table to ``snapshots`` is dropped, the triggers taking its place
    (looked up in the catalog, so only when present; nothing is locked otherwise). Idempotent;
    run by :func:`init_schema`.
    """
    changed: list[str] = []
    legacy = conn.execute(
        sa.text(
            "SELECT c.conrelid::regclass::text, c.conname FROM pg_constraint c "
            "WHERE c.contype = 'f' AND c.confrelid = to_regclass('snapshots') "
            "AND c.conrelid = ANY (ARRAY(SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t))"
        ),
        {"tables": list(SNAPSHOT_CHILD_TABLES)},
    ).all()
    for table, name in legacy:
        conn.execute(sa.text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
        changed.append(f"dropped foreign key {table}.{name}")
    for function, body in ((_CHECK_FUNCTION, _CHECK_BODY), (_CHILDREN_FUNCTION, _CHILDREN_BODY)):
        current = conn.execute(
            sa.text(
                "SELECT p.prosrc FROM pg_proc p WHERE p.proname = :name "
                "AND p.pronamespace = current_schema()::regnamespace"
            ),
            {"name": function},
        ).scalar()
        if current != body:
            conn.execute(
                sa.text(
                    f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
                    f"SET search_path FROM CURRENT AS $body${body}$body$"
                )
            )
            changed.append(f"function {function}")
    existing = set(
        conn.execute(
            sa.text(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = ANY ("
                "ARRAY(SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t))"
            ),
            {"tables": list(PUBLISHED_TABLES)},
        ).scalars()
    )
    for name, (_table, statement) in _snapshot_reference_triggers().items():
        if name not in existing:
            conn.execute(sa.text(statement))
            changed.append(f"trigger {name}")
    return changed


def init_schema(engine: sa.Engine) -> None:
    """Create every missing table, index and trigger (:func:`install_snapshot_reference`);
    existing ones are left untouched (idempotent), except a foreign key from a child table to
    ``snapshots``, which the triggers replace.

    Safe to call from several processes at once (a transaction-scoped advisory lock serialises
    the catalog checks and CREATEs).
    """
    with engine.begin() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK_KEY)))
        metadata.create_all(conn, checkfirst=True)
        install_snapshot_reference(conn)


def truncate_all(engine: sa.Engine) -> None:
    """Empty every table of the schema (tests and ``demo --reset`` style tooling)."""
    names = ", ".join(conn_table.name for conn_table in ALL_TABLES)
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {names}"))
