"""What every snapshot asset shares: its group, its partitions, how many sessions a backfill
run covers, one concurrency pool, and (for the steps whose output is a matrix) the
matrix-store IO manager."""

from __future__ import annotations

import warnings
from typing import Any

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.defs.partitions import snapshot_partitions
from corr_pipeline.snapshot import sizing
from corr_pipeline.snapshot.params import DEFAULTS

# BackfillPolicy is "beta" in Dagster 1.13; it is relied on deliberately (sessions per run), so exactly that warning is silenced instead of printed for every asset in every process.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
# Likewise a partitioned asset check ("preview" in 1.13; Dagster is pinned to an exact version):
# the injected_pairs_found check must load the one partition of lead_lag_pairs its run computed.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

#: The asset group of the snapshot (the job selects it).
SNAPSHOT_GROUP = "correlation_snapshot"
#: The concurrency pool every snapshot asset declares: how many snapshot runs at once
#: (:mod:`corr_pipeline.defs.concurrency`).
SNAPSHOT_POOL = "corr_pipeline_snapshot"
#: Resource key of the matrix-store IO manager.
MATRIX_IO_MANAGER = "matrix_io_manager"


def backfill_sessions_per_run() -> int:
    """Consecutive sessions one run of a backfill covers: ``$CORR_PIPELINE_SESSIONS_PER_RUN``,
    else :func:`corr_pipeline.snapshot.sizing.sessions_per_run` for
    ``$CORR_PIPELINE_UNIVERSE_SYMBOLS`` symbols and the default parameters on this machine."""
    explicit = settings.sessions_per_run()
    if explicit is not None:
        return explicit
    return sizing.sessions_per_run(
        settings.universe_symbols(), DEFAULTS.lookback_days, DEFAULTS.working_memory_mb
    )


#: An asset backfill over a range runs ``K`` consecutive sessions per run (the assets compute
#: them session by session, :mod:`corr_pipeline.defs.ranges`).
SESSIONS_PER_RUN = dg.BackfillPolicy.multi_run(max_partitions_per_run=backfill_sessions_per_run())

#: Options of every snapshot step: its partitions, sessions per backfill run, one pool.
SNAPSHOT_STEP: dict[str, Any] = dict(
    partitions_def=snapshot_partitions, backfill_policy=SESSIONS_PER_RUN, pool=SNAPSHOT_POOL
)
#: ... and of the steps whose output goes through the matrix store.
MATRIX_STEP: dict[str, Any] = dict(
    SNAPSHOT_STEP, group_name=SNAPSHOT_GROUP, io_manager_key=MATRIX_IO_MANAGER
)
