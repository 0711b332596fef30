"""Dagster resources: the snapshot parameters every asset shares, and the PostgreSQL connection.

``SnapshotParams`` is a resource rather than per-asset ``Config`` so that one set of numbers
drives the whole graph (the window, the correlation, the neighbors, the clusters, the lead-lag
scan and the ``snapshots.params`` row all see the same values). Its cross-field rules are
checked by pydantic when the resource is built: in Python at construction, and for launchpad /
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

import math
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import Field, model_validator

LINKAGE_METHODS = ("average", "single", "complete", "weighted")


class SnapshotParams(dg.ConfigurableResource):
    """Parameters of one correlation snapshot (SPEC §2-§6), validated as a whole."""

    lookback_days: int = Field(
        default=252,
        description="Returns in the window: the last lookback_days + 1 trade dates <= the "
        "snapshot date (SPEC §2). 252 = one trading year.",
    )
    min_history_days: int = Field(
        default=126,
        description="A symbol is kept iff it has at least this many finite returns (and "
        "non-zero variance) in the window; the snapshot fails if the window itself has fewer "
        "returns (SPEC §2).",
    )
    min_overlap: int = Field(
        default=60,
        description="Minimum common finite returns for a correlation (synchronous and lagged) "
        "to be defined; below it the value is NaN (SPEC §3, §6).",
    )
    k_neighbors: int = Field(
        default=10, description="Neighbors published per symbol, by |corr| (SPEC §4)."
    )
    max_lag: int = Field(default=5, description="Largest lead-lag lag scanned, in days (SPEC §6).")
    k_leaders: int = Field(
        default=10, description="Per symbol, its best leaders kept (SPEC §6 selection)."
    )
    k_laggers: int = Field(
        default=10, description="Per symbol, its best laggers kept (SPEC §6 selection)."
    )
    min_improvement: float = Field(
        default=0.0,
        description="A lead-lag candidate needs |lagged corr| - |sync corr| > min_improvement "
        "(SPEC §6).",
    )
    linkage_method: str = Field(
        default="average",
        description="Agglomerative linkage: average, single, complete or weighted (SPEC §5).",
    )
    distance_threshold: float | None = Field(
        default=1.2,
        description="Cut the dendrogram at this Mantegna distance sqrt(2(1 - corr)); 1.2 "
        "corresponds to corr 0.28. Set to null when using n_clusters (exactly one cut).",
    )
    n_clusters: int | None = Field(
        default=None,
        description="Cut the dendrogram into this many clusters instead of at a distance "
        "(then set distance_threshold to null).",
    )
    working_memory_mb: int = Field(
        default=512,
        description="Budget in MiB for the temporaries of one tile (correlation, neighbors, "
        "lead-lag); results are memory-mapped and not counted.",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> SnapshotParams:
        problems = snapshot_params_problems(self.as_dict())
        if problems:
            raise ValueError("invalid snapshot parameters: " + "; ".join(problems))
        return self

    def as_dict(self) -> dict[str, Any]:
        """The parameters as plain JSON values (recorded in ``snapshots.params``, SPEC §7)."""
        return {
            "lookback_days": int(self.lookback_days),
            "min_history_days": int(self.min_history_days),
            "min_overlap": int(self.min_overlap),
            "k_neighbors": int(self.k_neighbors),
            "max_lag": int(self.max_lag),
            "k_leaders": int(self.k_leaders),
            "k_laggers": int(self.k_laggers),
            "min_improvement": float(self.min_improvement),
            "linkage_method": str(self.linkage_method),
            "distance_threshold": (
                None if self.distance_threshold is None else float(self.distance_threshold)
            ),
            "n_clusters": None if self.n_clusters is None else int(self.n_clusters),
            "working_memory_mb": int(self.working_memory_mb),
        }


def snapshot_params_problems(p: dict[str, Any]) -> list[str]:
    """Every rule the parameters break, each message starting with the field it is about.

    Rules: each count >= 1 (lookback_days, min_history_days and min_overlap >= 2, a correlation
    needs two points); ``min_overlap <= min_history_days <= lookback_days`` (SPEC §2);
    ``1 <= max_lag < min_history_days <= lookback_days`` (the window may be as short as
    min_history_days returns, and the lag scan needs ``max_lag < T``) and ``min_overlap <= lookback_days - max_lag`` (otherwise the largest lag can
    never reach min_overlap common returns, SPEC §6); a known linkage method; exactly one of
    ``distance_threshold`` (finite, > 0) and ``n_clusters`` (>= 1); a finite min_improvement.
    """
    problems: list[str] = []

    def at_least(name: str, low: int) -> bool:
        value = p[name]
        if value < low:
            problems.append(f"{name} must be >= {low} (got {value})")
            return False
        return True

    ok_lookback = at_least("lookback_days", 2)
    ok_history = at_least("min_history_days", 2)
    ok_overlap = at_least("min_overlap", 2)
    for name in ("k_neighbors", "k_leaders", "k_laggers"):
        at_least(name, 1)
    ok_lag = at_least("max_lag", 1)
    at_least("working_memory_mb", 1)

    if ok_overlap and ok_history and p["min_overlap"] > p["min_history_days"]:
        problems.append(
            f"min_overlap ({p['min_overlap']}) must be <= min_history_days "
            f"({p['min_history_days']}): a kept symbol must be able to reach min_overlap"
        )
    if ok_history and ok_lookback and p["min_history_days"] > p["lookback_days"]:
        problems.append(
            f"min_history_days ({p['min_history_days']}) must be <= lookback_days "
            f"({p['lookback_days']}): the window holds at most lookback_days returns"
        )
    if ok_lag and ok_lookback:
        if p["max_lag"] >= p["lookback_days"]:
            problems.append(
                f"max_lag ({p['max_lag']}) must be < lookback_days ({p['lookback_days']})"
            )
        elif ok_history and p["max_lag"] >= p["min_history_days"]:
            problems.append(
                f"max_lag ({p['max_lag']}) must be < min_history_days "
                f"({p['min_history_days']}): a window may hold only min_history_days returns"
            )
        elif ok_overlap and p["min_overlap"] > p["lookback_days"] - p["max_lag"]:
            problems.append(
                f"max_lag ({p['max_lag']}) leaves at most lookback_days - max_lag = "
                f"{p['lookback_days'] - p['max_lag']} lagged returns, fewer than min_overlap "
                f"({p['min_overlap']}): lower max_lag or min_overlap"
            )
    if p["linkage_method"] not in LINKAGE_METHODS:
        problems.append(
            f"linkage_method must be one of {', '.join(LINKAGE_METHODS)} "
            f"(got {p['linkage_method']!r})"
        )
    threshold, n_clusters = p["distance_threshold"], p["n_clusters"]
    if (threshold is None) == (n_clusters is None):
        problems.append(
            "distance_threshold / n_clusters: set exactly one cut "
            f"(got distance_threshold={threshold}, n_clusters={n_clusters}); "
            "set the other to null"
        )
    if threshold is not None and not (math.isfinite(threshold) and threshold > 0):
        problems.append(f"distance_threshold must be a finite number > 0 (got {threshold})")
    if n_clusters is not None and n_clusters < 1:
        problems.append(f"n_clusters must be >= 1 (got {n_clusters})")
    if not math.isfinite(p["min_improvement"]):
        problems.append(f"min_improvement must be finite (got {p['min_improvement']})")
    return problems


class PostgresResource(dg.ConfigurableResource):
    """The project PostgreSQL (prices in, snapshots out).

    ``database_url`` unset (the default) means the project's own resolution:
    ``$CORR_PIPELINE_DATABASE_URL`` if set, else the embedded server under
    ``$CORR_PIPELINE_HOME/pgdata``. If you do set it, pass ``dg.EnvVar("...")`` so the URL
    never shows in the UI. Only :meth:`describe` (no credentials) is ever logged.
    """

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL; default: $CORR_PIPELINE_DATABASE_URL or the embedded "
        "PostgreSQL. Use an EnvVar, never a literal with a password.",
    )

    def get_engine(self) -> sa.Engine:
        """A pooled engine (cached per URL by :func:`corr_pipeline.db.engine.get_engine`).

        Raises :class:`corr_pipeline.db.engine.DatabaseUnavailableError` (retryable, no
        credentials in the message) when the server cannot be reached.
        """
        from corr_pipeline.db.engine import get_engine

        return get_engine(self.database_url)

    def describe(self) -> str:
        """``host[:port]/database`` of the configured server, without credentials."""
        from corr_pipeline.db.engine import database_url, describe_url

        return describe_url(self.database_url or database_url())
