"""Which partitions have a snapshot run in flight, according to the Dagster instance.

Retention (:mod:`corr_pipeline.snapshot.retention`) leaves alone a partition that another process
holds (every step holds the partitions it uses, :mod:`corr_pipeline.defs.io_manager`); between two
steps of a multiprocess run nobody holds them, so the instance is asked too: a partition is in
flight when its newest run is starting, started or being canceled, and younger than its
``dagster/max_runtime`` (run monitoring fails it after that); a run over a range of sessions (a
backfill run) holds every session of its range. A run killed without the daemon
noticing stays "started" in the instance: the first newer run of its partition, or its maximum
runtime, ends that.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.defs.partitions import snapshot_partitions

__all__ = [
    "PARTITION_TAG",
    "RANGE_END_TAG",
    "RANGE_START_TAG",
    "run_sessions",
    "partitions_in_flight",
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
        if now - started > max_runtime:
            continue
        if PARTITION_TAG not in run.tags:  # a range run in flight holds all of its sessions
            out.update(keys)
            continue
        newest = instance.get_runs(filters=dg.RunsFilter(tags={PARTITION_TAG: keys[0]}), limit=1)
        if newest and newest[0].run_id == run.run_id:
            out.add(keys[0])
    return out
