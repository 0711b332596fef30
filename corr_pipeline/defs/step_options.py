"""What every snapshot asset shares: its group, its partitions, one partition per run, one
concurrency pool, and (for the steps whose output is a matrix) the matrix-store IO manager."""

from __future__ import annotations

import warnings
from typing import Any

import dagster as dg

from corr_pipeline.defs.partitions import snapshot_partitions

# BackfillPolicy is "beta" in Dagster 1.13; it is relied on deliberately (one partition per
# run), so exactly that warning is silenced instead of printed for every asset in every process.
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

#: One partition per run: the matrix store keeps one bundle per asset and partition.
ONE_PARTITION_PER_RUN = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)

#: Options of every snapshot step: its partitions, one partition per run, one pool.
SNAPSHOT_STEP: dict[str, Any] = dict(
    partitions_def=snapshot_partitions, backfill_policy=ONE_PARTITION_PER_RUN, pool=SNAPSHOT_POOL
)
#: ... and of the steps whose output goes through the matrix store.
MATRIX_STEP: dict[str, Any] = dict(
    SNAPSHOT_STEP, group_name=SNAPSHOT_GROUP, io_manager_key=MATRIX_IO_MANAGER
)
