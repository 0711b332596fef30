"""change_summaries records how many sessions lie between the two dates a change set compares.

``change_summaries.sessions_between`` (``integer``, NULL, ``>= 0``): the number of sessions of
the configured calendar strictly between ``previous_date`` and ``snapshot_date`` (SPEC §7
"Ranges", §10). 0: consecutive sessions, the changes are overnight; more: the sessions between
were not published (a gap in the history) and the changes span all of them, which every place
that shows them says. NULL for change sets recorded before this revision (``corr-pipeline query
changes`` then says the gap is not recorded; ``snapshot_changes`` of the date records it).

``ADD COLUMN IF NOT EXISTS``: a development database may already have it. The downgrade drops it
(every row is kept).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

COLUMN = "sessions_between"
CONSTRAINT = "ck_change_summaries_sessions_between"


def upgrade() -> None:
    op.execute(
        sa.text(
            f"ALTER TABLE change_summaries ADD COLUMN IF NOT EXISTS {COLUMN} integer NULL "
            f"CONSTRAINT {CONSTRAINT} CHECK ({COLUMN} >= 0)"
        )
    )


def downgrade() -> None:
    op.drop_column("change_summaries", COLUMN)
