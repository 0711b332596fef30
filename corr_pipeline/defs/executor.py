"""The executor of every snapshot run: its one step in the run worker's own process.

A run of ``snapshot_job`` is one step, the op that computes every session of the run
(:mod:`corr_pipeline.defs.assets`), so a separate step process would only add its start-up
(6-10 s on a 2-core machine, 25 s under load) and hold the same memory.
:data:`snapshot_executor` is Dagster's ``multi_or_in_process`` executor (the same
``execution`` config: ``in_process`` or ``multiprocess``, so the launchpad can still choose)
whose *default* is ``in_process``: runs created without an execution config (the daemon's
asset backfills, the asset graph's *Materialize*, the schedule, the sensor) run in the run
worker, the kernels loaded once per run.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from corr_pipeline.defs.dagster_private import IN_PROC_CONFIG, MULTI_PROC_CONFIG

__all__ = ["DEFAULT_EXECUTION", "FORKSERVER_CONFIG", "snapshot_executor"]

#: ``multiprocess`` config: step processes forked from a forkserver that preloaded the location.
FORKSERVER_CONFIG: dict[str, Any] = {
    "start_method": {"forkserver": {"preload_modules": ["corr_pipeline.definitions"]}}
}
#: The executor config a run gets when it names none.
DEFAULT_EXECUTION: dict[str, Any] = {"in_process": {}}

snapshot_executor = dg.ExecutorDefinition(
    name="snapshot_executor",
    config_schema=dg.Field(
        dg.Selector({"multiprocess": MULTI_PROC_CONFIG, "in_process": IN_PROC_CONFIG}),
        default_value=DEFAULT_EXECUTION,
    ),
    executor_creation_fn=dg.multi_or_in_process_executor.executor_creation_fn,
    requirements=dg.multi_or_in_process_executor.get_requirements,
    description="The run's one step in the run worker's process (a step process would only "
    "add its start-up).",
)
