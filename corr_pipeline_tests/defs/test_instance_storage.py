"""The project's instance (``dagster.yaml``'s ``instance_class``) records exactly what Dagster's own
SQLite storage records, keeps its databases open, and stays usable across processes.

The same runs (a range of partitions reported session by session, as the snapshot op reports
them, in batches of materializations and check evaluations; a single partition; a failed run) go
to two instances: one with the repository's
``dagster.yaml`` (:class:`~corr_pipeline.defs.instance_storage.SnapshotInstance`, the pooled
event log) and one with Dagster's default storage; every run's event log (types, steps,
partitions, metadata, in order) and the cross-run asset queries (materialized partitions, the
latest materialization of each partition, planned materializations, check executions, failed
partitions) must be the same. Then: a watcher of a run (how the UI streams a run's events) is
told of events another process writes; a child forked from a process with open databases writes
its own events; a ``storage`` entry in ``dagster.yaml`` still replaces the default.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType

from corr_pipeline.defs import ranges
from corr_pipeline.defs.instance_storage import PooledSqliteEventLogStorage, SnapshotInstance
from corr_pipeline.defs.run import REPO_DAGSTER_YAML

DAYS = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-20")
RANGE = {"dagster/asset_partition_range_start": "2024-01-02"}
FAIL_ON = "2024-01-04"


@dg.multi_asset(
    specs=[
        dg.AssetSpec("prices_seen", skippable=True),
        dg.AssetSpec("stats", deps=["prices_seen"], skippable=True),
    ],
    check_specs=[dg.AssetCheckSpec("stats_ok", asset="stats")],
    partitions_def=DAYS,
    backfill_policy=dg.BackfillPolicy.multi_run(10),
    can_subset=True,
)
def per_day(context):
    """Each partition reported as the snapshot op reports a session (one batch of events:
    materializations, then check evaluations); the configured day fails, the others pass."""
    failing = context.run.tags.get("fail_on")
    checks = {dg.AssetCheckKey(dg.AssetKey("stats"), "stats_ok")}
    for key in sorted(context.partition_keys):
        if key == failing:
            continue
        results = {
            asset: ranges.SessionResult(None, {"day": key, "n": 3})
            for asset in ("prices_seen", "stats")
        }
        results["stats"].checks = [
            dg.AssetCheckResult(
                asset_key="stats", check_name="stats_ok", passed=key != "2024-01-03"
            )
        ]
        yield from ranges.session_events(
            context, key, results, selected_checks=checks, blocking={"stats_ok": False}
        )
    if failing in context.partition_keys:
        raise dg.Failure(f"{failing} failed")


@dg.asset(partitions_def=DAYS)
def plain(context) -> int:
    context.log.info(f"plain {context.partition_key}")
    return 1


@dg.asset(partitions_def=DAYS)
def slow(context) -> int:
    """Ends two seconds after its run started, long after its run's database was created."""
    time.sleep(2)
    return 1


def _instance(home: Path, config: str | None) -> dg.DagsterInstance:
    home.mkdir(parents=True, exist_ok=True)
    if config is None:
        shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text(config)
    return dg.DagsterInstance.from_config(str(home))


def _runs(instance: dg.DagsterInstance) -> None:
    range_tags = {**RANGE, "dagster/asset_partition_range_end": "2024-01-06"}
    assert dg.materialize([per_day], instance=instance, tags=range_tags).success
    failed = dg.materialize(
        [per_day],
        instance=instance,
        tags={**range_tags, "fail_on": FAIL_ON},
        raise_on_error=False,
    )
    assert not failed.success
    assert dg.materialize([plain], instance=instance, partition_key="2024-01-03").success


def _comparable(instance: dg.DagsterInstance) -> dict:
    """What the two storages must agree on (run ids and timestamps aside)."""
    runs = list(reversed(instance.get_runs()))  # oldest first
    logs = []
    for run in runs:
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            data = event.event_specific_data
            item = (event.event_type_value, event.step_key, str(getattr(event, "asset_key", "")))
            materialization = getattr(data, "materialization", None)
            if materialization is not None:
                item += (materialization.partition, sorted(materialization.metadata))
            logs.append(item)
    assets = {}
    for key in (dg.AssetKey("prices_seen"), dg.AssetKey("stats"), dg.AssetKey("plain")):
        latest = instance.get_latest_materialization_event(key)
        assets[key.to_user_string()] = (
            sorted(instance.get_materialized_partitions(key)),
            None if latest is None else latest.asset_materialization.partition,
        )
    planned = instance.get_records_for_run(
        runs[0].run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    checks = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("stats"), "stats_ok"), limit=100
    )
    attempts = instance.event_log_storage.get_latest_asset_partition_materialization_attempts_without_materializations(
        dg.AssetKey("stats")
    )
    return {
        "unmaterialized_attempts": sorted(attempts),
        "statuses": [r.status for r in runs],
        "logs": logs,
        "assets": assets,
        "planned": sorted(
            (str(r.event_log_entry.dagster_event.asset_key), r.partition_key) for r in planned
        ),
        "checks": sorted((c.partition, c.status.value) for c in checks),
    }


def test_the_pooled_event_log_records_what_dagsters_own_records(tmp_path):
    with _instance(tmp_path / "project", None) as pooled:
        assert isinstance(pooled, SnapshotInstance)
        assert isinstance(pooled.event_log_storage, PooledSqliteEventLogStorage)
        _runs(pooled)
        got = _comparable(pooled)
    with _instance(tmp_path / "dagster", "telemetry:\n  enabled: false\n") as stock:
        assert type(stock.event_log_storage).__name__ == "SqliteEventLogStorage"
        _runs(stock)
        expected = _comparable(stock)
    assert got == expected
    assert got["assets"]["stats"][0] == [f"2024-01-0{d}" for d in range(2, 7)]
    assert "ASSET_MATERIALIZATION_PLANNED" in {item[0] for item in got["logs"]}
    assert got["unmaterialized_attempts"] == [FAIL_ON]  # planned by the failed run, not done
    # reopened: the same records from the files
    with _instance(tmp_path / "project", None) as again:
        assert _comparable(again) == got


WRITER = """
import sys, time, dagster as dg
from pathlib import Path
sys.path.insert(0, {tests!r})
from corr_pipeline_tests.defs.test_instance_storage import slow
job = dg.Definitions(assets=[slow], jobs=[dg.define_asset_job("slow_job", [slow])]).resolve_job_def(
    "slow_job"
)
with dg.DagsterInstance.from_config({home!r}) as instance:
    run = job.execute_in_process(instance=instance, partition_key="2024-01-05", run_id={run_id!r})
    assert run.success
    deadline = time.monotonic() + 60  # the instance stays open (its databases too) until told
    while not Path({release!r}).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_a_watcher_sees_the_events_another_process_writes(tmp_path):
    """How the UI streams a run in progress: Dagster's SQLite event log wakes its watchers when
    the run's database file changes. The writer keeps its databases open (as a run worker does
    while its run goes on) until the watcher has seen the run end."""
    home = tmp_path / "project"
    release = tmp_path / "release"
    with _instance(home, None) as instance:
        run_id = "0f0e0d0c-0b0a-4909-8807-060504030201"
        seen: list[str] = []
        done = threading.Event()

        def callback(entry, _cursor):
            seen.append(entry.dagster_event_type.value if entry.dagster_event else "log")
            if entry.dagster_event_type == DagsterEventType.RUN_SUCCESS:
                done.set()

        instance.watch_event_logs(run_id, None, callback)
        code = WRITER.format(
            tests=str(Path(__file__).resolve().parents[2]),
            home=str(home),
            run_id=run_id,
            release=str(release),
        )
        writer = subprocess.Popen([sys.executable, "-c", code])
        try:
            assert done.wait(45), f"the watcher saw {seen}"
        finally:
            release.touch()
            assert writer.wait(120) == 0
        assert "ASSET_MATERIALIZATION" in seen


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_writes_through_its_own_connections(tmp_path):
    home = tmp_path / "project"
    with _instance(home, None) as instance:
        assert dg.materialize([plain], instance=instance, partition_key="2024-01-02").success
        storage = instance.event_log_storage
        assert isinstance(storage, PooledSqliteEventLogStorage)
        assert "index" in storage.open_databases
        pid = os.fork()
        if pid == 0:  # the child: SQLite connections must not cross a fork
            try:
                if storage.open_databases:
                    os._exit(3)
                ok = dg.materialize([plain], instance=instance, partition_key="2024-01-03").success
                os._exit(0 if ok else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, "3: the child held the parent's databases"
        assert dg.materialize([plain], instance=instance, partition_key="2024-01-04").success
        time.sleep(0.1)
        partitions = instance.get_materialized_partitions(dg.AssetKey("plain"))
    assert partitions == {"2024-01-02", "2024-01-03", "2024-01-04"}


def test_a_storage_entry_replaces_the_default(tmp_path):
    config = REPO_DAGSTER_YAML.read_text() + (
        f"\nstorage:\n  sqlite:\n    base_dir: {tmp_path / 'elsewhere'}\n"
    )
    with _instance(tmp_path / "project", config) as instance:
        assert isinstance(instance, SnapshotInstance)
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
