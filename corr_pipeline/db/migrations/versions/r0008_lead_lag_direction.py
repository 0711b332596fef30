"""lead_lag_pairs carries each pair's reverse direction: its best lag, correlation, q-value.

SPEC §6 "Direction": a lag that shows in both directions says nothing about which symbol
leads. For a published pair ``(leader, lagger)``, the three columns describe the ordered pair
the other way, ``(lagger, leader)``: ``reverse_lag`` (``smallint``) its best lag,
``reverse_lagged_corr`` (``real``, float32 like ``lagged_corr``) the lagged correlation at that
lag, ``reverse_q_value`` (``double precision``, like ``q_value``) its Benjamini–Hochberg
q-value. All three are NULL when the reverse pair has no best lag, and in the rows of the
snapshots published before this revision (their reverse direction was not recorded: the query
commands show it as unknown, never as one-way). A pair whose ``reverse_q_value`` is at most the
snapshot's ``max_q_value`` (``snapshots.params``) is *two-way*.

``ADD COLUMN IF NOT EXISTS``: a development database may already have them. The downgrade drops
them (every row is kept).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

#: The columns added, with their PostgreSQL types (all NULL-able).
COLUMNS = (
    ("reverse_lag", "smallint"),
    ("reverse_lagged_corr", "real"),
    ("reverse_q_value", "double precision"),
)


def upgrade() -> None:
    for column, kind in COLUMNS:
        op.execute(
            sa.text(f"ALTER TABLE lead_lag_pairs ADD COLUMN IF NOT EXISTS {column} {kind} NULL")
        )


def downgrade() -> None:
    for column, _ in reversed(COLUMNS):
        op.drop_column("lead_lag_pairs", column)
