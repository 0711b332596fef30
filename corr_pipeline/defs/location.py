"""What the code location holds beyond the modules that declare it: the resources and executor
of every run, and :func:`build_definitions`, which collects this folder the way ``dg`` collects a
project's ``defs`` folder.

Every module of ``corr_pipeline/defs/`` is loaded and its Dagster objects gathered: the assets
(group ``correlation_snapshot``, weekday partitions, :mod:`~corr_pipeline.defs.assets`), their
checks, ``snapshot_job`` and the nightly schedule (:mod:`~corr_pipeline.defs.jobs`), the sensors
(:mod:`~corr_pipeline.defs.sensors`, :mod:`~corr_pipeline.defs.monitoring`); a definition added
to a module of the folder is in the location, nothing to register. This module's
:func:`resources_and_executor` adds the executor (:mod:`corr_pipeline.defs.executor`) and the
resources:

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

The code location itself is :mod:`corr_pipeline.definitions` (``defs = build_definitions()``),
the module ``dg`` loads by default for the project's root module.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import dagster as dg

import corr_pipeline.defs
from corr_pipeline.defs.executor import snapshot_executor
from corr_pipeline.defs.io_manager import MatrixStoreIOManager, MatrixStoreResource
from corr_pipeline.defs.literal_config import literal_resource
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.defs.sensors import PricesSensorSettings
from corr_pipeline.defs.step_options import MATRIX_IO_MANAGER

__all__ = ["build_definitions", "build_resources", "resources_and_executor"]

#: The directory that holds the package: the repository root in a checkout, ``site-packages``
#: when installed. ``dg.load_from_defs_folder`` would look for ``pyproject.toml`` above the
#: package, which an installed package (the user code image) has not.
PROJECT_ROOT = Path(corr_pipeline.defs.__file__).resolve().parents[2]


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


@dg.definitions
def resources_and_executor() -> dg.Definitions:
    """The part of the location no other module declares: :func:`build_resources` (fresh at
    each load) and the executor of every run. (A module of the folder with a ``Definitions``
    object or ``@definitions`` function contributes that alone, so this module holds nothing
    else that is a definition.)"""
    return dg.Definitions(resources=build_resources(), executor=snapshot_executor)


def build_definitions() -> dg.Definitions:
    """Every definition of ``corr_pipeline/defs/`` merged into one ``Definitions``: the
    component tree ``dg.load_from_defs_folder`` builds for the project's defs module, rooted
    at :data:`PROJECT_ROOT`, so an installed package loads as a checkout does. Dagster's
    "preview" warning about the module scan it uses is silenced, as ``load_from_defs_folder``
    silences it."""
    tree = dg.ComponentTree.from_module(defs_module=corr_pipeline.defs, project_root=PROJECT_ROOT)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Function `load_definitions_from_module")
        return tree.build_defs()
