"""The PostgreSQL schema (SQLAlchemy Core): input prices (SPEC §1) and published snapshots (SPEC §7).

Tables
------
``prices``                   (symbol, trade_date) -> close. Index on trade_date for the window query
                             (SPEC §2 filters by a date range).
``snapshots``                one row per snapshot_date; params is the jsonb of the run config.
``peer_neighbors``           (snapshot_date, symbol, rank) -> neighbor, corr, overlap; rank starts at 1.
                             Padding entries (fewer than k finite neighbors, SPEC §4) are not stored.
``symbol_clusters``          (snapshot_date, symbol) -> cluster_id.
``lead_lag_pairs``           (snapshot_date, leader, lagger) -> lag, lagged_corr, sync_corr (NULL-able,
                             NaN allowed), improvement, overlap.
``synthetic_lead_lag_truth`` (leader, lagger) -> lag, seed: the lead-lag pairs the synthetic
                             universe generator injected, so tests and the demo can check recovery.

The three per-snapshot child tables reference ``snapshots`` with ``ON DELETE CASCADE``: replacing a
snapshot is ``DELETE FROM snapshots WHERE snapshot_date = :d`` + inserts, in one transaction
(SPEC §7: never duplicated, never half-written).

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
)


def _snapshot_fk() -> sa.ForeignKey:
    return sa.ForeignKey("snapshots.snapshot_date", ondelete="CASCADE")


peer_neighbors = sa.Table(
    "peer_neighbors",
    metadata,
    sa.Column("snapshot_date", sa.Date, _snapshot_fk(), primary_key=True),
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
    sa.Column("snapshot_date", sa.Date, _snapshot_fk(), primary_key=True),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=False),
)

lead_lag_pairs = sa.Table(
    "lead_lag_pairs",
    metadata,
    sa.Column("snapshot_date", sa.Date, _snapshot_fk(), primary_key=True),
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("lag", sa.SmallInteger, nullable=False),
    sa.Column("lagged_corr", sa.REAL, nullable=False),
    sa.Column("sync_corr", sa.REAL, nullable=True),
    sa.Column("improvement", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
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


def init_schema(engine: sa.Engine) -> None:
    """Create every missing table and index; existing ones are left untouched (idempotent).

    Safe to call from several processes at once (a transaction-scoped advisory lock serialises
    the catalog checks and CREATEs).
    """
    with engine.begin() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK_KEY)))
        metadata.create_all(conn, checkfirst=True)


def truncate_all(engine: sa.Engine) -> None:
    """Empty every table of the schema (tests and ``demo --reset`` style tooling)."""
    names = ", ".join(conn_table.name for conn_table in ALL_TABLES)
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {names}"))
