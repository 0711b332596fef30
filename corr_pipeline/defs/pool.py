"""The concurrency pool of the snapshot runs: its name, and its limit in an instance's storage.

Every snapshot asset declares the pool :data:`SNAPSHOT_POOL`; with ``dagster.yaml``'s pools at
``granularity: run`` a run containing any of them stays queued while ``limit`` such runs are in
progress (:mod:`corr_pipeline.defs.concurrency`).

**The pool exists from the start.** Dagster 1.13's queued-run daemon applies the pools'
``default_limit`` only to a pool that has a row in the instance's storage, and on a pass that
finds the pool without one it creates the row too late for that pass:
``QueuedRunCoordinatorDaemon._get_runs_to_dequeue`` reads the configured pool keys once
(``event_log_storage.get_concurrency_keys()``) and hands them to
``GlobalOpConcurrencyLimitsCounter``, whose ``__init__`` then creates the row
(``_initialize_pool_limits`` -> ``initialize_concurrency_limit_to_default``) but fetches slot
counts only for the keys read *before* (``concurrency_keys.intersection(queued_pool_names)``),
so ``is_blocked`` sees "no limit set for this key" and that first pass launches every queued
snapshot run at once (a backfill of three sessions: three runs, with ``concurrency show``
saying 1).

:func:`ensure_snapshot_pool` creates the row beforehand, at the default and marked as such (so
it still reads as not explicit, and follows ``default_limit`` when that changes). The project's
instance class, :class:`corr_pipeline.defs.instance_storage.SnapshotInstance`, calls it whenever
an instance is opened, so every process that opens one (``dagster-daemon run``, ``dg dev``, the
web server, ``dagster`` and ``corr-pipeline`` commands, run workers) leaves the pool in storage
before its daemon's first pass. :func:`corr_pipeline.defs.run.open_instance` and ``corr-pipeline
ui`` call it too, for an instance of another class (``deploy/dagster.yaml``'s). Not done by the
code location or a sensor: loading definitions has no instance (and must not write to one), and
a sensor tick is not ordered before the run queue's pass.

This module needs Dagster only: the instance class imports it in every process that opens the
instance (the daemon and the web server load no code location).
"""

from __future__ import annotations

import dagster as dg

__all__ = ["SNAPSHOT_POOL", "ensure_snapshot_pool"]

#: The concurrency pool every snapshot asset declares: how many snapshot runs at once
#: (:mod:`corr_pipeline.defs.concurrency`).
SNAPSHOT_POOL = "corr_pipeline_snapshot"


def ensure_snapshot_pool(instance: dg.DagsterInstance) -> bool:
    """Create the pool :data:`SNAPSHOT_POOL` in ``instance``'s storage at the pools'
    ``default_limit`` when it has no row there (or a row from an older default), the way
    Dagster's own daemon and step launcher do (``initialize_concurrency_limit_to_default``: the
    row is marked as from the default, so
    :func:`corr_pipeline.defs.concurrency.instance_limits` still reports it as not explicit). A
    limit set explicitly is never touched; without a ``default_limit`` or a storage with pool
    limits nothing is written. Returns whether it wrote. Needed so the limit holds on the
    daemon's very first pass (see the module docstring)."""
    storage = instance.event_log_storage
    default = instance.get_concurrency_config().pool_config.default_pool_limit
    if default is None or not storage.supports_global_concurrency_limits:
        return False
    pool = next((p for p in storage.get_pool_limits() if p.name == SNAPSHOT_POOL), None)
    if pool is not None and (not pool.from_default or pool.limit == default):
        return False
    return storage.initialize_concurrency_limit_to_default(SNAPSHOT_POOL)
