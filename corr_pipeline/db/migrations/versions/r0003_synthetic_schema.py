"""The synthetic ground truth moves to its own schema: synthetic.lead_lag_truth.

The synthetic ground truth leaves the production tables: ``synthetic_lead_lag_truth`` becomes
``synthetic.lead_lag_truth`` (its own PostgreSQL schema), rows kept as they are.

The injected lead-lag pairs belong to the synthetic universe (``corr-pipeline prices synth``,
the demo, the tests), not to the published snapshot: a production database simply has an
empty ``synthetic`` schema. ``ALTER TABLE ... SET SCHEMA`` moves the table with its rows, so
nothing is copied. Downgrade moves it back (the schema is dropped only if nothing else lives in
it).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.execute(sa.text("CREATE SCHEMA IF NOT EXISTS synthetic"))
    op.execute(sa.text("ALTER TABLE synthetic_lead_lag_truth SET SCHEMA synthetic"))
    op.execute(sa.text("ALTER TABLE synthetic.synthetic_lead_lag_truth RENAME TO lead_lag_truth"))
    op.execute(
        sa.text(
            "ALTER TABLE synthetic.lead_lag_truth "
            "RENAME CONSTRAINT synthetic_lead_lag_truth_pkey TO lead_lag_truth_pkey"
        )
    )


def downgrade() -> None:
    op.execute(
        sa.text(
            "ALTER TABLE synthetic.lead_lag_truth "
            "RENAME CONSTRAINT lead_lag_truth_pkey TO synthetic_lead_lag_truth_pkey"
        )
    )
    op.execute(sa.text("ALTER TABLE synthetic.lead_lag_truth RENAME TO synthetic_lead_lag_truth"))
    # back where 0001 created it: the first schema of the search path (that of the version table)
    home = op.get_bind().execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    op.execute(sa.text(f"ALTER TABLE synthetic.synthetic_lead_lag_truth SET SCHEMA {home}"))
    op.execute(sa.text("DROP SCHEMA synthetic"))
