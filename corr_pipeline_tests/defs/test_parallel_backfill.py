"""A backfill of 10 sessions with a limit of 2 snapshot runs at once, through the real run queue:
the repository's ``dagster.yaml`` on a fresh instance, the limit stored by
:func:`corr_pipeline.defs.concurrency.set_snapshot_runs_limit`, a ``dagster-daemon run``
subprocess on ``workspace.yaml`` (its queued-run coordinator dequeues, the default run launcher
starts each run in its own process through the daemon's code server), and the backfill
created the way ``dagster job backfill`` creates it (a ``PartitionBackfill``, one queued run
per partition with its ``dagster/partition`` and ``dagster/backfill`` tags).

Proved from the instance's own timestamps: the runs of the 10 partitions overlapped two at a
time and never more (counted both from their launch, the ``RUN_STARTING`` event, and from their
execution, ``start_time``, to their end); then the published rows of the 10 dates equal, row by
row, what 10 serial runs of the same partitions publish, and so do their changes (SPEC §10):
every session after the first compared with the session before it and current, although the
runs finished in any order (a run's ``snapshot_changes`` recomputes the next session's changes
when they were computed before its own session was published, and a change set that became
stale while it was computed is refused at publication and computed again).

The runs use the in-process executor (run config of the backfill, as a team may set it): the
limits concern whole runs, and each run's worker process starting up dominates a small run
already; the multiprocess executor in a backfill is tested by ``test_pipeline.py``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.execution.job_backfill import create_backfill_run
from dagster._core.utils import make_new_backfill_id
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from corr_pipeline import settings
from corr_pipeline.db.published_reads import change_staleness
from corr_pipeline.db.schema import CHANGE_TABLES, PUBLISHED_TABLES
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.defs.concurrency import set_snapshot_runs_limit
from corr_pipeline.defs.partitions import snapshot_partitions
from corr_pipeline.defs.run import REPO_DAGSTER_YAML, materialize_snapshot
from corr_pipeline.defs.step_options import SNAPSHOT_GROUP
from corr_pipeline_tests.fixtures.deployment import use_store
from corr_pipeline_tests.fixtures.runs import launched_at, max_overlap, stop
from corr_pipeline_tests.reliability import helpers as h

pytestmark = pytest.mark.slow  # the daemon and job backfills: outside `pytest -m "not slow"`

REPO = REPO_DAGSTER_YAML.parent
LIMIT = 2
FIRST, LAST = "2026-11-13", "2026-11-27"  # 10 XNYS sessions (2026-11-26 is Thanksgiving)
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
RUNS_TIMEOUT_S = 600.0  # a bound for a stuck queue, not a speed target


def _sessions() -> list[str]:
    keys = snapshot_partitions.get_partition_keys()
    return keys[keys.index(FIRST) : keys.index(LAST) + 1]


def _submit_backfill(instance: dg.DagsterInstance, partitions: list[str]) -> str:
    """What ``dagster job backfill -j snapshot_job --partitions ...`` does (dagster's
    ``execute_backfill_command``), with ``IN_PROCESS`` merged into each run's config."""
    target = WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
    with WorkspaceProcessContext(instance, target) as process_context:
        context = process_context.create_request_context()
        location = context.get_code_location("corr_pipeline")
        repo = location.get_repository("__repository__")
        job = repo.get_full_job("snapshot_job")
        partition_set = next(p for p in repo.get_partition_sets() if p.job_name == job.name)
        backfill = PartitionBackfill(
            backfill_id=make_new_backfill_id(),
            partition_set_origin=partition_set.get_remote_origin(),
            status=BulkActionStatus.REQUESTED,
            partition_names=partitions,
            from_failure=False,
            reexecution_steps=None,
            tags={},
            backfill_timestamp=time.time(),
        )
        params = location.get_partition_set_execution_params(
            repository_handle=repo.handle,
            partition_set_name=partition_set.name,
            partition_names=partitions,
            instance=instance,
        )
        for data in params.partition_data:  # type: ignore[union-attr]
            run = create_backfill_run(
                context,
                instance,
                location,
                job,
                partition_set,
                backfill,
                data.name,
                data.tags,
                {**(data.run_config or {}), **IN_PROCESS},
            )
            assert run is not None
            instance.submit_run(run.run_id, context)
        instance.add_backfill(
            backfill.with_status(BulkActionStatus.COMPLETED).with_end_timestamp(time.time())
        )
        return backfill.backfill_id


def _start_daemon(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-daemon"),
                *("run", "-w", str(REPO / "workspace.yaml")),
            ],
            cwd=log.parent,  # not the checkout, whose .env Dagster's commands would apply
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the code server and runs with it
        )


@contextlib.contextmanager
def _daemon(database_url: str, tmp_path: Path) -> Iterator[tuple[dg.DagsterInstance, Callable]]:
    """A fresh instance (the repository's ``dagster.yaml``, the snapshot runs limit of
    :data:`LIMIT`) with a ``dagster-daemon run`` on it; yields the instance and ``waiting(what)``,
    which sleeps a second after checking that the daemon runs and the time bound holds."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes(REPO_DAGSTER_YAML.read_bytes())
    env = h.child_env(
        DAGSTER_HOME=str(home),
        **{
            settings.ENV_DATABASE_URL: database_url,
            settings.ENV_STORE_DIR: str(tmp_path / "store"),
        },
    )
    instance = dg.DagsterInstance.from_config(str(home))
    log = tmp_path / "daemon.log"
    daemon = _start_daemon(env, log)
    deadline = time.monotonic() + RUNS_TIMEOUT_S

    def waiting(what: object) -> None:
        assert daemon.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, what
        time.sleep(1.0)

    try:
        set_snapshot_runs_limit(instance, LIMIT)
        yield instance, waiting
    finally:
        stop(daemon)


def _published(engine: sa.Engine, days: list[str]) -> dict[str, Any]:
    return {day: h.snapshot_rows(engine, day) for day in days}


def _changes(engine: sa.Engine, days: list[str]) -> dict[str, Any]:
    """Every change row of ``days`` (sorted), without the timestamps of the publications
    compared, which differ between two runs that publish the same changes; and per date the
    reasons its change set is stale (none expected)."""
    ignored = {"created_at", "snapshot_published_at", "previous_published_at"}
    out: dict[str, Any] = {}
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        for day in days:
            for table in CHANGE_TABLES:
                rows = conn.execute(
                    sa.text(f"SELECT * FROM {table} WHERE snapshot_date = :d"), {"d": day}
                ).mappings()
                out[day, table] = sorted(
                    repr(sorted((k, v) for k, v in row.items() if k not in ignored)) for row in rows
                )
            summary = (
                conn.execute(
                    sa.text("SELECT * FROM change_summaries WHERE snapshot_date = :d"), {"d": day}
                )
                .mappings()
                .one_or_none()
            )
            out[day, "stale"] = None if summary is None else change_staleness(conn, summary)
            out[day, "previous"] = None if summary is None else str(summary["previous_date"])
    return out


def test_backfill_runs_two_at_a_time_and_publishes_what_serial_runs_publish(
    clean_db, database_url, tmp_path
):
    sessions = _sessions()
    assert len(sessions) == 10, sessions
    write_synthetic_universe(clean_db, n_symbols=40, n_days=300, seed=7, end_date=LAST)
    with _daemon(database_url, tmp_path) as (instance, waiting):
        backfill_id = _submit_backfill(instance, sessions)
        while True:
            runs = instance.get_runs(filters=dg.RunsFilter.for_backfill(backfill_id))
            if len(runs) == len(sessions) and all(r.status in FINISHED for r in runs):
                break
            waiting([(r.tags["dagster/partition"], r.status) for r in runs])
    records = instance.get_run_records(filters=dg.RunsFilter.for_backfill(backfill_id))
    by_partition = {r.dagster_run.tags["dagster/partition"]: r for r in records}
    assert sorted(by_partition) == sessions  # one run per session
    failed = [
        k for k, r in by_partition.items() if r.dagster_run.status != dg.DagsterRunStatus.SUCCESS
    ]
    assert not failed, (failed, (tmp_path / "daemon.log").read_text()[-3000:])
    executing = [(r.start_time, r.end_time) for r in records]
    launched = [(launched_at(instance, r.dagster_run.run_id), r.end_time) for r in records]
    assert all(a is not None and b is not None and a < b for a, b in executing)
    t0 = min(a for a, _ in launched)
    for record, (go, end) in sorted(zip(records, launched, strict=True), key=lambda p: p[1]):
        print(  # the timeline, with pytest -s
            f"{record.dagster_run.tags['dagster/partition']}: launched {go - t0:6.1f} s, "
            f"ran {record.start_time - t0:6.1f} .. {end - t0:6.1f} s"
        )
    assert max_overlap(launched) == LIMIT  # the queue held the others back
    assert max_overlap(executing) == LIMIT  # and two ran at the same time
    instance.dispose()

    parallel = _published(clean_db, sessions)
    assert all(len(rows["symbol_clusters"]) > 0 for rows in parallel.values())
    parallel_changes = _changes(clean_db, sessions)
    assert parallel_changes[sessions[0], "previous"] is None  # nothing published before it
    for before, day in zip(sessions, sessions[1:], strict=False):
        assert parallel_changes[day, "previous"] == before, day
        assert parallel_changes[day, "stale"] == [], day
    with clean_db.begin() as conn:  # the children follow (trigger cascade)
        conn.execute(
            sa.text("DELETE FROM snapshots WHERE snapshot_date = ANY(:d)"), {"d": sessions}
        )
    assert all(n == 0 for day in sessions for n in h.snapshot_counts(clean_db, day).values())
    serial_instance = dg.DagsterInstance.ephemeral()
    use_store(tmp_path / "serial_store")
    for day in sessions:
        summary = materialize_snapshot(day, instance=serial_instance, in_process=True)
        assert summary.success, summary
    serial_instance.dispose()
    serial = _published(clean_db, sessions)
    for day in sessions:
        for table in PUBLISHED_TABLES:
            assert serial[day][table] == parallel[day][table], (day, table)
    assert _changes(clean_db, sessions) == parallel_changes


def _submit_asset_backfill(instance: dg.DagsterInstance, partitions: list[str]) -> str:
    """What the UI's "Materialize" over a partition range does: a pure asset backfill of the
    snapshot group (``launchPartitionBackfill`` with an asset selection), run by the daemon's
    backfill loop in the order of the asset graph's partition mappings."""
    target = WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
    with WorkspaceProcessContext(instance, target) as process_context:
        context = process_context.create_request_context()
        graph = context.asset_graph
        selection = [
            key
            for key in graph.get_all_asset_keys()
            if graph.get(key).group_name == SNAPSHOT_GROUP and graph.get(key).is_materializable
        ]
        backfill = PartitionBackfill.from_asset_partitions(
            backfill_id=make_new_backfill_id(),
            asset_graph=graph,
            partition_names=partitions,
            asset_selection=selection,
            backfill_timestamp=time.time(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title=None,
            description=None,
            run_config=IN_PROCESS,
        )
        instance.add_backfill(backfill)
        return backfill.backfill_id


def _materialized(instance: dg.DagsterInstance, asset: str, partition: str) -> tuple[float, str]:
    """When the materialization of ``asset`` for ``partition`` was stored, and by which run."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    assert len(records) == 1, (asset, partition)
    return records[0].timestamp, records[0].run_id


def test_asset_backfill_holds_each_sessions_changes_until_the_previous_is_published(
    clean_db, database_url, tmp_path
):
    """An asset backfill of 3 sessions (the UI's way) through the daemon: snapshot_changes of
    each session runs only after snapshot_publication of the session before it (SPEC §10.8);
    every session's changes compare it with the session before it, current; the next session's
    changes, which the backfill targets too, record nothing while it is not published.
    Timestamps from the instance."""
    sessions = _sessions()[-3:]
    write_synthetic_universe(clean_db, n_symbols=30, n_days=300, seed=11, end_date=LAST)
    with _daemon(database_url, tmp_path) as (instance, waiting):
        backfill_id = _submit_asset_backfill(instance, sessions)
        while (backfill := instance.get_backfill(backfill_id)) is not None and backfill.status in (
            BulkActionStatus.REQUESTED,
            BulkActionStatus.CANCELING,
        ):
            waiting(backfill)
    assert backfill is not None and backfill.status == BulkActionStatus.COMPLETED_SUCCESS, (
        backfill,
        (tmp_path / "daemon.log").read_text()[-3000:],
    )
    runs = {
        r.dagster_run.run_id: r
        for r in instance.get_run_records(filters=dg.RunsFilter.for_backfill(backfill_id))
    }
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs.values())
    for before, day in zip(sessions, sessions[1:], strict=False):
        published_at, _ = _materialized(instance, "snapshot_publication", before)
        _, changes_run = _materialized(instance, "snapshot_changes", day)
        started = runs[changes_run].start_time
        assert started is not None and started > published_at, (day, started, published_at)
    # Dagster's asset backfill also targets what depends on the last session's publication:
    # the changes of the next session, not published, which record nothing and say why
    keys = snapshot_partitions.get_partition_keys()
    following = keys[keys.index(sessions[-1]) + 1]
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("snapshot_changes"), asset_partitions=[following]
        ),
        limit=1,
    ).records[0]
    meta = record.asset_materialization.metadata
    assert meta["recorded"].value is False, meta
    assert f"the snapshot of {following} is not published" in meta["note"].value, meta
    instance.dispose()
    changes = _changes(clean_db, sessions)
    for before, day in zip(sessions, sessions[1:], strict=False):
        assert (changes[day, "previous"], changes[day, "stale"]) == (before, []), day
