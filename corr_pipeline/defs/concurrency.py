"""How many snapshot runs the Dagster instance starts at once, and one run per partition.

Two limits of the run queue (``dagster.yaml``, dequeued by the daemon), both enforced before a
run starts:

- **The pool.** Every snapshot asset declares the pool :data:`SNAPSHOT_POOL`
  (:mod:`corr_pipeline.defs.step_options`), and ``dagster.yaml`` sets the pools' granularity to
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

**The pool exists from the start.** Dagster 1.13's queued-run daemon applies ``default_limit``
only to a pool that has a row in the instance's storage, and on a pass that finds the pool
without one it creates the row too late for that pass:
``QueuedRunCoordinatorDaemon._get_runs_to_dequeue`` reads the configured pool keys once
(``event_log_storage.get_concurrency_keys()``) and hands them to
``GlobalOpConcurrencyLimitsCounter``, whose ``__init__`` then creates the row
(``_initialize_pool_limits`` -> ``initialize_concurrency_limit_to_default``) but fetches slot
counts only for the keys read *before* (``concurrency_keys.intersection(queued_pool_names)``),
so ``is_blocked`` sees "no limit set for this key" and that first pass launches every queued
snapshot run at once (a backfill of three sessions: three runs, with ``concurrency show``
saying 1). :func:`ensure_snapshot_pool` creates the row beforehand, at the default and marked
as such (so it still reads as not explicit, and follows ``default_limit`` when that changes);
:func:`corr_pipeline.defs.run.open_instance` calls it, so every ``corr-pipeline`` command that
opens the instance (``ui`` before it starts the daemon, ``demo``, ``concurrency show|set``,
``bench``) leaves the pool in storage and the limit holds from the daemon's first pass. Not done
by the code location or a sensor: loading definitions has no instance (and must not write to
one), and a sensor tick is not ordered before the run queue's pass. A ``dg dev`` or
``dagster-daemon run`` started directly on a fresh instance therefore still needs the pool
created once first: any ``corr-pipeline concurrency show`` (or ``set``), or ``dagster instance
concurrency set corr_pipeline_snapshot N``, on the same ``DAGSTER_HOME``.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from corr_pipeline.defs.runs import PARTITION_TAG
from corr_pipeline.defs.step_options import SNAPSHOT_POOL

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


def ensure_snapshot_pool(instance: dg.DagsterInstance) -> bool:
    """Create the pool :data:`SNAPSHOT_POOL` in ``instance``'s storage at the pools'
    ``default_limit`` when it has no row there (or a row from an older default), the way
    Dagster's own daemon and step launcher do (``initialize_concurrency_limit_to_default``: the
    row is marked as from the default, so :func:`instance_limits` still reports it as not
    explicit). A limit set explicitly is never touched; without a ``default_limit`` or a
    storage with pool limits nothing is written. Returns whether it wrote. Needed so the limit
    holds on the daemon's very first pass (see the module docstring)."""
    storage = instance.event_log_storage
    default = instance.get_concurrency_config().pool_config.default_pool_limit
    if default is None or not storage.supports_global_concurrency_limits:
        return False
    pool = next((p for p in storage.get_pool_limits() if p.name == SNAPSHOT_POOL), None)
    if pool is not None and (not pool.from_default or pool.limit == default):
        return False
    return storage.initialize_concurrency_limit_to_default(SNAPSHOT_POOL)
