"""suspect_prices: the symbols of a snapshot whose prices are suspect, with both figures.

One row per suspect symbol of a published snapshot (SPEC §2 "Suspect prices"): its share of
zero returns among its finite returns in the window (``zero_return_share``, ``double
precision`` in ``[0, 1]``), its largest |log return| (``max_abs_return``, ``>= 0``), why it is
suspect (``reason``, naming the threshold it exceeds) and whether the snapshot dropped it from
its universe (``dropped``: the ``drop_suspect`` parameter). Written by the snapshot's
publication in its transaction; ``corr-pipeline query quality`` reads it.

The table references ``snapshots`` by a plain foreign key with ``ON DELETE CASCADE``: a date
has a handful of rows (none on clean prices), so the per-row check costs nothing (unlike the
snapshot's large tables, migration 0002). A snapshot published before this revision has no rows
and no ``max_zero_return_share`` in its ``params``: the query says its screen is not recorded.
New table only: nothing existing changes, downgrade drops it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

TABLE = "suspect_prices"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column(
            "snapshot_date",
            sa.Date,
            sa.ForeignKey("snapshots.snapshot_date", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("symbol", sa.Text(collation="C"), primary_key=True),
        sa.Column("zero_return_share", sa.Double, nullable=False),
        sa.Column("max_abs_return", sa.Double, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("dropped", sa.Boolean, nullable=False),
        sa.CheckConstraint(
            "zero_return_share >= 0 AND zero_return_share <= 1",
            name="ck_suspect_prices_zero_return_share",
        ),
        sa.CheckConstraint("max_abs_return >= 0", name="ck_suspect_prices_max_abs_return"),
    )


def downgrade() -> None:
    op.drop_table(TABLE)
