"""The changes against the previous session: change_summaries and four child tables.

What changed between a snapshot and the previous published session (SPEC §10), published by
``snapshot_changes``: ``change_summaries`` (one row per date: the market-level drift, the parts
skipped) and its children ``change_pairs`` (the top moves by |Δcorr|), ``change_symbols``
(kept/entered/left, cluster move, neighbor turnover), ``change_clusters`` (matched, appeared,
vanished, split, merged) and ``change_lead_lag`` (appeared, vanished, lag changed). The children
reference ``change_summaries`` by plain foreign keys with ``ON DELETE CASCADE``: a date has a
few thousand rows, so the per-row check costs nothing (unlike the snapshot's tables, migration
0002). New tables only: nothing existing changes, downgrade drops them.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

SYMBOL = sa.Text(collation="C")
_CHILDREN = ("change_pairs", "change_symbols", "change_clusters", "change_lead_lag")


def _date() -> sa.Column:
    return sa.Column(
        "snapshot_date",
        sa.Date,
        sa.ForeignKey("change_summaries.snapshot_date", ondelete="CASCADE"),
        primary_key=True,
    )


def upgrade() -> None:
    empty = sa.text("'{}'::jsonb")
    op.create_table(
        "change_summaries",
        sa.Column("snapshot_date", sa.Date, primary_key=True),
        sa.Column("previous_date", sa.Date, nullable=False),
        sa.Column("n_symbols", sa.Integer, nullable=False),
        sa.Column("n_previous_symbols", sa.Integer, nullable=False),
        sa.Column("n_common", sa.Integer, nullable=False),
        sa.Column("n_entered", sa.Integer, nullable=False),
        sa.Column("n_left", sa.Integer, nullable=False),
        sa.Column("n_pairs", sa.BigInteger, nullable=True),
        sa.Column("mean_corr", sa.Double, nullable=True),
        sa.Column("previous_mean_corr", sa.Double, nullable=True),
        sa.Column("mean_abs_corr", sa.Double, nullable=True),
        sa.Column("previous_mean_abs_corr", sa.Double, nullable=True),
        sa.Column("mean_change", sa.Double, nullable=True),
        sa.Column("mean_abs_change", sa.Double, nullable=True),
        sa.Column("quantiles", JSONB, nullable=True),
        sa.Column("change_histogram", JSONB, nullable=True),
        sa.Column("skipped", JSONB, nullable=False, server_default=empty),
        sa.Column("params", JSONB, nullable=False, server_default=empty),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("previous_date < snapshot_date", name="ck_change_summaries_previous"),
    )
    op.create_table(
        "change_pairs",
        _date(),
        sa.Column("rank", sa.SmallInteger, primary_key=True),
        sa.Column("symbol_a", SYMBOL, nullable=False),
        sa.Column("symbol_b", SYMBOL, nullable=False),
        sa.Column("corr", sa.REAL, nullable=False),
        sa.Column("previous_corr", sa.REAL, nullable=False),
        sa.Column("overlap", sa.Integer, nullable=False),
        sa.Column("previous_overlap", sa.Integer, nullable=False),
        sa.Column("change", sa.Double, nullable=False),
        sa.CheckConstraint("rank >= 1", name="ck_change_pairs_rank_positive"),
    )
    op.create_table(
        "change_symbols",
        _date(),
        sa.Column("symbol", SYMBOL, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("cluster_id", sa.Integer, nullable=True),
        sa.Column("previous_cluster_id", sa.Integer, nullable=True),
        sa.Column("moved", sa.Boolean, nullable=True),
        sa.Column("n_neighbors", sa.Integer, nullable=True),
        sa.Column("new_neighbors", sa.Integer, nullable=True),
        sa.CheckConstraint(
            "status IN ('kept', 'entered', 'left')", name="ck_change_symbols_status"
        ),
    )
    op.create_table(
        "change_clusters",
        _date(),
        sa.Column("line", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.Integer, nullable=True),
        sa.Column("previous_cluster_id", sa.Integer, nullable=True),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("previous_size", sa.Integer, nullable=False),
        sa.Column("shared", sa.Integer, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("split", sa.Boolean, nullable=False),
        sa.Column("merged", sa.Boolean, nullable=False),
        sa.CheckConstraint(
            "status IN ('matched', 'appeared', 'vanished')", name="ck_change_clusters_status"
        ),
    )
    op.create_table(
        "change_lead_lag",
        _date(),
        sa.Column("leader", SYMBOL, primary_key=True),
        sa.Column("lagger", SYMBOL, primary_key=True),
        sa.Column("change", sa.Text, nullable=False),
        sa.Column("lag", sa.SmallInteger, nullable=True),
        sa.Column("previous_lag", sa.SmallInteger, nullable=True),
        sa.Column("improvement", sa.REAL, nullable=True),
        sa.Column("previous_improvement", sa.REAL, nullable=True),
        sa.CheckConstraint(
            "change IN ('appeared', 'vanished', 'lag_changed')", name="ck_change_lead_lag_change"
        ),
    )


def downgrade() -> None:
    for table in (*_CHILDREN, "change_summaries"):
        op.drop_table(table)
