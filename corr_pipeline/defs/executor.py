"""The executor of every snapshot run: one process where the run fits, one process per step
where memory needs it.

A step process costs 6-10 s of start-up on a 2-core machine (25 s under load), far more than
the work of a small universe. :data:`snapshot_executor` is Dagster's ``multi_or_in_process``
executor (the same ``execution`` config: ``in_process`` or ``multiprocess``, so the launchpad
and :func:`corr_pipeline.defs.run.snapshot_run_config` can still choose) whose *default* follows
:func:`corr_pipeline.snapshot.sizing.fits_one_process` for ``$CORR_PIPELINE_UNIVERSE_SYMBOLS``
symbols and the default parameters on this machine:

- fits: ``in_process`` (every step in the run worker, kernels loaded once per run);
- does not: ``multiprocess`` with a forkserver that has preloaded the code location, so a step
  process starts in well under a second instead of re-importing everything.

Runs created without an execution config (the daemon's asset backfills, the asset graph's
*Materialize*, the schedule) therefore run in one process whenever the machine allows.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster._core.definitions.executor_definition import (
    IN_PROC_CONFIG,
    MULTI_PROC_CONFIG,
    multi_or_in_process_executor,
)

from corr_pipeline import settings
from corr_pipeline.snapshot import sizing
from corr_pipeline.snapshot.params import DEFAULTS

__all__ = ["FORKSERVER_CONFIG", "default_execution", "snapshot_executor"]

#: ``multiprocess`` config: step processes forked from a forkserver that preloaded the location.
FORKSERVER_CONFIG: dict[str, Any] = {
    "start_method": {"forkserver": {"preload_modules": ["corr_pipeline.definitions"]}}
}


def default_execution() -> dict[str, Any]:
    """The executor config a run gets when it names none (module docstring)."""
    if sizing.fits_one_process(
        settings.universe_symbols(), DEFAULTS.lookback_days, DEFAULTS.working_memory_mb
    ):
        return {"in_process": {}}
    return {"multiprocess": dict(FORKSERVER_CONFIG)}


snapshot_executor = dg.ExecutorDefinition(
    name="snapshot_executor",
    config_schema=dg.Field(
        dg.Selector({"multiprocess": MULTI_PROC_CONFIG, "in_process": IN_PROC_CONFIG}),
        default_value=default_execution(),
    ),
    executor_creation_fn=multi_or_in_process_executor.executor_creation_fn,
    requirements=multi_or_in_process_executor.get_requirements,
    description="One process when the run fits the machine's memory, else one per step "
    "(corr_pipeline.snapshot.sizing).",
)
