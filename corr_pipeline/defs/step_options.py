"""What the snapshot op declares: its assets' group, its partitions, how many sessions a
backfill run covers, one concurrency pool, and the key of the matrix-store IO manager."""

from __future__ import annotations

import warnings
from typing import Any

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.defs.partitions import snapshot_partitions
from corr_pipeline.defs.pool import SNAPSHOT_POOL
from corr_pipeline.snapshot import sizing
from corr_pipeline.snapshot.params import DEFAULTS

# BackfillPolicy is "beta" in Dagster 1.13; it is relied on deliberately (sessions per run), so exactly that warning is silenced instead of printed for every asset in every process.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)

#: The asset group of the snapshot (the job selects it).
SNAPSHOT_GROUP = "correlation_snapshot"
#: Resource key of the matrix-store IO manager.
MATRIX_IO_MANAGER = "matrix_io_manager"


def backfill_sessions_per_run() -> int:
    """Consecutive sessions one run of a backfill covers: ``$CORR_PIPELINE_SESSIONS_PER_RUN``,
    else :func:`corr_pipeline.snapshot.sizing.sessions_per_run` for
    ``$CORR_PIPELINE_UNIVERSE_SYMBOLS`` symbols, the default lookback and the runs' maximum
    runtime."""
    explicit = settings.sessions_per_run()
    if explicit is not None:
        return explicit
    return sizing.sessions_per_run(
        settings.universe_symbols(), DEFAULTS.lookback_days, settings.max_runtime_seconds()
    )


def backfill_policy(sessions_per_run: int) -> dg.BackfillPolicy:
    """One run for any range when a run may hold ten years of sessions
    (:data:`~corr_pipeline.snapshot.sizing.MAX_SESSIONS_PER_RUN`: then ``dg launch
    --partition-range`` works too), else runs of ``sessions_per_run`` consecutive sessions."""
    if sessions_per_run >= sizing.MAX_SESSIONS_PER_RUN:
        return dg.BackfillPolicy.single_run()
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=sessions_per_run)


#: How an asset backfill over a range splits it into runs (the op computes a run's sessions
#: one after the other, :mod:`corr_pipeline.defs.assets`).
SESSIONS_PER_RUN = backfill_policy(backfill_sessions_per_run())

#: Options of the snapshot op: its partitions, sessions per backfill run, one pool.
SNAPSHOT_STEP: dict[str, Any] = dict(
    partitions_def=snapshot_partitions, backfill_policy=SESSIONS_PER_RUN, pool=SNAPSHOT_POOL
)
