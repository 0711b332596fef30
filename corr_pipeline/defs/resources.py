"""Dagster resources: the snapshot parameters every asset shares, the PostgreSQL connection, and
the price source (:class:`PriceSourceResource`, at the end).

**Where a run connects, reads and writes is deployment configuration, never run config.** The
database, the matrix store's directory, the price source relation and the Dask scheduler come
from the environment of the code location (the environment, ``.env`` in the project root:
:mod:`corr_pipeline.settings`); no resource has a config field for them, so a launchpad or a run
config that names one is refused by Dagster's config check before the run is created (SPEC §7,
docs/operations.md, threat model). The launchpad sets the numerical parameters only, as values
written out: the code location binds these resources with literal-only schemas, so ``{env: VAR}``
is refused too (:mod:`corr_pipeline.defs.literal_config`).

``SnapshotParams`` is a resource rather than per-asset ``Config`` so that one set of numbers
drives the whole graph; it is the launchpad face of
:class:`corr_pipeline.snapshot.params.SnapshotParameters`: the parameters declared there that a
run sets, with their defaults, help and rules. The rules are checked by pydantic when the
resource is built: in Python at construction, and for launchpad / run-config overrides at
resource initialisation, before any asset body runs. Every message names the offending field.

Override in run config, e.g.::

    resources:
      snapshot_params:
        config:
          lookback_days: 126
          min_history_days: 100
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import ConfigDict, Field, model_validator

from corr_pipeline import settings
from corr_pipeline.db.price_source import (
    PriceSource,
    ResolvedPriceSource,
    resolve_price_source,
)
from corr_pipeline.snapshot.params import (
    BY_NAME,
    PARAMETERS,
    SnapshotParameters,
    parameter_problems,
)
from corr_pipeline.snapshot.scheduler import check_scheduler

#: What a run might name to choose where it connects, reads or writes, and the deployment
#: setting that decides it instead.
LOCATION_SETTINGS = {
    "dask_scheduler": settings.ENV_DASK_SCHEDULER,
    "database_url": settings.ENV_DATABASE_URL,
    "base_dir": settings.ENV_STORE_DIR,
    "store_dir": settings.ENV_STORE_DIR,
    "table": settings.ENV_PRICES_TABLE,
    "columns": settings.ENV_PRICES_COLUMNS,
    "timezone": settings.ENV_PRICES_TIMEZONE,
}


def refuse_locations(params: Mapping[str, Any]) -> None:
    """ValueError, one line, when ``params`` (run parameters) name where a run connects, reads
    or writes (:data:`LOCATION_SETTINGS`): that is deployment configuration."""
    named = [name for name in params if name in LOCATION_SETTINGS]
    if named:
        raise ValueError(
            f"{named[0]} chooses where a run connects, reads or writes: it is deployment "
            f"configuration (${LOCATION_SETTINGS[named[0]]} in the code location's environment "
            "or the project's .env), never a run parameter"
        )


def launchpad_field(name: str) -> Any:
    """The launchpad field of the snapshot parameter ``name``: its declared default and help
    (:mod:`corr_pipeline.snapshot.params`)."""
    declared = BY_NAME[name]
    return Field(default=declared.default, description=declared.help)


class SnapshotParams(dg.ConfigurableResource):
    """Parameters of one correlation snapshot (SPEC §2-§6), validated as a whole. A refused
    value is never repeated in the error (``hide_input_in_errors``; the messages of
    :func:`~corr_pipeline.snapshot.params.parameter_problems` say what a text field allows,
    not what it was given): the error lands in the run's event log.

    One field per launchpad parameter of :data:`corr_pipeline.snapshot.params.PARAMETERS`, its
    default and help read from there (:func:`launchpad_field`). The names and types are
    written out because mypy and Dagster's resource machinery need a class with static fields;
    ``corr_pipeline_tests/snapshot/test_parameter_table.py`` pins them to the declarations."""

    # a field it does not have is an error; pydantic's errors leave the input out
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    lookback_days: int = launchpad_field("lookback_days")
    min_history_days: int = launchpad_field("min_history_days")
    min_overlap: int = launchpad_field("min_overlap")
    k_neighbors: int = launchpad_field("k_neighbors")
    max_lag: int = launchpad_field("max_lag")
    k_leaders: int = launchpad_field("k_leaders")
    k_laggers: int = launchpad_field("k_laggers")
    min_improvement: float = launchpad_field("min_improvement")
    max_q_value: float = launchpad_field("max_q_value")
    lead_lag_market_modes: int = launchpad_field("lead_lag_market_modes")
    linkage_method: str = launchpad_field("linkage_method")
    distance_threshold: float | None = launchpad_field("distance_threshold")
    n_clusters: int | None = launchpad_field("n_clusters")
    market_modes_removed: int = launchpad_field("market_modes_removed")
    max_zero_return_share: float = launchpad_field("max_zero_return_share")
    max_abs_return: float = launchpad_field("max_abs_return")
    drop_suspect: bool = launchpad_field("drop_suspect")
    working_memory_mb: float = launchpad_field("working_memory_mb")
    clusters_memory_mb: int = launchpad_field("clusters_memory_mb")

    @model_validator(mode="after")
    def _check_consistency(self) -> SnapshotParams:
        problems = parameter_problems(self._values())
        if problems:
            raise ValueError("invalid snapshot parameters: " + "; ".join(problems))
        return self

    def _values(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in PARAMETERS if p.launchpad}

    def to_parameters(self) -> SnapshotParameters:
        """The Dagster-free value every step takes, with the deployment's Dask scheduler
        (``$CORR_PIPELINE_DASK_SCHEDULER``, read when the step runs; unset: threads), checked
        by :func:`corr_pipeline.snapshot.scheduler.check_scheduler`: a refused address fails
        the run's first step, before it connects to anything."""
        scheduler = settings.dask_scheduler()
        if scheduler is not None:
            check_scheduler(scheduler)
        return SnapshotParameters(**self._values(), dask_scheduler=scheduler)

    def as_dict(self) -> dict[str, Any]:
        """The parameters as plain JSON values (recorded in ``snapshots.params``, SPEC §7)."""
        return self.to_parameters().as_dict()


class PostgresResource(dg.ConfigurableResource):
    """The project PostgreSQL (prices in, snapshots out): ``$CORR_PIPELINE_DATABASE_URL`` if set,
    else the embedded server under ``$CORR_PIPELINE_HOME/pgdata`` (deployment configuration:
    nothing in run config chooses it). Only :meth:`describe` (no credentials) is ever logged.
    """

    model_config = ConfigDict(extra="forbid")  # a field it does not have is an error

    def get_engine(self) -> sa.Engine:
        """A pooled engine (cached per URL by :func:`corr_pipeline.db.engine.get_engine`) on a
        database whose schema is at the code's revision.

        Raises :class:`corr_pipeline.db.engine.DatabaseUnavailableError` (retryable, no
        credentials in the message) when the server cannot be reached, and
        :class:`corr_pipeline.db.migrate.SchemaVersionError` (not retried; one line naming
        ``corr-pipeline db upgrade`` or ``db init``) when the schema is older, newer or absent:
        the pipeline never migrates.
        """
        from corr_pipeline.db.engine import get_engine
        from corr_pipeline.db.migrate import require_current

        engine = get_engine()
        require_current(engine)
        return engine

    def describe(self) -> str:
        """``host[:port]/database`` of the configured server, without credentials."""
        from corr_pipeline.db.engine import database_url, describe_url

        return describe_url(database_url())


class PriceSourceResource(dg.ConfigurableResource):
    """Where the window reads daily prices: a table or view and its symbol, trade-date and
    price columns (:mod:`corr_pipeline.db.price_source`). Read-only; never written.

    A resource of its own rather than part of :class:`PostgresResource`: the connection (where
    the pipeline reads *and* publishes) and the price source (what it reads, never writes) vary
    independently, and the assets and sensors that only need to know which prices exist take
    this one. The source lives in the database of ``postgres``; a table on another server is
    reached through a foreign table (``postgres_fdw``) there.

    Deployment configuration, read when the run starts: ``$CORR_PIPELINE_PRICES_TABLE``
    (default ``prices``), ``$CORR_PIPELINE_PRICES_COLUMNS`` (default
    ``symbol,trade_date,close``), ``$CORR_PIPELINE_PRICES_TIMEZONE`` (default ``UTC``). A
    malformed value, a missing relation or column, or an unusable type fails the run's first
    step with one line naming the problem, not retried (``returns_matrix``, before any price is
    read).
    """

    model_config = ConfigDict(extra="forbid")  # a field it does not have is an error

    def source(self) -> PriceSource:
        """The parsed source; raises :class:`~corr_pipeline.db.price_source.PriceSourceError`
        naming the variable."""
        return PriceSource.parse(
            settings.prices_table(),
            settings.prices_columns(),
            settings.prices_timezone(),
            names=(
                settings.ENV_PRICES_TABLE,
                settings.ENV_PRICES_COLUMNS,
                settings.ENV_PRICES_TIMEZONE,
            ),
        )

    def resolve(self, engine: sa.Engine) -> ResolvedPriceSource:
        """:meth:`source` checked against the catalog of ``engine``'s database."""
        with engine.connect() as conn:
            return resolve_price_source(conn, self.source())
