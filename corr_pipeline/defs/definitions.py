"""The ``Definitions`` of the code location, built from the assets, jobs and resources.

Assets (group ``correlation_snapshot``, weekday partitions), their checks, ``snapshot_job``,
the nightly schedule, and the resources:

- ``snapshot_params`` (:class:`SnapshotParams`): one validated parameter set for the whole graph;
- ``postgres`` (:class:`PostgresResource`): ``$CORR_PIPELINE_DATABASE_URL`` or the embedded server;
- ``prices_sensor_settings`` (:class:`PricesSensorSettings`): when ``prices_ready_sensor`` (the
  alternative to the schedule, :mod:`corr_pipeline.defs.sensors`) finds a session's prices in;
- ``price_source`` (:class:`PriceSourceResource`): the table or view the window reads
  (``$CORR_PIPELINE_PRICES_TABLE`` / ``_COLUMNS`` / ``_TIMEZONE`` when the run starts; default
  the project's ``prices``);
- ``io_manager``: Dagster's default (``FilesystemIOManager``), its ``base_dir`` a literal;
- ``matrix_io_manager`` / ``matrix_store``: the matrix store under
  ``$CORR_PIPELINE_STORE_DIR`` (default ``$CORR_PIPELINE_HOME/store``).
  ``matrix_store.keep_matrices`` (default ``$CORR_PIPELINE_KEEP_MATRICES``, else 5) is the
  retention ``snapshot_publication`` applies after each publication.

Where a run connects, reads and writes (the database, the store, the price source, the Dask
scheduler) is the environment of the code location's processes, read when a run uses it: no
resource has a config field for it, so run config cannot choose it
(:mod:`corr_pipeline.defs.resources`). The fields run config may set take literal values only,
never ``{env: VAR}`` (:mod:`corr_pipeline.defs.literal_config`).

The code location itself is :mod:`corr_pipeline.definitions` (``defs = build_definitions()``).
"""

from __future__ import annotations

import dagster as dg

from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.executor import snapshot_executor
from corr_pipeline.defs.io_manager import MatrixStoreIOManager, MatrixStoreResource
from corr_pipeline.defs.jobs import nightly_snapshot_schedule, snapshot_job
from corr_pipeline.defs.literal_config import literal_resource
from corr_pipeline.defs.monitoring import (
    publication_freshness_check,
    publication_freshness_sensor,
    snapshot_failure_sensor,
)
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.defs.sensors import PricesSensorSettings, prices_ready_sensor
from corr_pipeline.defs.step_options import MATRIX_IO_MANAGER

__all__ = ["build_definitions", "build_resources"]


def build_resources() -> dict[str, object]:
    """Resources of the code location (module docstring); those with run config fields take
    literals only (:func:`~corr_pipeline.defs.literal_config.literal_resource`)."""
    return {
        "snapshot_params": literal_resource(SnapshotParams()),
        "postgres": PostgresResource(),
        "price_source": PriceSourceResource(),
        "prices_sensor_settings": literal_resource(PricesSensorSettings()),
        MATRIX_IO_MANAGER: MatrixStoreIOManager(),
        "matrix_store": literal_resource(MatrixStoreResource()),
        "io_manager": literal_resource(dg.FilesystemIOManager()),  # Dagster's default
    }


def build_definitions() -> dg.Definitions:
    """The assets, ``snapshot_job``, the nightly schedule, :func:`build_resources` and the
    executor of every run
    (:mod:`corr_pipeline.defs.executor`)."""
    return dg.Definitions(
        assets=snapshot_assets,
        asset_checks=[publication_freshness_check],
        jobs=[snapshot_job],
        schedules=[nightly_snapshot_schedule],
        sensors=[prices_ready_sensor, publication_freshness_sensor, snapshot_failure_sensor],
        resources=build_resources(),
        executor=snapshot_executor,
    )
