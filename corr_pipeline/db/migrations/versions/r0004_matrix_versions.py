"""snapshots.matrix_versions (jsonb, NULL): the store versions a publication pins.

``snapshots.matrix_versions`` (``jsonb``, NULL): the matrix-store versions a publication was
computed from (SPEC §8, pinned versions); NULL for snapshots published before it existed.

``ADD COLUMN IF NOT EXISTS``: a development database may already have it.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.execute(sa.text("ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS matrix_versions jsonb NULL"))


def downgrade() -> None:
    op.drop_column("snapshots", "matrix_versions")
