"""Fixtures of the Dagster tests."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corr_pipeline.db.synth import SynthReport, write_synthetic_universe
from corr_pipeline_tests.fixtures.pipeline import LAST, N_DAYS, N_SYMBOLS, SEED


@pytest.fixture
def universe(clean_db: sa.Engine) -> SynthReport:
    """Empty tables, then the synthetic universe (about a second). Function-scoped on purpose:
    with pytest-xdist, tests of other modules (which empty the tables) may run in between."""
    report = write_synthetic_universe(clean_db, n_symbols=N_SYMBOLS, n_days=N_DAYS, seed=SEED)
    assert str(report.last_date) == LAST
    return report
