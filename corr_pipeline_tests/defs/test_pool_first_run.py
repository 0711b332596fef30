"""The snapshot pool's limit holds from the daemon's very first pass on a fresh instance, however
the daemon was started.

Dagster 1.13's queued-run daemon applies the pools' ``default_limit`` only to a pool that has a
row in storage, and the pass that finds a queued run of a pool without one creates the row after
it has read the configured pool keys, so that pass sees no limit and launches every queued run
of the pool (:mod:`corr_pipeline.defs.pool`). The project's instance class
(:class:`~corr_pipeline.defs.instance_storage.SnapshotInstance`) creates the pool whenever an
instance is opened (:func:`~corr_pipeline.defs.pool.ensure_snapshot_pool`).

The proof, through the real thing and no ``corr-pipeline`` command: a fresh ``DAGSTER_HOME``
with the repository's ``dagster.yaml`` (pool granularity ``run``, ``default_limit: 1``, no limit
stored), opened with ``DagsterInstance.from_config``; three runs of a tiny job whose one op
declares the pool and sleeps, queued before the daemon starts (as a backfill queues its runs
between two passes); the pool's row then deleted, so the storage is that of an instance the
daemon is the first to open; then ``dagster-daemon run``, started directly as a subprocess on a
workspace of that job, dequeues them. From the instance's own timestamps no two runs were ever
in progress at once, counted from their launch (the ``RUN_STARTING`` event) and from their
execution (``start_time``) to their end. Without the pool created when the daemon opens the
instance, its first pass launches all three together.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._cli.job import _create_run
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from corr_pipeline.cli.ui import _ensure_snapshot_pool
from corr_pipeline.defs.concurrency import (
    ensure_snapshot_pool,
    instance_limits,
    set_snapshot_runs_limit,
)
from corr_pipeline.defs.instance_storage import SnapshotInstance
from corr_pipeline.defs.pool import SNAPSHOT_POOL
from corr_pipeline.defs.run import REPO_DAGSTER_YAML, open_instance
from corr_pipeline_tests.fixtures.runs import launched_at, max_overlap, stop
from corr_pipeline_tests.reliability import helpers as h

pytestmark = pytest.mark.slow  # the daemon: outside `pytest -m "not slow"`

RUNS = 3
HOLD_SECONDS = 3.0  # each run's op: longer than the runs' launches are apart in one pass
RUNS_TIMEOUT_S = 120.0  # a bound for a stuck queue, not a speed target
LOCATION = "pool_first_run"
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}

JOB_FILE = textwrap.dedent(
    f"""
    import time

    import dagster as dg


    @dg.op(pool={SNAPSHOT_POOL!r})
    def hold() -> None:
        time.sleep({HOLD_SECONDS!r})


    @dg.job(executor_def=dg.in_process_executor)
    def pool_job():
        hold()


    defs = dg.Definitions(jobs=[pool_job])
    """
)


INSTANCE_CLASS = (
    "instance_class:\n  module: corr_pipeline.defs.instance_storage\n  class: SnapshotInstance\n"
)


def _fresh_home(tmp_path: Path, *, dagsters_instance: bool = False) -> Path:
    """A new ``DAGSTER_HOME`` with the repository's ``dagster.yaml``; with ``dagsters_instance``
    without its ``instance_class`` (Dagster's own instance class, as ``deploy/dagster.yaml``)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = REPO_DAGSTER_YAML.read_text()
    if dagsters_instance:
        assert INSTANCE_CLASS in config
        config = config.replace(INSTANCE_CLASS, "")
    (home / "dagster.yaml").write_text(config)
    return home


def _pool_rows(instance: dg.DagsterInstance) -> dict[str, tuple[int, bool]]:
    return {p.name: (p.limit, p.from_default) for p in instance.event_log_storage.get_pool_limits()}


def _write_workspace(tmp_path: Path) -> Path:
    (tmp_path / "pool_job.py").write_text(JOB_FILE)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_file:\n"
        "      relative_path: pool_job.py\n"
        f"      location_name: {LOCATION}\n"
        f"      working_directory: {tmp_path}\n"
    )
    return workspace


def _queue_runs(instance: dg.DagsterInstance, workspace: Path, count: int) -> list[str]:
    """What ``dagster job launch -j pool_job`` does, ``count`` times: the runs are created from
    the code location's remote job (so they carry the pool in their concurrency info) and
    submitted to the instance's run coordinator, which queues them."""
    target = WorkspaceFileTarget(paths=[str(workspace)])
    run_ids = []
    with WorkspaceProcessContext(instance, target) as process_context:
        context = process_context.create_request_context()
        location = context.get_code_location(LOCATION)
        repo = location.get_repository("__repository__")
        job = repo.get_full_job("pool_job")
        for _ in range(count):
            run = _create_run(
                instance=instance,
                code_location=location,
                remote_repo=repo,
                remote_job=job,
                run_config={},
                tags={},
                op_selection=None,
                run_id=None,
            )
            assert run.run_op_concurrency is not None
            assert run.run_op_concurrency.all_pools == {SNAPSHOT_POOL}
            instance.submit_run(run.run_id, context)
            run_ids.append(run.run_id)
    return run_ids


def test_pool_limit_holds_from_the_first_pass_of_a_daemon_started_directly(
    tmp_path: Path,
) -> None:
    home = _fresh_home(tmp_path)
    workspace = _write_workspace(tmp_path)
    instance = dg.DagsterInstance.from_config(str(home))  # Dagster's way, no corr-pipeline code
    try:
        assert isinstance(instance, SnapshotInstance)
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}  # opening it created the pool
        limits = instance_limits(instance)
        assert (limits.granularity, limits.snapshot_runs, limits.explicit) == ("run", 1, False)
        run_ids = _queue_runs(instance, workspace, RUNS)
        queued = instance.get_runs(filters=dg.RunsFilter(run_ids=run_ids))
        assert {r.status for r in queued} == {dg.DagsterRunStatus.QUEUED}
        # queued runs and no pool: what the daemon finds on an instance it is the first to open
        instance.event_log_storage.delete_concurrency_limit(SNAPSHOT_POOL)
        assert _pool_rows(instance) == {}
        log = tmp_path / "daemon.log"
        with log.open("wb") as out:
            daemon = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "dagster-daemon"),
                    "run",
                    "-w",
                    str(workspace),
                ],
                cwd=tmp_path,
                env=h.child_env(DAGSTER_HOME=str(home)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: code server and runs with it
            )
        try:
            deadline = time.monotonic() + RUNS_TIMEOUT_S
            while True:
                runs = instance.get_runs(filters=dg.RunsFilter(run_ids=run_ids))
                if all(r.status in FINISHED for r in runs):
                    break
                assert daemon.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, [(r.run_id, r.status) for r in runs]
                time.sleep(0.5)
        finally:
            stop(daemon)
        records = instance.get_run_records(filters=dg.RunsFilter(run_ids=run_ids))
        assert len(records) == RUNS
        assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records), (
            log.read_text()[-3000:]
        )
        executing: list[tuple[float, float]] = []
        launched: list[tuple[float, float]] = []
        for record in records:
            start, end = record.start_time, record.end_time
            assert start is not None and end is not None and start < end, record
            executing.append((start, end))
            launched.append((launched_at(instance, record.dagster_run.run_id), end))
        t0 = min(go for go, _ in launched)
        timeline = [
            f"launched {go - t0:5.1f} s, ran {start - t0:5.1f} .. {end - t0:5.1f} s"
            for (go, end), (start, _) in sorted(zip(launched, executing, strict=True))
        ]
        print("\n".join(timeline))  # with pytest -s
        assert max_overlap(launched) == 1, timeline  # the pool held the others back
        assert max_overlap(executing) == 1, timeline
        assert "is blocked by global concurrency limits" in log.read_text()  # by the pool
        # the pool was created from the default: still not an explicit limit
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}
        assert not instance_limits(instance).explicit
    finally:
        instance.dispose()


def test_opening_the_instance_creates_the_pool_and_keeps_an_explicit_limit(
    tmp_path: Path,
) -> None:
    home = _fresh_home(tmp_path)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}
        limits = instance_limits(instance)
        assert (limits.snapshot_runs, limits.explicit) == (1, False)
        assert not ensure_snapshot_pool(instance)  # already there: nothing written
        instance.event_log_storage.delete_concurrency_limit(SNAPSHOT_POOL)
        assert ensure_snapshot_pool(instance)
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}
        set_snapshot_runs_limit(instance, 3)
        assert not ensure_snapshot_pool(instance)
    finally:
        instance.dispose()
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (3, False)}  # the explicit limit stays
        limits = instance_limits(instance)
        assert (limits.snapshot_runs, limits.explicit) == (3, True)
    finally:
        instance.dispose()


def test_without_a_default_limit_no_pool_is_written(tmp_path: Path) -> None:
    home = _fresh_home(tmp_path)
    config = home / "dagster.yaml"
    assert "    default_limit: 1\n" in config.read_text()
    config.write_text(config.read_text().replace("    default_limit: 1\n", ""))
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert instance_limits(instance).snapshot_runs is None
        assert not ensure_snapshot_pool(instance)
        assert _pool_rows(instance) == {}
    finally:
        instance.dispose()


def test_opening_the_instance_follows_a_changed_default(tmp_path: Path) -> None:
    home = _fresh_home(tmp_path)
    instance = dg.DagsterInstance.from_config(str(home))  # creates the pool at default_limit 1
    instance.dispose()
    config = home / "dagster.yaml"
    config.write_text(config.read_text().replace("default_limit: 1", "default_limit: 2"))
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (2, True)}
        limits = instance_limits(instance)
        assert (limits.snapshot_runs, limits.explicit) == (2, False)
    finally:
        instance.dispose()


def test_commands_create_the_pool_in_an_instance_of_dagsters_class(tmp_path: Path) -> None:
    """``open_instance`` (every command) and ``corr-pipeline ui`` create the pool in an instance
    whose ``dagster.yaml`` names no instance class of the project."""
    home = _fresh_home(tmp_path, dagsters_instance=True)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert not isinstance(instance, SnapshotInstance)
        assert _pool_rows(instance) == {}
    finally:
        instance.dispose()
    said: list[str] = []
    _ensure_snapshot_pool(str(home), said.append)
    assert said == []
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}
        instance.event_log_storage.delete_concurrency_limit(SNAPSHOT_POOL)
    finally:
        instance.dispose()
    instance = open_instance(home)
    try:
        assert _pool_rows(instance) == {SNAPSHOT_POOL: (1, True)}
    finally:
        instance.dispose()
