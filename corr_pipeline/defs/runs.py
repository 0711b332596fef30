"""Which partitions have a snapshot run in flight, according to the Dagster instance.

Retention (:mod:`corr_pipeline.snapshot.retention`) leaves alone a partition that another process
holds (every step holds the partitions it uses, :mod:`corr_pipeline.defs.io_manager`); between two
steps of a multiprocess run nobody holds them, so the instance is asked too: every run that is
starting, started or being canceled, younger than its ``dagster/max_runtime`` (run monitoring
fails it after that), holds every session it covers (its partition, or its range for a backfill
run), whatever newer runs of the same partition are queued or done. A run whose worker is known
to be gone (:func:`run_worker_gone`: the default run launcher's worker process of this machine
has exited, as after a SIGKILL with no daemon to notice) holds nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import dagster as dg
import psutil

from corr_pipeline import settings
from corr_pipeline.defs.partitions import snapshot_partitions

__all__ = [
    "PARTITION_TAG",
    "RANGE_END_TAG",
    "RANGE_START_TAG",
    "partitions_in_flight",
    "run_sessions",
    "run_worker_gone",
]

PARTITION_TAG = "dagster/partition"
#: The tags of a run over a range of sessions (a backfill run, ``BackfillPolicy.multi_run``).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
_IN_FLIGHT = [
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def run_sessions(tags: Mapping[str, str]) -> list[str]:
    """The session keys a run covers, from its tags: its partition, or every snapshot partition
    of its range (a backfill run); none for a run that is not of snapshot partitions."""
    if PARTITION_TAG in tags:
        return [tags[PARTITION_TAG]]
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if not start or not end:
        return []
    keys = snapshot_partitions.get_partition_keys()
    return [key for key in keys if start <= key <= end]


def run_worker_gone(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """True when ``run``'s worker is known to have exited: the instance launches workers as
    processes of this machine (the default run launcher) and the pid of its ``RUN_START`` event
    no longer exists. False when that cannot be told (another launcher, no start event yet)."""

    if not isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        return False
    started = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.RUN_START, limit=1
    ).records
    event = started[0].event_log_entry.dagster_event if started else None
    pid = event.pid if event is not None else None
    return pid is not None and not psutil.pid_exists(pid)


def partitions_in_flight(
    instance: dg.DagsterInstance, *, exclude_run_id: str | None = None, limit: int = 100
) -> set[str]:
    """Partition keys of the runs in flight in ``instance`` (see the module docstring), except
    the run ``exclude_run_id`` (the caller's own)."""
    now = dt.datetime.now(dt.UTC).timestamp()
    out: set[str] = set()
    records = instance.get_run_records(filters=dg.RunsFilter(statuses=_IN_FLIGHT), limit=limit)
    for record in records:
        run = record.dagster_run
        keys = [k for k in run_sessions(run.tags) if k not in out]
        if not keys or run.run_id == exclude_run_id:
            continue
        started = record.start_time or record.create_timestamp.timestamp()
        try:
            max_runtime = float(run.tags.get("dagster/max_runtime", ""))
        except ValueError:
            max_runtime = float(settings.max_runtime_seconds())
        if now - started > max_runtime or run_worker_gone(instance, run):
            continue
        out.update(keys)
    return out
