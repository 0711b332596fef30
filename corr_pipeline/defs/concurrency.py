"""How many snapshot runs the Dagster instance starts at once, and one run per partition.

Two limits of the run queue (``dagster.yaml``, dequeued by the daemon), both enforced before a
run starts:

- **The pool.** Every snapshot asset declares the pool :data:`SNAPSHOT_POOL`
  (:mod:`corr_pipeline.defs.pool`, :mod:`corr_pipeline.defs.step_options`), and ``dagster.yaml`` sets the pools' granularity to
  ``run``: a run containing any of them stays queued while ``limit`` such runs are in progress,
  however it was launched (``snapshot_job``, the schedule, the sensor, a backfill, the asset
  graph's *Materialize*). The limit is the number of runs that fit the machine's memory
  (:mod:`corr_pipeline.snapshot.sizing`). It lives in the instance's storage, where
  :func:`set_snapshot_runs_limit` (``corr-pipeline concurrency set``), ``dagster instance
  concurrency set`` and the UI (Deployment → Concurrency) write it; until then the pools'
  ``default_limit`` of ``dagster.yaml`` (1) applies. Not in ``dagster.yaml``: its pool and run
  limits are plain integers there (no ``env:``), and a change in storage takes effect at the
  daemon's next dequeue, without a restart.
- **One run per partition.** ``concurrency.runs.tag_concurrency_limits`` limits the tag
  ``dagster/partition`` to 1 run per unique value (``applyLimitPerUniqueValue``): two runs of
  the same date (a backfill next to the nightly run, a re-execution) never overlap, while runs
  of different dates, which write different store folders and publish different dates, may.

**The pool exists from the start**: the instance class creates it at its default limit whenever
an instance is opened, so the limit holds from the daemon's first pass
(:mod:`corr_pipeline.defs.pool`, :func:`ensure_snapshot_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from corr_pipeline.defs.pool import SNAPSHOT_POOL, ensure_snapshot_pool
from corr_pipeline.defs.runs import PARTITION_TAG

__all__ = ["InstanceLimits", "ensure_snapshot_pool", "instance_limits", "set_snapshot_runs_limit"]


@dataclass(frozen=True)
class InstanceLimits:
    """The run queue's limits that concern snapshot runs, as the instance has them."""

    #: runs of the pool at once: the stored limit, else the pools' default_limit (None: no limit)
    snapshot_runs: int | None
    #: whether ``snapshot_runs`` was set explicitly (storage) rather than from the default
    explicit: bool
    #: ``concurrency.runs.max_concurrent_runs`` (-1: no limit)
    max_concurrent_runs: int
    #: the ``dagster/partition`` per-value limit, None when dagster.yaml sets none
    per_partition: int | None
    #: the pools' granularity (``run`` is what makes the pool count runs)
    granularity: str | None


def instance_limits(instance: dg.DagsterInstance) -> InstanceLimits:
    """Read the limits of ``instance`` (its ``dagster.yaml`` and its storage)."""
    config = instance.get_concurrency_config()
    stored = {p.name: p for p in instance.event_log_storage.get_pool_limits()}
    pool = stored.get(SNAPSHOT_POOL)
    default = config.pool_config.default_pool_limit
    explicit = pool is not None and not pool.from_default
    limit = pool.limit if explicit and pool is not None else default
    queue = config.run_queue_config
    per_partition = None
    for tag_limit in (queue.tag_concurrency_limits if queue else None) or []:
        value = tag_limit.get("value")
        if (
            tag_limit["key"] == PARTITION_TAG
            and isinstance(value, dict)
            and value.get("applyLimitPerUniqueValue")
        ):
            per_partition = int(tag_limit["limit"])
    granularity = config.pool_config.pool_granularity
    return InstanceLimits(
        snapshot_runs=limit,
        explicit=explicit,
        max_concurrent_runs=queue.max_concurrent_runs if queue else -1,
        per_partition=per_partition,
        granularity=granularity.value if granularity else None,
    )


def set_snapshot_runs_limit(instance: dg.DagsterInstance, limit: int) -> InstanceLimits:
    """Store ``limit`` as the pool's limit (what ``dagster instance concurrency set`` does).
    ValueError when it is below 1 or above the instance's ``max_concurrent_runs`` (which would
    cap it silently)."""
    if limit < 1:
        raise ValueError(f"the limit of snapshot runs must be >= 1, got {limit}")
    cap = instance_limits(instance).max_concurrent_runs
    if 0 <= cap < limit:
        raise ValueError(
            f"{limit} snapshot runs at once exceed concurrency.runs.max_concurrent_runs = {cap} "
            "of dagster.yaml; raise that first"
        )
    instance.event_log_storage.set_concurrency_slots(SNAPSHOT_POOL, limit)
    return instance_limits(instance)
