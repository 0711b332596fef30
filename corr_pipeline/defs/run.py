"""Materialize the snapshot graph from Python (the ``corr-pipeline demo`` command, scripts, tests).

Two routes, both with the executor the daemon's runs get (:mod:`corr_pipeline.defs.executor`:
the run's one step in the run worker), both recorded in the instance, so ``dg dev`` started with
the same ``DAGSTER_HOME`` shows the run (assets, checks, metadata plots) afterwards:

- :func:`launch_snapshot` (the demo) launches the run through the instance like the UI and
  ``dagster job launch``: created from the code location's remote job, so it has its origin
  (Overview timeline, re-execution), and started by the instance's run launcher;
- :func:`materialize_snapshot` (scripts, tests) runs it in this process with
  ``dagster.execute_job`` on a reconstructable job, on any instance (ephemeral too), without a
  code location.

Instance resolution: the ``instance`` argument, else :func:`corr_pipeline.settings.dagster_home`
(``$DAGSTER_HOME`` if set; else the current directory when it holds ``dagster.yaml``, i.e. the
repository root, whose ``dagster.yaml`` is the instance's configuration; else
``$CORR_PIPELINE_HOME/dagster_home``; created, with the repository's ``dagster.yaml`` copied in
when it has none).
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.price_reads import latest_trade_date
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource
from corr_pipeline.defs.concurrency import ensure_snapshot_pool, instance_limits
from corr_pipeline.defs.location import build_definitions
from corr_pipeline.defs.partitions import (
    partition_key_for,
    snapshot_calendar,
    snapshot_partitions,
)
from corr_pipeline.defs.resources import SnapshotParams, refuse_locations
from corr_pipeline.defs.runs import run_sessions
from corr_pipeline.snapshot import session_gap

SNAPSHOT_JOB_NAME = "snapshot_job"
#: The code location as ``workspace.yaml`` and ``[tool.dg]`` name it (the UI finds the runs of
#: :func:`launch_snapshot` under this name, to re-execute them).
CODE_LOCATION_NAME = "corr_pipeline"
CODE_LOCATION_MODULE = "corr_pipeline.definitions"
REPO_DAGSTER_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml"
IN_PROGRESS_STATUSES = (
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
    dg.DagsterRunStatus.SUSPENDED,
)
"""A run in one of these is under way (Dagster's own "in progress", pinned by a test)."""


def snapshot_job_def() -> dg.JobDefinition:
    """``snapshot_job`` resolved from :func:`build_definitions` (a module-level function, so it
    is reconstructable in the step subprocesses of the multiprocess executor)."""
    return build_definitions().resolve_job_def(SNAPSHOT_JOB_NAME)


def open_instance(dagster_home: Path | None = None) -> dg.DagsterInstance:
    """A persistent instance in ``dagster_home`` (default :func:`settings.dagster_home`),
    created with the repository's ``dagster.yaml`` if the directory has none, its snapshot pool
    in storage (:func:`ensure_snapshot_pool`: the pool limit holds from the daemon's first
    pass)."""
    home = settings.ensure_dir(dagster_home or settings.dagster_home())
    config = home / "dagster.yaml"
    if not config.exists() and REPO_DAGSTER_YAML.is_file():
        shutil.copyfile(REPO_DAGSTER_YAML, config)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        ensure_snapshot_pool(instance)
    except BaseException:
        instance.dispose()
        raise
    return instance


def latest_partition_key(
    engine: sa.Engine, today: dt.date | None = None, *, source: PriceSource = NATIVE_PRICES
) -> str:
    """The partition containing the last trade date of the price source (``prices`` by
    default; a date that is not a session maps to the session before it). Raises ValueError when it is empty or
    the date is outside the partitions (before ``$CORR_PIPELINE_PARTITION_START`` or in the
    future)."""
    last = latest_trade_date(engine, source)
    if last is None:
        if not source.is_native:
            raise ValueError(f"the price source {source} is empty")
        raise ValueError(
            "the prices table is empty: load prices first (corr-pipeline demo seeds it)"
        )
    key = partition_key_for(last)
    check_partition_key(key, today=today)
    return key


def check_partition_key(key: str, today: dt.date | None = None) -> None:
    """Raise ValueError (saying which partitions exist) unless ``key`` is a snapshot partition."""
    current = dt.datetime.combine(today, dt.time(12), tzinfo=dt.UTC) if today is not None else None
    keys = snapshot_partitions.get_partition_keys(current_time=current)
    if key not in keys:
        span = f"{keys[0]} .. {keys[-1]}" if keys else "none"
        raise ValueError(
            f"{key} is not a snapshot partition (sessions of {snapshot_calendar.name}: {span}; "
            "the first one is set by CORR_PIPELINE_PARTITION_START, the calendar by "
            "CORR_PIPELINE_CALENDAR)"
        )


@dataclass
class StepRun:
    """One step of a run: its process id (from its ``STEP_START`` event; with the multiprocess
    executor each step has its own), its status, and the seconds from its start to its end as
    Dagster recorded them (process start-up, inputs, the asset, its checks and outputs)."""

    key: str
    pid: int | None
    status: str
    seconds: float | None


@dataclass
class SnapshotRunSummary:
    """What one snapshot run produced, from its materialization and check events; ``steps``:
    every step of the run in the order they started (see :class:`StepRun`)."""

    partition_key: str
    run_id: str
    success: bool
    dagster_home: Path
    store_dir: Path
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    failed_steps: list[str] = field(default_factory=list)
    steps: list[StepRun] = field(default_factory=list)

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def failed_checks(self) -> list[str]:
        return sorted(name for name, passed in self.checks.items() if not passed)

    def __str__(self) -> str:
        status = "succeeded" if self.success else "FAILED"
        lines = [
            f"snapshot {self.partition_key} {status} (run {self.run_id})",
            f"  as of trade date {self.value('returns_matrix', 'as_of_trade_date', '?')}: "
            f"{self.value('returns_matrix', 'n_symbols', '?')} symbols kept, "
            f"{self.value('returns_matrix', 'n_dropped', '?')} dropped, "
            f"{self.value('returns_matrix', 'bad_prices', '?')} bad prices in the window, "
            f"{self.value('returns_matrix', 'n_suspect_symbols', '?')} suspect symbols",
            f"  mean |corr| {_fmt(self.value('correlation_matrix', 'mean_abs_corr'))}, "
            f"{self.value('clusters', 'n_clusters', '?')} clusters "
            f"(largest {self.value('clusters', 'largest_cluster_size', '?')}, "
            f"singleton share {_fmt(self.value('clusters', 'singleton_share'))}), "
            + self._lead_lag_text(),
            f"  published: {self.value('snapshot_publication', 'peer_neighbors_rows', '?')} "
            f"neighbor rows, {self.value('snapshot_publication', 'symbol_clusters_rows', '?')} "
            f"cluster rows, {self.value('snapshot_publication', 'lead_lag_pairs_rows', '?')} "
            "pair rows",
            self._changes_line(),
            f"  checks: {sum(self.checks.values())}/{len(self.checks)} passed"
            + (f" (failed: {', '.join(self.failed_checks)})" if self.failed_checks else ""),
            f"  matrix store: {self.store_dir}",
        ]
        if self.failed_steps:
            lines.append(f"  failed steps: {', '.join(self.failed_steps)}")
        return "\n".join(lines)

    def _lead_lag_text(self) -> str:
        """``<n> lead-lag pairs, <s> significant at q ≤ <max_q_value>, <w> two-way``: from the
        ``lead_lag_pairs`` materialization's metadata (``n_pairs``, ``significant_pairs`` and
        ``two_way_pairs`` at the snapshot's ``max_q_value``, SPEC §6 "Significance",
        "Direction"); ``?`` for what the run did not record."""
        max_q = self.value("lead_lag_pairs", "max_q_value")
        return (
            f"{self.value('lead_lag_pairs', 'n_pairs', '?')} lead-lag pairs, "
            f"{self.value('lead_lag_pairs', 'significant_pairs', '?')} significant at "
            f"q ≤ {format(max_q, 'g') if isinstance(max_q, int | float) else '?'}, "
            f"{self.value('lead_lag_pairs', 'two_way_pairs', '?')} two-way"
        )

    def _changes_line(self) -> str:
        """What ``snapshot_changes`` compared: against which session, or why nothing."""
        previous = self.value("snapshot_changes", "previous_date")
        if previous is None:
            return "  changes: not computed"
        if previous == "none":
            return f"  changes: {self.value('snapshot_changes', 'note', 'nothing to compare')}"
        between = self.value("snapshot_changes", "sessions_between")
        gap = session_gap.title_note(between if isinstance(between, int) else None)
        return (
            f"  changes against {previous}{gap}: "
            f"{self.value('snapshot_changes', 'n_common', '?')} "
            f"symbols in common, mean |Δcorr| "
            f"{_fmt(self.value('snapshot_changes', 'mean_abs_change'))}, "
            f"{self.value('snapshot_changes', 'n_moved_symbols', '?')} symbols changed cluster, "
            f"{self.value('snapshot_changes', 'n_lead_lag_appeared', '?')} lead-lag pairs "
            f"appeared and {self.value('snapshot_changes', 'n_lead_lag_vanished', '?')} vanished"
        )


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value if value is not None else "?")


def _plain(value: Any) -> Any:
    """Metadata value -> plain Python (numbers, text)."""
    inner = getattr(value, "value", value)
    return inner if isinstance(inner, int | float | str | bool) else str(inner)


def summarize(
    events: Iterable[Any],
    *,
    run_id: str,
    success: bool,
    partition_key: str,
    dagster_home: Path,
    store_dir: Path,
    instance: dg.DagsterInstance | None = None,
) -> SnapshotRunSummary:
    """Collect materialization metadata, check outcomes and failed steps from a run's Dagster
    events (an execution result's ``all_events``, or the instance's event log of the run), and
    with ``instance`` the steps' times (:meth:`~dagster.DagsterInstance.get_run_step_stats`)."""
    summary = SnapshotRunSummary(
        partition_key=partition_key,
        run_id=run_id,
        success=success,
        dagster_home=dagster_home,
        store_dir=store_dir,
    )
    for event in events:
        kind = event.event_type_value
        if kind == "ASSET_MATERIALIZATION":
            materialization = event.event_specific_data.materialization
            asset = materialization.asset_key.to_user_string()
            summary.metadata[asset] = {k: _plain(v) for k, v in materialization.metadata.items()}
        elif kind == "ASSET_CHECK_EVALUATION":
            evaluation = event.event_specific_data
            summary.checks[evaluation.check_name] = bool(evaluation.passed)
        elif kind == "STEP_FAILURE" and event.step_key:
            summary.failed_steps.append(event.step_key)
        elif kind == "STEP_START" and event.step_key:
            summary.steps.append(StepRun(event.step_key, event.pid, "STARTED", None))
    if instance is not None:
        stats = {s.step_key: s for s in instance.get_run_step_stats(run_id)}
        for step in summary.steps:
            found = stats.get(step.key)
            if found is None:
                continue
            step.status = found.status.value if found.status is not None else step.status
            if found.start_time is not None and found.end_time is not None:
                step.seconds = found.end_time - found.start_time
    return summary


def snapshot_run_config(
    *,
    params: dict[str, Any] | None = None,
    in_process: bool | None = None,
    max_concurrent: int | None = None,
    forkserver: bool = True,
    log_level: str = "INFO",
) -> tuple[dict[str, Any], Path]:
    """The run config of a ``snapshot_job`` run and the matrix store it writes to (arguments as
    in :func:`materialize_snapshot`). ``params`` are validated here, before a run starts, as one
    ValueError naming every field (inside the run Dagster reports them only as the cause of a
    generic resource-initialisation error); unknown keys are refused by Dagster's config
    check, which names them."""
    resources: dict[str, Any] = {}
    if params:
        refuse_locations(params)
        SnapshotParams(**params)
        resources["snapshot_params"] = {"config": dict(params)}
    store = settings.store_dir()
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if resources:
        run_config["resources"] = resources
    if in_process:
        run_config["execution"] = {"config": {"in_process": {}}}
    elif in_process is False or max_concurrent:  # else the executor's default (defs/executor)
        multiprocess: dict[str, Any] = {}
        if max_concurrent:
            multiprocess["max_concurrent"] = int(max_concurrent)
        if forkserver:
            multiprocess["start_method"] = {
                "forkserver": {"preload_modules": ["corr_pipeline.definitions"]}
            }
        if multiprocess:
            run_config["execution"] = {"config": {"multiprocess": multiprocess}}
    return run_config, store


def materialize_snapshot(
    partition_key: str,
    *,
    instance: dg.DagsterInstance | None = None,
    params: dict[str, Any] | None = None,
    in_process: bool | None = None,
    max_concurrent: int | None = None,
    forkserver: bool = True,
    log_level: str = "INFO",
    raise_on_error: bool = False,
) -> SnapshotRunSummary:
    """Run ``snapshot_job`` for ``partition_key`` in this process (``dagster.execute_job`` on
    a reconstructable job; any instance, ephemeral included) and summarize it. The run has no
    code-location origin: the UI lists it but cannot re-execute it, and leaves it out of the
    Overview timeline; :func:`launch_snapshot` launches a run like the UI's.

    ``params`` overrides fields of :class:`~corr_pipeline.defs.resources.SnapshotParams`
    (validated at run start); the matrix store is the deployment's
    (:func:`settings.store_dir`); ``in_process`` False runs the step in a process of its own
    (the multiprocess executor), True or None (default) in the run's process
    (:mod:`corr_pipeline.defs.executor`); ``max_concurrent`` and ``forkserver`` configure the
    multiprocess executor (step processes from a forkserver that has preloaded
    ``corr_pipeline.definitions``); ``log_level`` is the console log level (the instance's
    event log keeps everything).
    """
    check_partition_key(partition_key)
    run_config, store = snapshot_run_config(
        params=params,
        in_process=in_process,
        max_concurrent=max_concurrent,
        forkserver=forkserver,
        log_level=log_level,
    )
    owned = instance is None
    instance = instance or open_instance()
    home = Path(instance.root_directory) if instance.is_persistent else settings.dagster_home()
    try:
        with dg.execute_job(
            dg.reconstructable(snapshot_job_def),
            instance=instance,
            run_config=run_config,
            tags={"dagster/partition": partition_key},
            raise_on_error=raise_on_error,
        ) as result:
            return summarize(
                result.all_events,
                run_id=result.run_id,
                success=result.success,
                partition_key=partition_key,
                dagster_home=home,
                store_dir=store,
                instance=instance,
            )
    finally:
        if owned:
            instance.dispose()


def check_run_limits(instance: dg.DagsterInstance, sessions: str | list[str]) -> None:
    """Refuse (ValueError naming the run in the way) what the run queue of ``dagster.yaml``
    would hold back (:mod:`corr_pipeline.defs.concurrency`): a run in progress that covers one
    of ``sessions`` (one partition, or the sessions of a range run: one run per partition), or
    as many snapshot runs in progress as the pool's limit. A snapshot run is one that covers
    sessions (its partition tag, or the range tags of a backfill run)."""
    wanted = [sessions] if isinstance(sessions, str) else list(sessions)
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(IN_PROGRESS_STATUSES)))
    snapshot_runs = [(run, run_sessions(run.tags)) for run in runs]
    snapshot_runs = [(run, covered) for run, covered in snapshot_runs if covered]
    where = f"on the Dagster instance {instance.root_directory}"
    for run, covered in snapshot_runs:
        overlap = sorted(set(covered) & set(wanted))
        if overlap:
            raise ValueError(
                f"run {run.run_id} of partition {overlap[0]} is in progress {where} "
                "(one run per partition): wait for it to finish"
            )
    limit = instance_limits(instance).snapshot_runs
    if limit is not None and len(snapshot_runs) >= limit:
        raise ValueError(
            f"{len(snapshot_runs)} snapshot run(s) in progress {where} (the limit is {limit}: "
            "corr-pipeline concurrency show): wait for one to finish"
        )


def launch_snapshot(
    partition_key: str,
    *,
    instance: dg.DagsterInstance,
    params: dict[str, Any] | None = None,
    max_concurrent: int | None = None,
    forkserver: bool = True,
    log_level: str = "INFO",
    poll_seconds: float = 0.5,
) -> SnapshotRunSummary:
    """Launch the ``snapshot_job`` run of ``partition_key`` through ``instance`` as ``dagster job
    launch`` and the UI do, wait for it, and summarize it.

    The code location is loaded the way ``dg dev`` and ``workspace.yaml`` load it (module
    ``corr_pipeline.definitions`` in a code server, location ``corr_pipeline``); the run is
    created from its remote job, so it records its origin (the UI shows it in the Overview
    timeline and can re-execute it), with the job's tags (its maximum runtime) and
    the partition's (``dagster/partition``, ``dagster/partition_set``), and is launched by the
    instance's run launcher (a run worker process started by the code server).

    ``dagster.yaml`` queues runs (``QueuedRunCoordinator``) for the daemon of ``dg dev``, which
    may not be running: the run is launched directly (``instance.launch_run``, what the
    ``DefaultRunCoordinator`` does), after checking the queue's limits that concern it
    (:func:`check_run_limits`: one run per partition, the pool's snapshot runs at once;
    ValueError naming the run in the way otherwise). ``instance`` must be persistent (the run worker is another process). An interrupt (Ctrl-C) terminates the
    run. Other arguments as in :func:`materialize_snapshot`.
    """
    from corr_pipeline.defs.dagster_private import PARTITION_NAME_TAG

    check_partition_key(partition_key)
    if not instance.is_persistent:
        raise ValueError("launch_snapshot needs a persistent Dagster instance (DAGSTER_HOME)")
    run_config, store = snapshot_run_config(
        params=params,
        max_concurrent=max_concurrent,
        forkserver=forkserver,
        log_level=log_level,
    )
    check_run_limits(instance, partition_key)
    with snapshot_location(instance) as location:
        run = location.create_run(run_config, {PARTITION_NAME_TAG: partition_key})
        instance.launch_run(run.run_id, location.workspace)
        try:
            finished = wait_for_run(instance, run.run_id, poll_seconds)
        except KeyboardInterrupt:
            instance.run_launcher.terminate(run.run_id)
            raise
    events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.dagster_event]
    return summarize(
        events,
        run_id=run.run_id,
        success=finished.status == dg.DagsterRunStatus.SUCCESS,
        partition_key=partition_key,
        dagster_home=Path(instance.root_directory),
        store_dir=store,
        instance=instance,
    )


@dataclass
class SnapshotLocation:
    """The code location as ``dg dev`` loads it, open in a code server: ``workspace`` (to launch
    or submit runs) and :meth:`create_run` (a ``snapshot_job`` run created from its remote job,
    so it records its origin: the UI shows it in the Overview timeline and can re-execute it)."""

    instance: dg.DagsterInstance
    workspace: Any
    location: Any
    repo: Any
    remote_job: Any

    def create_run(self, run_config: dict[str, Any], tags: dict[str, str]) -> dg.DagsterRun:
        """A new run of ``snapshot_job`` with the job's tags, the partition set's, and ``tags``
        (a partition, or the range tags of :mod:`corr_pipeline.defs.runs`); not launched."""
        from corr_pipeline.defs.dagster_private import PARTITION_SET_TAG

        all_tags = {**self.remote_job.tags, **tags}
        partition_sets = [
            p for p in self.repo.get_partition_sets() if p.job_name == SNAPSHOT_JOB_NAME
        ]
        if partition_sets:
            all_tags[PARTITION_SET_TAG] = partition_sets[0].name
        plan = self.location.get_execution_plan(
            self.remote_job,
            run_config,
            step_keys_to_execute=None,
            known_state=None,
            instance=self.instance,
        ).execution_plan_snapshot
        return self.instance.create_run(
            job_name=self.remote_job.name,
            run_id=None,
            run_config=run_config,
            resolved_op_selection=None,
            step_keys_to_execute=plan.step_keys_to_execute,
            op_selection=None,
            status=None,
            root_run_id=None,
            parent_run_id=None,
            tags=all_tags,
            job_snapshot=self.remote_job.job_snapshot,
            execution_plan_snapshot=plan,
            parent_job_snapshot=self.remote_job.parent_job_snapshot,
            remote_job_origin=self.remote_job.get_remote_origin(),
            job_code_origin=self.remote_job.get_python_origin(),
            asset_selection=None,
            asset_check_selection=None,
            asset_graph=self.repo.asset_graph,
        )


@contextmanager
def snapshot_location(instance: dg.DagsterInstance) -> Iterator[SnapshotLocation]:
    """The code location (module ``corr_pipeline.definitions``, location ``corr_pipeline``, as
    ``workspace.yaml`` and ``[tool.dg]`` name it) in a code server for ``instance``, stopped on
    exit; ValueError with the location's own last line when it fails to load."""
    from corr_pipeline.defs.dagster_private import ModuleTarget, WorkspaceProcessContext

    target = ModuleTarget(
        module_name=CODE_LOCATION_MODULE,
        attribute=None,
        working_directory=None,
        location_name=CODE_LOCATION_NAME,
    )
    # the code server's own INFO lines (start, stop, .env loaded) would interleave with the
    # run's log on the terminal
    with WorkspaceProcessContext(
        instance, target, code_server_log_level="WARNING"
    ) as process_context:
        workspace = process_context.create_request_context()
        error = workspace.get_code_location_error(CODE_LOCATION_NAME)
        if error is not None:
            raise ValueError(
                f"the code location {CODE_LOCATION_NAME} failed to load: "
                f"{error.message.strip().splitlines()[-1] if error.message.strip() else error}"
            )
        location = workspace.get_code_location(CODE_LOCATION_NAME)
        (repo,) = location.get_repositories().values()
        yield SnapshotLocation(
            instance, workspace, location, repo, repo.get_full_job(SNAPSHOT_JOB_NAME)
        )


def wait_for_run(instance: dg.DagsterInstance, run_id: str, poll_seconds: float) -> dg.DagsterRun:
    """Poll ``run_id`` until it has finished (success, failure or cancellation)."""
    while True:
        run = instance.get_run_by_id(run_id)
        if run is None:
            raise ValueError(f"run {run_id} disappeared from the Dagster instance")
        if run.is_finished:
            return run
        time.sleep(poll_seconds)
