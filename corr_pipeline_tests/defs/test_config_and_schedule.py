"""Snapshot parameters, partitions and the nightly schedule (no database needed)."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
from pydantic import ValidationError

from corr_pipeline import settings
from corr_pipeline.defs import partitions
from corr_pipeline.defs.jobs import (
    build_nightly_schedule,
    nightly_partition_key,
    nightly_snapshot_schedule,
    snapshot_job,
    snapshot_run_tags,
)
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.sessions import get_calendar

#: The ``weekdays`` calendar (CORR_PIPELINE_CALENDAR=weekdays): the behaviour before exchange
#: calendars, which the schedule tests below pin (the default is now XNYS, tested in
#: test_calendar.py).
WEEKDAYS = get_calendar("weekdays", dt.date(2019, 1, 1), dt.date(2028, 12, 31))
weekday_schedule = build_nightly_schedule(WEEKDAYS)
weekday_partitions = partitions.build_partitions_def(calendar=WEEKDAYS)


def test_defaults_are_consistent_and_recorded():
    params = SnapshotParams()
    recorded = params.as_dict()
    assert recorded["lookback_days"] == 252
    assert recorded["min_overlap"] <= recorded["min_history_days"] <= recorded["lookback_days"]
    assert recorded["max_lag"] < recorded["lookback_days"]
    assert (recorded["distance_threshold"] is None) != (recorded["n_clusters"] is None)
    # significant lead-lag of market residuals (SPEC §6 "Defaults")
    assert recorded["lead_lag_market_modes"] == 1 and recorded["max_q_value"] == 0.05


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"min_overlap": 200}, "min_overlap"),
        ({"min_history_days": 300}, "min_history_days"),
        ({"max_lag": 252}, "max_lag"),
        ({"max_lag": 0}, "max_lag"),
        ({"k_neighbors": 0}, "k_neighbors"),
        ({"k_leaders": 0}, "k_leaders"),
        ({"k_laggers": -1}, "k_laggers"),
        ({"lookback_days": 1, "min_history_days": 1, "min_overlap": 2}, "lookback_days"),
        ({"linkage_method": "ward"}, "linkage_method"),
        ({"n_clusters": 20}, "distance_threshold / n_clusters"),
        ({"distance_threshold": None}, "distance_threshold / n_clusters"),
        ({"distance_threshold": -0.5}, "distance_threshold"),
        ({"distance_threshold": None, "n_clusters": 0}, "n_clusters"),
        ({"working_memory_mb": 0}, "working_memory_mb"),
        (
            {"lookback_days": 100, "max_lag": 50, "min_overlap": 60, "min_history_days": 80},
            "max_lag",
        ),
        ({"max_q_value": 0.0}, "max_q_value"),
        ({"max_q_value": 1.5}, "max_q_value"),
        ({"lead_lag_market_modes": -1}, "lead_lag_market_modes"),
        ({"lead_lag_market_modes": 11}, "lead_lag_market_modes"),
    ],
)
def test_inconsistent_parameters_name_the_field(overrides, field):
    with pytest.raises(ValidationError) as err:
        SnapshotParams(**overrides)
    assert field in str(err.value)


def test_run_config_override_fails_before_any_asset_body_runs():
    ran = []

    @dg.asset
    def probe(snapshot_params: SnapshotParams) -> None:
        ran.append(snapshot_params.min_overlap)

    result = dg.materialize(
        [probe],
        resources={"snapshot_params": SnapshotParams()},
        run_config={"resources": {"snapshot_params": {"config": {"min_overlap": 500}}}},
        raise_on_error=False,
    )
    assert not result.success
    assert ran == []
    failures = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    assert failures, "the resource must fail at initialisation"
    assert "min_overlap (500) must be <= min_history_days" in str(failures[0].event_specific_data)


def test_partitions_are_weekdays_from_the_configured_start(monkeypatch):
    monkeypatch.setenv(settings.ENV_PARTITION_START, "2024-03-01")
    part = partitions.build_partitions_def()
    keys = part.get_partition_keys(current_time=dt.datetime(2024, 3, 13, 12, tzinfo=dt.UTC))
    assert keys[0] == "2024-03-01"
    assert "2024-03-02" not in keys and "2024-03-03" not in keys  # weekend
    assert keys[-1] == "2024-03-13"  # today's partition exists (end_offset=1)
    assert all(dt.date.fromisoformat(k).weekday() < 5 for k in keys)
    assert len(keys) == 9


def test_bad_partition_start_names_the_variable(monkeypatch):
    monkeypatch.setenv(settings.ENV_PARTITION_START, "03/01/2024")
    with pytest.raises(ValueError, match=settings.ENV_PARTITION_START):
        settings.partition_start()


def test_partition_key_helpers():
    assert partitions.partition_key_for(dt.date(2024, 3, 9)) == "2024-03-08"  # Saturday
    assert partitions.partition_key_for(dt.date(2024, 3, 11)) == "2024-03-11"
    assert partitions.previous_weekday(dt.date(2024, 3, 11)) == dt.date(2024, 3, 8)
    assert partitions.snapshot_date("2024-03-08") == dt.date(2024, 3, 8)
    with pytest.raises(ValueError, match="not a snapshot date"):
        partitions.snapshot_date("20240308")


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        (dt.datetime(2026, 11, 23, 6, 30, tzinfo=dt.UTC), "2026-11-20"),  # Monday -> Friday
        (dt.datetime(2026, 11, 24, 6, 30, tzinfo=dt.UTC), "2026-11-23"),  # Tuesday -> Monday
        (dt.datetime(2026, 11, 27, 6, 30, tzinfo=dt.UTC), "2026-11-26"),  # Friday -> Thursday
    ],
)
def test_nightly_schedule_requests_the_previous_session(tick, expected):
    # under CORR_PIPELINE_CALENDAR=weekdays (was: the default); same assertions
    assert nightly_partition_key(tick, WEEKDAYS) == expected
    context = dg.build_schedule_context(scheduled_execution_time=tick)
    request = weekday_schedule(context)
    assert isinstance(request, dg.RunRequest)
    assert request.partition_key == expected
    assert request.run_key == expected
    assert expected in weekday_partitions.get_partition_keys(current_time=tick)


@pytest.mark.parametrize(
    "schedule", [nightly_snapshot_schedule, weekday_schedule], ids=["XNYS", "weekdays"]
)
def test_nightly_schedule_skips_before_the_first_partition(schedule):
    tick = dt.datetime(2019, 6, 4, 6, 30, tzinfo=dt.UTC)
    result = schedule(dg.build_schedule_context(scheduled_execution_time=tick))
    assert isinstance(result, dg.SkipReason)
    assert "before the first partition" in result.skip_message


def test_schedule_cron_is_weekdays_and_job_tags_carry_the_max_runtime():
    assert weekday_schedule.cron_schedule == "30 6 * * 1-5"  # under weekdays (was: the default)
    assert weekday_schedule.execution_timezone == "UTC"
    tags = snapshot_run_tags()
    assert int(tags[dg.MAX_RUNTIME_SECONDS_TAG]) > 0
    assert snapshot_job.tags == tags


def test_max_runtime_override(monkeypatch):
    monkeypatch.setenv("CORR_PIPELINE_MAX_RUNTIME_SECONDS", "900")
    assert snapshot_run_tags()[dg.MAX_RUNTIME_SECONDS_TAG] == "900"
    monkeypatch.setenv("CORR_PIPELINE_MAX_RUNTIME_SECONDS", "soon")
    with pytest.raises(ValueError, match="CORR_PIPELINE_MAX_RUNTIME_SECONDS"):
        snapshot_run_tags()


def test_every_run_has_a_maximum_runtime_however_launched(tmp_path, monkeypatch):
    """Runs launched from the asset graph carry no job tags: the instance's run monitoring
    (dagster.yaml) bounds them too, at the same 4 h as snapshot_job's default tag."""
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[2] / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    instance = dg.DagsterInstance.get()
    try:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_runtime_seconds == settings.DEFAULT_MAX_RUNTIME_SECONDS
    finally:
        instance.dispose()
