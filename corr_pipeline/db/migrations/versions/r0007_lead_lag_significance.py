"""lead_lag_pairs carries each pair's significance: p_value and q_value.

``lead_lag_pairs.p_value`` and ``q_value`` (``double precision``, NULL), SPEC §6
"Significance": for the pair's best lag ``ℓ*`` with correlation ``r`` over ``n`` rows,
``z = atanh(r) · sqrt(n − 3)``, ``p = erfc(|z| / √2)`` (two-sided, white-noise null) and
``p_value = 1 − (1 − p)^max_lag`` (Šidák over the lags tried); ``q_value`` is the
Benjamini–Hochberg adjusted p-value over all ``m`` ordered pairs that have a best lag,
``q_(k) = min over l >= k of p_(l) · m / l``, capped at 1 (so ``p_value <= q_value <= 1``).
Double precision: the p-values of strong pairs are far below float32's smallest normal number.
NULL for snapshots published before this revision (their significance was not computed).

``ADD COLUMN IF NOT EXISTS``: a development database may already have them.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("p_value", "q_value")


def upgrade() -> None:
    for column in COLUMNS:
        op.execute(
            sa.text(
                f"ALTER TABLE lead_lag_pairs ADD COLUMN IF NOT EXISTS {column} double precision NULL"
            )
        )


def downgrade() -> None:
    for column in COLUMNS:
        op.drop_column("lead_lag_pairs", column)
