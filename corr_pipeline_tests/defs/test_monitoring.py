"""The freshness check on ``snapshot_publication`` and the run-failure sensor."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from pathlib import Path

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.definitions import defs
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.monitoring import (
    FRESHNESS_CHECK_NAME,
    PUBLICATION,
    build_publication_freshness_check,
    failure_line,
    snapshot_failure_sensor,
)
from corr_pipeline.defs.partitions import snapshot_partitions
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.sessions import get_calendar
from corr_pipeline_tests.fixtures.deployment import resources_at

XNYS = get_calendar("XNYS", dt.date(2024, 1, 1), dt.date(2026, 12, 31))
NY = zoneinfo.ZoneInfo("America/New_York")
CHECK_KEY = dg.AssetCheckKey(PUBLICATION, FRESHNESS_CHECK_NAME)


def _evaluate(instance: dg.DagsterInstance, now: dt.datetime) -> dg.AssetCheckEvaluation:
    check = build_publication_freshness_check(XNYS, clock=lambda: now)
    result = dg.materialize(
        [dg.AssetSpec(PUBLICATION, partitions_def=snapshot_partitions), check],
        instance=instance,
        selection=dg.AssetSelection.checks(check),
        resources={"postgres": PostgresResource(), "price_source": PriceSourceResource()},
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


#: Snapshot parameters small enough for a 30-symbol, 90-day universe.
SMALL = dict(
    lookback_days=60, min_history_days=40, min_overlap=30, max_lag=3, max_q_value=1.0,
    working_memory_mb=16,
)  # fmt: skip


def _publish(instance: dg.DagsterInstance, engine, store: Path, day: str) -> None:
    """Publish ``day`` for real: its prices, then a run of the snapshot assets."""
    write_synthetic_universe(engine, n_symbols=30, n_days=90, seed=11, end_date=day)
    resources = resources_at(store)
    resources["snapshot_params"] = SnapshotParams(**SMALL)
    result = dg.materialize(
        snapshot_assets, partition_key=day, resources=resources, instance=instance
    )
    assert result.success


def test_the_freshness_check_fails_past_the_deadline_and_passes_after_a_publication(
    clean_db, tmp_path
):
    instance = dg.DagsterInstance.ephemeral()
    # Tuesday 2025-06-10: close 16:00 + 90 min + 6 h = 23:30 New York
    before = _evaluate(instance, dt.datetime(2025, 6, 10, 23, 29, tzinfo=NY))
    assert before.metadata["expected_partition"].value == "2025-06-09"
    assert not before.passed and before.severity == dg.AssetCheckSeverity.ERROR

    late = _evaluate(instance, dt.datetime(2025, 6, 11, 1, 0, tzinfo=NY))
    assert not late.passed
    assert late.metadata["expected_partition"].value == "2025-06-10"
    assert late.metadata["dagster/overdue_seconds"].value == 5400
    assert "2025-06-10 has no publication 1.5 h after its deadline" in late.description

    # a materialization reported from the UI publishes nothing: the check still fails
    instance.report_runless_asset_event(
        dg.AssetMaterialization(PUBLICATION, partition="2025-06-10")
    )
    reported = _evaluate(instance, dt.datetime(2025, 6, 11, 1, 0, tzinfo=NY))
    assert not reported.passed and "2025-06-10 has no publication" in reported.description

    _publish(instance, clean_db, tmp_path / "store", "2025-06-10")
    fresh = _evaluate(instance, dt.datetime(2025, 6, 11, 1, 0, tzinfo=NY))
    assert fresh.passed and "published_at" in fresh.metadata
    # fresh until the next session's deadline (Wednesday 23:30 New York)
    until = fresh.metadata["dagster/fresh_until_timestamp"].value
    assert dt.datetime.fromtimestamp(until, NY) == dt.datetime(2025, 6, 11, 23, 30, tzinfo=NY)


def test_the_freshness_check_says_when_the_prices_end_before_the_session(clean_db):
    """A fresh demo: its synthetic prices end on Friday 2026-11-27 and the check runs days
    later. It fails as a warning (not red) and says why: no snapshot of the expected session
    can be built yet."""
    write_synthetic_universe(clean_db, n_symbols=20, n_days=30, seed=3, end_date="2026-11-27")
    instance = dg.DagsterInstance.ephemeral()
    instance.report_runless_asset_event(
        dg.AssetMaterialization(PUBLICATION, partition="2026-11-27")
    )
    evaluation = _evaluate(instance, dt.datetime(2026, 12, 3, 9, 0, tzinfo=NY))
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["expected_partition"].value == "2026-12-02"
    assert evaluation.metadata["last_trade_date"].value == "2026-11-27"
    assert "the prices end on 2026-11-27: no snapshot of 2026-12-02 can be built" in (
        evaluation.description
    )
    assert "did the night's run start" not in evaluation.description

    # prices of the session loaded, no publication: then the run is what is missing
    write_synthetic_universe(clean_db, n_symbols=20, n_days=30, seed=3, end_date="2026-12-02")
    evaluation = _evaluate(instance, dt.datetime(2026, 12, 3, 9, 0, tzinfo=NY))
    assert not evaluation.passed and "did the night's run start" in evaluation.description
    assert evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.metadata["last_trade_date"].value == "2026-12-02"


def test_a_holiday_expects_the_session_before_it(clean_db):
    instance = dg.DagsterInstance.ephemeral()
    # 2025-07-04 is a holiday: late that night the latest session is still July 3rd
    evaluation = _evaluate(instance, dt.datetime(2025, 7, 4, 23, 45, tzinfo=NY))
    assert evaluation.metadata["expected_partition"].value == "2025-07-03"


def test_the_freshness_check_fails_when_the_database_cannot_be_read(monkeypatch):
    monkeypatch.setenv(settings.ENV_DATABASE_URL, "postgresql://u:pw-x@127.0.0.1:1/none")
    evaluation = _evaluate(
        dg.DagsterInstance.ephemeral(), dt.datetime(2025, 6, 11, 1, 0, tzinfo=NY)
    )
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert "cannot tell whether session 2025-06-10 is published" in evaluation.description
    assert "pw-x" not in evaluation.description


def test_the_freshness_sensor_requests_the_check_then_waits_for_a_publication(clean_db):
    from corr_pipeline.defs.monitoring import publication_freshness_sensor

    instance = dg.DagsterInstance.ephemeral()

    def tick():
        with dg.build_sensor_context(instance=instance) as context:
            return publication_freshness_sensor(context)

    request = tick()
    assert isinstance(request, dg.RunRequest) and request.asset_check_keys == [CHECK_KEY]
    _evaluate(instance, dt.datetime(2025, 6, 11, 1, 0, tzinfo=NY))  # fails: nothing published
    assert "waiting for a publication" in tick().skip_message
    instance.report_runless_asset_event(
        dg.AssetMaterialization(PUBLICATION, partition="2025-06-10")
    )
    assert isinstance(tick(), dg.RunRequest)


def test_the_monitoring_definitions_are_registered():
    assert defs.resolve_sensor_def("publication_freshness_sensor")
    assert defs.resolve_sensor_def("snapshot_failure_sensor")
    job = defs.resolve_job_def("snapshot_job")
    assert CHECK_KEY in defs.get_repository_def().asset_graph.asset_check_keys
    assert CHECK_KEY not in job.asset_layer.asset_graph.asset_check_keys  # about the latest day


def test_the_failure_sensor_writes_one_line_from_a_real_failed_run(clean_db, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        snapshot_assets,
        partition_key="2025-06-10",
        resources=resources_at(tmp_path / "store"),
        instance=instance,
        raise_on_error=False,
        selection=dg.AssetSelection.assets("returns_matrix"),
    )
    assert not result.success  # no prices: no window
    run = instance.get_run_by_id(result.run_id)
    (record,) = instance.get_records_for_run(
        result.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
    ).records
    context = dg.build_run_status_sensor_context(
        sensor_name="snapshot_failure_sensor",
        dagster_event=record.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=run,
    ).for_run_failure()
    line = failure_line(context)
    assert line.startswith(f"snapshot run {result.run_id[:8]} failed: partition 2025-06-10, ")
    assert "step snapshot: returns_matrix 2025-06-10 failed: WindowError: no prices" in line
    assert "\n" not in line and "dagster._core" not in line
    print(line)
    snapshot_failure_sensor(context)  # logs it, calls the (empty) hook
