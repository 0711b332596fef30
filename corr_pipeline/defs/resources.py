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
:class:`corr_pipeline.snapshot.params.SnapshotParameters` (same fields, same defaults, same
rules). Its cross-field rules are checked by pydantic when the resource is built: in Python at construction, and for launchpad /
run-config overrides at resource initialisation, before any asset body runs. Every message
names the offending field.

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
    DEFAULTS,
    FIELD_NAMES,
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


class SnapshotParams(dg.ConfigurableResource):
    """Parameters of one correlation snapshot (SPEC §2-§6), validated as a whole. A refused
    value is never repeated in the error (``hide_input_in_errors``; the messages of
    :func:`~corr_pipeline.snapshot.params.parameter_problems` say what a text field allows,
    not what it was given): the error lands in the run's event log."""

    # a field it does not have is an error; pydantic's errors leave the input out
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    lookback_days: int = Field(
        default=DEFAULTS.lookback_days,
        description="Returns in the window: the last lookback_days + 1 trade dates <= the "
        "snapshot date (SPEC §2). 252 = one trading year.",
    )
    min_history_days: int = Field(
        default=DEFAULTS.min_history_days,
        description="A symbol is kept iff it has at least this many finite returns (and "
        "non-zero variance) in the window; the snapshot fails if the window itself has fewer "
        "returns (SPEC §2).",
    )
    min_overlap: int = Field(
        default=DEFAULTS.min_overlap,
        description="Minimum common finite returns for a correlation (synchronous and lagged) "
        "to be defined; below it the value is NaN (SPEC §3, §6).",
    )
    k_neighbors: int = Field(
        default=DEFAULTS.k_neighbors,
        description="Neighbors published per symbol, by |corr| (SPEC §4).",
    )
    max_lag: int = Field(
        default=DEFAULTS.max_lag, description="Largest lead-lag lag scanned, in days (SPEC §6)."
    )
    k_leaders: int = Field(
        default=DEFAULTS.k_leaders,
        description="Per symbol, its best leaders kept (SPEC §6 selection).",
    )
    k_laggers: int = Field(
        default=DEFAULTS.k_laggers,
        description="Per symbol, its best laggers kept (SPEC §6 selection).",
    )
    min_improvement: float = Field(
        default=DEFAULTS.min_improvement,
        description="A lead-lag candidate needs |lagged corr| - |sync corr| > min_improvement "
        "(SPEC §6).",
    )
    max_q_value: float = Field(
        default=DEFAULTS.max_q_value,
        description="A lead-lag candidate needs a Benjamini-Hochberg q-value <= max_q_value "
        "(SPEC §6 Significance, a test robust to common volatility): 0.05 publishes the "
        "significant pairs only, 1 every symbol's best pairs whatever their q-value.",
    )
    lead_lag_market_modes: int = Field(
        default=DEFAULTS.lead_lag_market_modes,
        description="The lead-lag scans each symbol's returns less its m strongest "
        "eigenportfolios (SPEC §6 Market residuals): 1 takes the market out, so that its own "
        "reversal is not read as one stock leading another; 0 scans the returns themselves "
        "(0 .. 10, and below the symbols kept).",
    )
    linkage_method: str = Field(
        default=DEFAULTS.linkage_method,
        description="Agglomerative linkage: average, single, complete or weighted (SPEC §5).",
    )
    distance_threshold: float | None = Field(
        default=DEFAULTS.distance_threshold,
        description="Cut the dendrogram at this Mantegna distance sqrt(2(1 - corr)); 1.2 "
        "corresponds to corr 0.28. Set to null when using n_clusters (exactly one cut).",
    )
    n_clusters: int | None = Field(
        default=DEFAULTS.n_clusters,
        description="Cut the dendrogram into this many clusters instead of at a distance "
        "(then set distance_threshold to null).",
    )
    market_modes_removed: int = Field(
        default=DEFAULTS.market_modes_removed,
        description="Cluster the correlation without its m strongest eigenmodes (SPEC §5): 0 "
        "clusters corr itself; 1 removes the market mode, so that in a sell-off the sectors "
        "stay apart instead of one cluster. The correlations left are small: with m >= 1 cut "
        "into n_clusters, since the cut at 1.2 leaves many singletons (docs/user_guide.md).",
    )
    max_zero_return_share: float = Field(
        default=DEFAULTS.max_zero_return_share,
        description="A symbol whose share of zero returns (among its finite returns in the "
        "window) exceeds this is reported as suspect: stale or forward-filled closes (SPEC §2; "
        "0 < share <= 1).",
    )
    max_abs_return: float = Field(
        default=DEFAULTS.max_abs_return,
        description="A symbol whose largest |log return| in the window exceeds this is "
        "reported as suspect: a price error or an unadjusted split (SPEC §2; > 0; 0.5 is a "
        "move of +65 % / -39 % in a day).",
    )
    drop_suspect: bool = Field(
        default=DEFAULTS.drop_suspect,
        description="Drop the suspect symbols from the universe before the correlation, "
        "with that reason among the dropped symbols; false: report them and keep them "
        "(SPEC §2).",
    )
    working_memory_mb: float = Field(
        default=DEFAULTS.working_memory_mb,
        description="Budget in MiB for the temporaries of one tile (correlation, neighbors, "
        "lead-lag); results are memory-mapped and not counted.",
    )

    clusters_memory_mb: int = Field(
        default=DEFAULTS.clusters_memory_mb,
        description="MiB of anonymous memory the clusters step may hold for its float64 "
        "distances (8 N(N-1)/2 bytes); larger ones go to a scratch file of the matrix store "
        "(page cache). Same clusters either way; raise it where memory allows at N >= ~40,000 "
        "(docs/user_guide.md).",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> SnapshotParams:
        problems = parameter_problems(self._values())
        if problems:
            raise ValueError("invalid snapshot parameters: " + "; ".join(problems))
        return self

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELD_NAMES if name != "dask_scheduler"}

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
