"""The snapshot op accounts for every selected check: its run log holds each session's check
evaluations and no complaint from Dagster that the op "did not yield or return expected
outputs", with the synthetic ground truth (nine checks evaluated) and without it
(``injected_pairs_found`` not evaluated), for one session and for a range of sessions."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.runs import RANGE_END_TAG, RANGE_START_TAG
from corr_pipeline.defs.specs import snapshot_check_specs
from corr_pipeline_tests.fixtures.deployment import resources_at
from corr_pipeline_tests.fixtures.pipeline import FORTY_DAYS

LAST = "2026-11-27"  # the synthetic universe's last trade date (a Friday)
PARAMS = {**FORTY_DAYS, "max_q_value": 0.05, "working_memory_mb": 16}


def _run(
    store: Path, partition_key: str | None = None, tags: dict[str, str] | None = None
) -> tuple[dg.ExecuteInProcessResult, list[str]]:
    """Materialize the snapshot assets (one partition, or the range of ``tags``) on an ephemeral
    instance; the result and every message of the run's log."""
    resources = resources_at(store)
    resources["snapshot_params"] = SnapshotParams(**PARAMS)
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            snapshot_assets,
            instance=instance,
            resources=resources,
            partition_key=partition_key,
            tags=tags,
            raise_on_error=False,
        )
        messages = [entry.message for entry in instance.all_logs(result.run_id)]
    return result, messages


def _evaluations(result: dg.ExecuteInProcessResult) -> list[tuple[str, str | None]]:
    return sorted(
        (e.event_specific_data.check_name, e.event_specific_data.partition)
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    )


@pytest.mark.parametrize("truth", [True, False], ids=["synthetic-truth", "no-truth"])
def test_every_check_is_accounted_for(clean_db: sa.Engine, tmp_path: Path, truth: bool) -> None:
    write_synthetic_universe(clean_db, n_symbols=60, n_days=60, seed=5)
    if not truth:
        with clean_db.begin() as conn:
            conn.execute(sa.text("DELETE FROM synthetic.lead_lag_truth"))
    result, messages = _run(tmp_path / "store", partition_key=LAST)
    assert result.success
    names = sorted(spec.name for spec in snapshot_check_specs())
    expected = [n for n in names if truth or n != "injected_pairs_found"]
    assert _evaluations(result) == [(name, LAST) for name in expected]
    assert not [m for m in messages if "did not yield" in m], messages


def test_a_range_run_accounts_for_every_check(clean_db: sa.Engine, tmp_path: Path) -> None:
    write_synthetic_universe(clean_db, n_symbols=60, n_days=60, seed=5)
    tags = {RANGE_START_TAG: "2026-11-24", RANGE_END_TAG: LAST}
    result, messages = _run(tmp_path / "store", tags=tags)
    assert result.success
    sessions = ("2026-11-24", "2026-11-25", LAST)  # 2026-11-26: Thanksgiving, no session
    names = sorted(spec.name for spec in snapshot_check_specs())
    assert _evaluations(result) == sorted((n, s) for n in names for s in sessions)
    assert not [m for m in messages if "did not yield" in m], messages
