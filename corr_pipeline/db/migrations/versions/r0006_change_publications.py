"""change_summaries records the publications a change set was computed from.

``change_summaries.snapshot_published_at`` and ``previous_published_at`` (``timestamptz``,
NULL): the ``snapshots.created_at`` of the two publications the changes compare (SPEC §10.7).
A snapshot re-published later has a newer ``created_at``: its changes, and those of the next
session, which compared against the old publication, are then *stale* until
``snapshot_changes`` runs again (``corr-pipeline query changes`` says so). NULL for change
sets recorded before this revision (their staleness cannot be checked).

``ADD COLUMN IF NOT EXISTS``: a development database may already have them.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("snapshot_published_at", "previous_published_at")


def upgrade() -> None:
    for column in COLUMNS:
        op.execute(
            sa.text(
                f"ALTER TABLE change_summaries ADD COLUMN IF NOT EXISTS {column} timestamptz NULL"
            )
        )


def downgrade() -> None:
    for column in COLUMNS:
        op.drop_column("change_summaries", column)
