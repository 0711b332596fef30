"""The first released schema: foreign keys from the snapshot tables to snapshots.

The schema as first released (commit 6a95e5e): prices, snapshots and its three child tables
with ``FOREIGN KEY ... ON DELETE CASCADE`` to ``snapshots``, the synthetic ground truth beside
them, and one index besides the primary keys (``prices.trade_date``).

Created exactly as that release's ``init_schema`` (``metadata.create_all``) created it: same
columns in the same order, the same constraint names (PostgreSQL's defaults for the primary
and foreign keys), symbols ``COLLATE "C"``.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

SYMBOL = sa.Text(collation="C")
CHILD_TABLES = ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")


def _snapshot_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["snapshot_date"],
        ["snapshots.snapshot_date"],
        name=f"{table}_snapshot_date_fkey",
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("symbol", SYMBOL, nullable=False),
        sa.Column("trade_date", sa.Date, nullable=False),
        sa.Column("close", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("symbol", "trade_date", name="prices_pkey"),
    )
    op.create_index("ix_prices_trade_date", "prices", ["trade_date"])
    op.create_table(
        "snapshots",
        sa.Column("snapshot_date", sa.Date, nullable=False),
        sa.Column("as_of_trade_date", sa.Date, nullable=False),
        sa.Column("n_symbols", sa.Integer, nullable=False),
        sa.Column("n_dropped", sa.Integer, nullable=False),
        sa.Column("lookback_days", sa.Integer, nullable=False),
        sa.Column("params", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("snapshot_date", name="snapshots_pkey"),
    )
    op.create_table(
        "peer_neighbors",
        sa.Column("snapshot_date", sa.Date, nullable=False),
        sa.Column("symbol", SYMBOL, nullable=False),
        sa.Column("rank", sa.SmallInteger, nullable=False),
        sa.Column("neighbor", SYMBOL, nullable=False),
        sa.Column("corr", sa.REAL, nullable=False),
        sa.Column("overlap", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("snapshot_date", "symbol", "rank", name="peer_neighbors_pkey"),
        _snapshot_fk("peer_neighbors"),
        sa.CheckConstraint("rank >= 1", name="ck_peer_neighbors_rank_positive"),
    )
    op.create_table(
        "symbol_clusters",
        sa.Column("snapshot_date", sa.Date, nullable=False),
        sa.Column("symbol", SYMBOL, nullable=False),
        sa.Column("cluster_id", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("snapshot_date", "symbol", name="symbol_clusters_pkey"),
        _snapshot_fk("symbol_clusters"),
    )
    op.create_table(
        "lead_lag_pairs",
        sa.Column("snapshot_date", sa.Date, nullable=False),
        sa.Column("leader", SYMBOL, nullable=False),
        sa.Column("lagger", SYMBOL, nullable=False),
        sa.Column("lag", sa.SmallInteger, nullable=False),
        sa.Column("lagged_corr", sa.REAL, nullable=False),
        sa.Column("sync_corr", sa.REAL, nullable=True),
        sa.Column("improvement", sa.REAL, nullable=False),
        sa.Column("overlap", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("snapshot_date", "leader", "lagger", name="lead_lag_pairs_pkey"),
        _snapshot_fk("lead_lag_pairs"),
    )
    op.create_table(
        "synthetic_lead_lag_truth",
        sa.Column("leader", SYMBOL, nullable=False),
        sa.Column("lagger", SYMBOL, nullable=False),
        sa.Column("lag", sa.SmallInteger, nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("leader", "lagger", name="synthetic_lead_lag_truth_pkey"),
    )


def downgrade() -> None:
    for table in (*CHILD_TABLES, "snapshots", "prices", "synthetic_lead_lag_truth"):
        op.drop_table(table)
