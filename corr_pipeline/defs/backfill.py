"""Backfill a range of sessions through the Dagster instance (``corr-pipeline backfill``).

:func:`plan_backfill` lists the sessions of ``[first, last]`` and leaves out those already
*current* (:mod:`corr_pipeline.snapshot.current`: published with the same parameters, their
changes recorded). The others are *pending*; they run as runs of consecutive sessions, at most
``per_run`` each (:func:`corr_pipeline.snapshot.sizing.sessions_per_run` for the price source's
symbols: what half a run's maximum runtime holds), in date order, one run after the other, so
that every session's changes are against the session before it.

:func:`run_backfill` creates each run from the code location's remote job (as the UI and
:func:`corr_pipeline.defs.run.launch_snapshot` do: the UI lists it, can re-execute it, and
shows every session as its own partition), with the range tags of a backfill run
(:mod:`corr_pipeline.defs.runs`). It is *submitted* to the run queue when the instance's daemon
is running (its run queue sent a heartbeat within Dagster's interval plus
:data:`DAEMON_TOLERANCE_S`; the pool's limit applies), otherwise launched directly after the same
limits are checked; a daemon that ran on the instance and is gone is said at once, before
anything is queued (:func:`daemon_gone_line`). While a run goes, every session it publishes is reported. A session that fails fails
alone: the run publishes its other sessions and then fails naming each failed session with its
reason (:func:`corr_pipeline.defs.ranges.failure`), which the backfill records. Running the same
backfill again computes only what is still pending: a killed run resumes from its first
unpublished session. Without a daemon, a run whose worker was killed would stay "started" for
ever and hold its sessions; the backfill marks such runs failed first (:func:`fail_dead_runs`),
as the daemon's run monitoring does.

Stopped by Ctrl-C (or SIGTERM, which the command turns into the same interrupt), the backfill
asks Dagster to terminate the runs it created that have not finished (:func:`stop_runs`: a
queued run is canceled, a started one terminated through the run coordinator, as the UI's
*Terminate* does), waits for them and says which; with ``detach`` it leaves them running.
Killed (SIGKILL) it can do neither: its run goes on until it ends.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.price_reads import prices_extent
from corr_pipeline.db.price_source import PriceSource
from corr_pipeline.db.published_reads import published_matrix_versions, recorded_change_dates
from corr_pipeline.defs.partitions import snapshot_partitions
from corr_pipeline.defs.ranges import FAILED_SESSIONS
from corr_pipeline.defs.run import (
    SnapshotLocation,
    check_run_limits,
    snapshot_location,
    snapshot_run_config,
)
from corr_pipeline.defs.runs import (
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    partitions_in_flight,
    run_sessions,
    run_worker_gone,
)
from corr_pipeline.snapshot import retention, sizing
from corr_pipeline.snapshot.current import current_sessions
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.store.matrix_store import MatrixStore

__all__ = [
    "BackfillPlan",
    "BackfillReport",
    "BackfillRequest",
    "fail_dead_runs",
    "plan_backfill",
    "run_backfill",
    "stop_runs",
]


@dataclass
class BackfillPlan:
    """The sessions of ``[first, last]``: ``current`` (left alone) and ``pending``; runs of at
    most ``per_run`` consecutive sessions (:meth:`runs`); ``n_symbols`` sized them."""

    sessions: list[str]
    current: list[str]
    pending: list[str]
    per_run: int
    n_symbols: int

    def runs(self, leave_out: Sequence[str] = ()) -> list[list[str]]:
        """The pending sessions but ``leave_out``, as runs of consecutive sessions: a run never
        spans a session that is current or left out (a run covers every session of its range)."""
        runs: list[list[str]] = []
        todo = set(self.pending) - set(leave_out)
        current: list[str] = []
        for key in self.sessions:
            if key in todo and len(current) < self.per_run:
                current.append(key)
                continue
            if current:
                runs.append(current)
            current = [key] if key in todo else []
        if current:
            runs.append(current)
        return runs


@dataclass(frozen=True)
class BackfillRequest:
    """A backfill of the snapshot partitions in ``[first, last]`` with ``params`` (the
    parameters of the result; ``overrides`` the fields given on the command line, passed to
    every run as run config), reading ``source``; ``per_run`` sessions per run (None: sized,
    module docstring); ``force``: every session is pending, current or not; ``log_level``: of
    the runs' console log (the instance's event log keeps everything); ``detach``: an interrupt
    leaves the runs running (:func:`stop_runs`). The runs use the deployment's database and
    matrix store (:mod:`corr_pipeline.settings`)."""

    first: dt.date
    last: dt.date
    params: SnapshotParameters
    source: PriceSource
    overrides: Mapping[str, Any] = field(default_factory=dict)
    per_run: int | None = None
    force: bool = False
    log_level: str = "WARNING"
    detach: bool = False


def plan_backfill(engine: sa.Engine, request: BackfillRequest, *, force: bool) -> BackfillPlan:
    """The plan of ``request`` (module docstring); ``force``: every session is pending.
    ValueError when the range holds no partition."""
    keys = [
        key
        for key in snapshot_partitions.get_partition_keys()
        if request.first.isoformat() <= key <= request.last.isoformat()
    ]
    if not keys:
        raise ValueError(f"no snapshot partition from {request.first} to {request.last}")
    current = [] if force else current_sessions(engine, keys, request.params)
    n_symbols = max(1, prices_extent(engine, request.source).symbols)
    per_run = request.per_run or sizing.sessions_per_run(
        n_symbols, request.params.lookback_days, settings.max_runtime_seconds()
    )
    return BackfillPlan(
        sessions=keys,
        current=current,
        pending=[key for key in keys if key not in set(current)],
        per_run=per_run,
        n_symbols=n_symbols,
    )


@dataclass
class RunOutcome:
    """One run of a backfill: its id, its sessions, its status, the sessions it published."""

    run_id: str
    sessions: list[str]
    status: str
    published: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class BackfillReport:
    """What :func:`run_backfill` did: its runs, the sessions published, those that failed (with
    the reason), and its wall time."""

    plan: BackfillPlan
    runs: list[RunOutcome] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def success(self) -> bool:
        return not self.failed

    def lines(self) -> list[str]:
        """The closing summary."""
        hours = self.seconds / 3600
        rate = f", {len(self.published) / hours:,.0f} sessions per hour" if self.published else ""
        out = [
            f"backfill {self.plan.sessions[0]}..{self.plan.sessions[-1]}: "
            f"{len(self.published)} session(s) published in {len(self.runs)} run(s) "
            f"in {self.seconds:,.1f} s{rate}; {len(self.plan.current)} already current; "
            f"{len(self.failed)} failed"
        ]
        for key, reason in sorted(self.failed.items()):
            out.append(f"  FAILED {key}: {reason}")
        if self.failed:
            out.append(
                "  fix the cause and run the same command again: only the sessions not yet "
                "published are computed"
            )
        return out


#: A daemon whose last heartbeat is older than its interval (Dagster's, 30 s) plus this is taken
#: as gone: its run queue loop writes one every interval. (Dagster's own tolerance, 30 minutes,
#: would leave a stopped daemon "healthy" for that long.)
DAEMON_TOLERANCE_S = 10.0


class DaemonGone(RuntimeError):
    """The daemon stopped while a run of the backfill was queued for it."""


def daemon_heartbeat_age(instance: dg.DagsterInstance) -> float | None:
    """Seconds since the instance's run queue daemon last sent a heartbeat; None when none ever
    did (no daemon ran on this instance)."""
    beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return None if beat is None else max(0.0, time.time() - beat.timestamp)


def _daemon_running(instance: dg.DagsterInstance) -> bool:
    """Whether the instance queues runs and its daemon's run queue sent a heartbeat lately."""
    from corr_pipeline.defs.dagster_private import DEFAULT_HEARTBEAT_INTERVAL_SECONDS

    if not isinstance(instance.run_coordinator, dg.QueuedRunCoordinator):
        return False
    age = daemon_heartbeat_age(instance)
    return age is not None and age <= DEFAULT_HEARTBEAT_INTERVAL_SECONDS + DAEMON_TOLERANCE_S


def daemon_gone_line(instance: dg.DagsterInstance) -> str | None:
    """One line when the instance queues runs and a daemon ran on it but is gone (its
    heartbeat is stale): the backfill launches its runs directly and says how to start it;
    None otherwise."""
    age = daemon_heartbeat_age(instance)
    if age is None or _daemon_running(instance):
        return None

    if not isinstance(instance.run_coordinator, dg.QueuedRunCoordinator):
        return None
    return (
        f"the Dagster daemon of {instance.root_directory} is gone (its last heartbeat was "
        f"{age:,.0f} s ago): the runs are launched directly; to queue them for it, start it "
        "with `corr-pipeline ui`"
    )


def fail_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the snapshot runs in progress whose run worker, a process of this machine
    (the default run launcher), is gone: what the daemon's run monitoring does, for a machine
    where no daemon runs (a backfill killed with its runs). Returns a line per run; nothing for
    another run launcher, whose workers are not local processes."""
    lines = []
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    for run in runs:
        if not run_sessions(run.tags) or not run_worker_gone(instance, run):
            continue
        message = (
            "its run worker is gone: marked failed by corr-pipeline backfill, as the daemon's "
            "run monitoring would"
        )
        instance.report_run_failed(run, message)
        lines.append(
            f"run {run.run_id[:8]} ({', '.join(run_sessions(run.tags)[:1])}...): {message}"
        )
    return lines


def _run_tags(sessions: Sequence[str]) -> dict[str, str]:
    if len(sessions) == 1:
        return {PARTITION_TAG: sessions[0]}
    return {RANGE_START_TAG: sessions[0], RANGE_END_TAG: sessions[-1]}


def _failed_sessions(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """``{session: reason}`` of a failed run, from its step failure (the ``failed_sessions``
    metadata of :func:`corr_pipeline.defs.ranges.failure`)."""
    failed: dict[str, str] = {}
    records = instance.get_records_for_run(
        run_id, of_type={dg.DagsterEventType.STEP_FAILURE}
    ).records
    for record in records:
        event = record.event_log_entry.dagster_event
        data: Any = event.event_specific_data if event is not None else None
        user: Any = getattr(data, "user_failure_data", None)
        named = user.metadata.get(FAILED_SESSIONS) if user is not None else None
        if named is not None:
            failed.update({str(k): str(v) for k, v in named.value.items()})
    return failed


def _published_line(
    materialization: dg.AssetMaterialization, outcome: RunOutcome, done_before: int, total: int
) -> str | None:
    """The line of a ``snapshot_changes`` materialization of the run: a session of the run
    published (counted once, added to ``outcome.published``), or the changes of the next
    published session after the range computed again (not a session of the backfill)."""
    key = str(materialization.partition)
    if key not in outcome.sessions:
        previous: Any = materialization.metadata.get("previous_date")
        against = f" against {previous.value}" if previous is not None else ""
        return f"  {key} (published before): its changes computed again{against}"
    if key in outcome.published:
        return None
    outcome.published.append(key)
    return f"  {key} published ({done_before + len(outcome.published)}/{total})"


def _watch(
    instance: dg.DagsterInstance,
    outcome: RunOutcome,
    echo: Callable[[str], None],
    done_before: int,
    total: int,
    poll_seconds: float,
) -> dg.DagsterRun:
    """Follow a run until it finishes, echoing each step that ends and each session whose
    changes (the last asset) are materialized."""
    cursor = None
    kinds = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.STEP_SUCCESS}
    while True:
        run = instance.get_run_by_id(outcome.run_id)
        if run is None:
            raise ValueError(f"run {outcome.run_id} disappeared from the Dagster instance")
        connection = instance.get_records_for_run(outcome.run_id, cursor=cursor, of_type=kinds)
        cursor = connection.cursor
        for record in connection.records:
            event = record.event_log_entry.dagster_event
            if event is not None and event.event_type == dg.DagsterEventType.STEP_SUCCESS:
                data: Any = event.event_specific_data
                echo(f"  {event.step_key}: done in {data.duration_ms / 1000:,.1f} s")
                continue
            materialization = record.asset_materialization
            if materialization is None or materialization.asset_key.path != ["snapshot_changes"]:
                continue
            line = _published_line(materialization, outcome, done_before, total)
            if line is not None:
                echo(line)
        if run.is_finished and not connection.has_more:
            return run
        if run.status == dg.DagsterRunStatus.QUEUED and not _daemon_running(instance):
            instance.run_coordinator.cancel_run(run.run_id)
            raise DaemonGone(
                f"run {run.run_id[:8]} was queued, but the Dagster daemon of "
                f"{instance.root_directory} is gone: canceled, its sessions are launched directly"
            )
        if not connection.has_more:
            time.sleep(poll_seconds)


def run_backfill(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    request: BackfillRequest,
    *,
    echo: Callable[[str], None] = print,
    poll_seconds: float = 1.0,
) -> BackfillReport:
    """Run the pending sessions of ``request`` (module docstring). After each run the database
    says which of its sessions are now published and current; a session of a failed run that
    is neither was the failed one (or, when the run's failure names no session, every such
    session of the run). An interrupt (Ctrl-C) stops the runs not finished (:func:`stop_runs`,
    unless ``request.detach``), says so and is raised again."""
    started = time.perf_counter()
    plan = plan_backfill(engine, request, force=request.force)
    report = BackfillReport(plan)
    echo(
        f"backfill {plan.sessions[0]}..{plan.sessions[-1]}: {len(plan.sessions)} sessions, "
        f"{len(plan.current)} current, {len(plan.pending)} to compute, at most {plan.per_run} "
        f"per run ({plan.n_symbols:,} symbols)"
    )
    gone = daemon_gone_line(instance)  # before anything is queued
    if gone is not None:
        echo(gone)
    with snapshot_location(instance) as location:
        try:
            _run_all(instance, engine, request, report, location, echo, poll_seconds)
        except KeyboardInterrupt:
            for line in stop_runs(instance, report.runs, request.detach, poll_seconds):
                echo(line)
            raise
    for line in _apply_retention(instance, engine):
        echo(line)
    report.seconds = time.perf_counter() - started
    return report


def _run_all(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    request: BackfillRequest,
    report: BackfillReport,
    location: SnapshotLocation,
    echo: Callable[[str], None],
    poll_seconds: float,
) -> None:
    """The runs of ``report.plan``, one after the other, each followed until it ends and
    recorded in ``report`` (a run is in ``report.runs`` from the moment it exists)."""
    plan = report.plan
    run_config, _ = snapshot_run_config(params=dict(request.overrides), log_level=request.log_level)
    while runs := plan.runs(leave_out=[*report.published, *report.failed]):
        sessions = runs[0]
        queued = _daemon_running(instance)
        if not queued:  # what the queue would hold back, before a run exists
            for line in fail_dead_runs(instance):
                echo(line)
            check_run_limits(instance, sessions)
        run = location.create_run(run_config, _run_tags(sessions))
        outcome = RunOutcome(run.run_id, sessions, "STARTING")
        report.runs.append(outcome)
        if queued:
            instance.submit_run(run.run_id, location.workspace)
        else:
            instance.launch_run(run.run_id, location.workspace)
        echo(
            f"run {run.run_id[:8]}: {sessions[0]}..{sessions[-1]} ({len(sessions)} "
            f"session(s)), {'queued for the daemon' if queued else 'launched'}"
        )
        t0 = time.perf_counter()
        try:
            finished = _watch(
                instance, outcome, echo, len(report.published), len(plan.pending), poll_seconds
            )
        except DaemonGone as gone:
            echo(f"  {gone}")
            report.runs.remove(outcome)
            continue
        outcome.seconds = time.perf_counter() - t0
        outcome.status = finished.status.value
        _record_run(instance, engine, request, report, outcome, echo)


#: How long a stopped backfill waits for the runs it asked to terminate to end.
STOP_WAIT_SECONDS = 60.0


def stop_runs(
    instance: dg.DagsterInstance,
    runs: Sequence[RunOutcome],
    detach: bool,
    poll_seconds: float = 1.0,
) -> list[str]:
    """What an interrupted backfill does with its ``runs`` not finished, a line each: with
    ``detach`` nothing (they go on and publish their sessions); otherwise each is canceled
    (queued, or created and not launched yet) or asked to terminate (started: the run
    coordinator's ``cancel_run``, what the UI's *Terminate* does), then waited for up to
    :data:`STOP_WAIT_SECONDS`. A run that cannot be reached is named with the reason and
    where to stop it."""
    left = []
    for outcome in runs:
        run = instance.get_run_by_id(outcome.run_id)
        if run is not None and not run.is_finished:
            left.append((outcome, run))
    lines = []
    for outcome, run in left:
        label = f"run {run.run_id[:8]} ({outcome.sessions[0]}..{outcome.sessions[-1]})"
        if detach:
            lines.append(
                f"stopped following {label}, left running (--detach): it publishes its sessions; "
                "the rest of the range was not started, run the same command again for it"
            )
            continue
        try:
            if run.status == dg.DagsterRunStatus.NOT_STARTED:
                instance.report_run_canceled(run, "canceled: its backfill was stopped")
            else:
                instance.run_coordinator.cancel_run(run.run_id)
        except Exception as exc:  # noqa: BLE001 - said, with where to stop it by hand
            lines.append(
                f"could not ask Dagster to terminate {label}: {type(exc).__name__}: {exc}; "
                "terminate it on the UI's Runs page"
            )
            continue
        lines.append(f"stopping: asked Dagster to terminate {label}")
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    for _, run in [] if detach else left:
        ended = instance.get_run_by_id(run.run_id)
        while ended is not None and not ended.is_finished and time.monotonic() < deadline:
            time.sleep(poll_seconds)
            ended = instance.get_run_by_id(run.run_id)
        status = ended.status.value if ended is not None else "deleted"
        done = ended is None or ended.is_finished
        lines.append(
            f"run {run.run_id[:8]}: {status}"
            + ("" if done else f" after {STOP_WAIT_SECONDS:.0f} s: see the UI's Runs page")
        )
    return lines


def _record_run(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    request: BackfillRequest,
    report: BackfillReport,
    outcome: RunOutcome,
    echo: Callable[[str], None],
) -> None:
    """After a run: its sessions now current are published; each of the others failed, with
    the reason the run gave for it (or, when it named none, the run's status)."""
    now_current = set(plan_backfill(engine, request, force=False).current)
    report.published.extend(key for key in outcome.sessions if key in now_current)
    left = [key for key in outcome.sessions if key not in now_current]
    if not left:
        return
    named = _failed_sessions(instance, outcome.run_id)
    failed = {key: named[key] for key in left if key in named}
    if not failed:  # no session named, or the run finished without them: all of them
        reason = f"run {outcome.run_id} {outcome.status}"
        failed = {key: named.get(key, reason) for key in left}
    for key, reason in failed.items():
        report.failed[key] = reason
        echo(f"  {key} FAILED: {reason}")


def _apply_retention(instance: dg.DagsterInstance, engine: sa.Engine) -> list[str]:
    """Retention once the runs are done (:mod:`corr_pipeline.snapshot.retention`): a run's own
    sessions stay while it goes (its later steps read them), so the last run's would otherwise
    wait for the next publication."""
    store = MatrixStore(settings.store_dir())
    report = retention.apply_retention(
        store,
        lambda: published_matrix_versions(engine),
        settings.keep_matrices(),
        in_flight=partitions_in_flight(instance),
        read_changed=lambda: recorded_change_dates(engine),
    )
    line = (
        f"retention: the newest {report.keep} published sessions keep their matrices; "
        f"{len(report.removed)} session(s) removed, {retention.format_bytes(report.freed_bytes)} "
        "freed"
    )
    return [line + (f"; left alone (in use): {len(report.busy)}" if report.busy else "")]
