"""Which partitions have a snapshot run in flight, according to the Dagster instance.

Retention (:mod:`corr_pipeline.snapshot.retention`) leaves alone a partition that another process
holds (every step holds the partitions it uses, :mod:`corr_pipeline.defs.io_manager`); between two
steps of a multiprocess run nobody holds them, so the instance is asked too: a partition is in
flight when its newest run is starting, started or being canceled, and younger than its
``dagster/max_runtime`` (run monitoring fails it after that). A run killed without the daemon
noticing stays "started" in the instance: the first newer run of its partition, or its maximum
runtime, ends that.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from corr_pipeline import settings

__all__ = ["PARTITION_TAG", "partitions_in_flight"]

PARTITION_TAG = "dagster/partition"
_IN_FLIGHT = [
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


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
        key = run.tags.get(PARTITION_TAG)
        if not key or run.run_id == exclude_run_id or key in out:
            continue
        started = record.start_time or record.create_timestamp.timestamp()
        try:
            max_runtime = float(run.tags.get("dagster/max_runtime", ""))
        except ValueError:
            max_runtime = float(settings.max_runtime_seconds())
        if now - started > max_runtime:
            continue
        newest = instance.get_runs(filters=dg.RunsFilter(tags={PARTITION_TAG: key}), limit=1)
        if newest and newest[0].run_id == run.run_id:
            out.add(key)
    return out
