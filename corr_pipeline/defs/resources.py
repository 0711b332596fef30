"""Dagster resources: the snapshot parameters every asset shares, the PostgreSQL connection, and
the price source (:class:`PriceSourceResource`, at the end).

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

from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import ConfigDict, Field, field_validator, model_validator

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


class SnapshotParams(dg.ConfigurableResource):
    """Parameters of one correlation snapshot (SPEC §2-§6), validated as a whole."""

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
    working_memory_mb: int = Field(
        default=int(DEFAULTS.working_memory_mb),
        description="Budget in MiB for the temporaries of one tile (correlation, neighbors, "
        "lead-lag); results are memory-mapped and not counted.",
    )

    dask_scheduler: str | None = Field(
        default=None,
        description="Address of a Dask distributed scheduler (tcp://host:8786) on which the "
        "correlation, neighbors and lead-lag stripes run, bit-identical to threads; default "
        "$CORR_PIPELINE_DASK_SCHEDULER; both unset: threads in the step's process. The cluster "
        "stays on one machine (docs/user_guide.md).",
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
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def to_parameters(self) -> SnapshotParameters:
        """The Dagster-free value every step takes (``dask_scheduler`` unset: the environment's
        ``$CORR_PIPELINE_DASK_SCHEDULER``, read when the step runs)."""
        values = self._values()
        values["dask_scheduler"] = self.dask_scheduler or settings.dask_scheduler()
        return SnapshotParameters(**values)

    def as_dict(self) -> dict[str, Any]:
        """The parameters as plain JSON values (recorded in ``snapshots.params``, SPEC §7)."""
        return self.to_parameters().as_dict()


class PostgresResource(dg.ConfigurableResource):
    """The project PostgreSQL (prices in, snapshots out).

    ``database_url`` unset (the default) means the project's own resolution:
    ``$CORR_PIPELINE_DATABASE_URL`` if set, else the embedded server under
    ``$CORR_PIPELINE_HOME/pgdata``. If you do set it, pass ``dg.EnvVar("...")`` (or
    ``{env: NAME}`` in run config): a URL with a password given as a literal is refused, because
    Dagster would store it in its run storage (the job snapshot or the run config) and show it in
    the UI. Only :meth:`describe` (no credentials) is ever logged.
    """

    # validation errors must not echo the URL (pydantic shows the input value by default)
    model_config = ConfigDict(hide_input_in_errors=True)

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL; default: $CORR_PIPELINE_DATABASE_URL or the embedded "
        "PostgreSQL. A URL with a password must come from the environment (EnvVar); a literal "
        "one is refused.",
    )

    @field_validator("database_url", mode="before")
    @classmethod
    def _password_only_from_the_environment(cls, value: Any) -> Any:
        from corr_pipeline.db.engine import has_password

        if value is None or isinstance(value, dg.EnvVar) or not isinstance(value, str):
            return value
        if has_password(value) and not settings.is_environment_value(value):
            raise ValueError(
                "PostgresResource.database_url holds a password in clear: Dagster would store it "
                "in its run storage and show it in the UI. Pass it from the environment, "
                'PostgresResource(database_url=dg.EnvVar("NAME")) (in run config: database_url: '
                "{env: NAME}), or leave database_url unset to use CORR_PIPELINE_DATABASE_URL"
            )
        return value

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

        engine = get_engine(self.database_url)
        require_current(engine)
        return engine

    def describe(self) -> str:
        """``host[:port]/database`` of the configured server, without credentials."""
        from corr_pipeline.db.engine import database_url, describe_url

        return describe_url(self.database_url or database_url())


class PriceSourceResource(dg.ConfigurableResource):
    """Where the window reads daily prices: a table or view and its symbol, trade-date and
    price columns (:mod:`corr_pipeline.db.price_source`). Read-only; never written.

    A resource of its own rather than fields of :class:`PostgresResource`: the connection (where
    the pipeline reads *and* publishes) and the price source (what it reads, never writes) vary
    independently — a team points the source at its view and keeps publishing into the same
    database — and the assets and sensors that only need to know which prices exist take this
    one. The source lives in the database of ``postgres``; a table on another server is reached
    through a foreign table (``postgres_fdw``) there.

    Each field left unset (the default) takes its environment variable, read when the run
    starts: ``table`` ← ``$CORR_PIPELINE_PRICES_TABLE`` (default ``prices``), ``columns`` ←
    ``$CORR_PIPELINE_PRICES_COLUMNS`` (default ``symbol,trade_date,close``), ``timezone`` ←
    ``$CORR_PIPELINE_PRICES_TIMEZONE`` (default ``UTC``). A malformed value, a missing relation
    or column, or an unusable type fails the run's first step with one line naming the problem,
    not retried (``returns_matrix``, before any price is read).
    """

    table: str | None = Field(
        default=None,
        description="Table or view holding the prices: name or schema.name (SQL identifier "
        "syntax, quoted safely). Default: $CORR_PIPELINE_PRICES_TABLE or `prices`.",
    )
    columns: str | None = Field(
        default=None,
        description="Its symbol, trade date and price columns, comma-separated, in that order "
        "(e.g. `ticker,dt,adj_close`). Default: $CORR_PIPELINE_PRICES_COLUMNS or "
        "`symbol,trade_date,close`.",
    )
    timezone: str | None = Field(
        default=None,
        description="Time zone turning a `timestamp with time zone` trade-date column into "
        "dates. Default: $CORR_PIPELINE_PRICES_TIMEZONE or UTC.",
    )

    def source(self) -> PriceSource:
        """The parsed source (fields, else the environment); raises
        :class:`~corr_pipeline.db.price_source.PriceSourceError` naming the field or variable."""
        from corr_pipeline import settings

        return PriceSource.parse(
            self.table if self.table is not None else settings.prices_table(),
            self.columns if self.columns is not None else settings.prices_columns(),
            self.timezone if self.timezone is not None else settings.prices_timezone(),
            names=(
                "price_source.table" if self.table is not None else settings.ENV_PRICES_TABLE,
                "price_source.columns" if self.columns is not None else settings.ENV_PRICES_COLUMNS,
                "price_source.timezone"
                if self.timezone is not None
                else settings.ENV_PRICES_TIMEZONE,
            ),
        )

    def resolve(self, engine: sa.Engine) -> ResolvedPriceSource:
        """:meth:`source` checked against the catalog of ``engine``'s database."""
        with engine.connect() as conn:
            return resolve_price_source(conn, self.source())
