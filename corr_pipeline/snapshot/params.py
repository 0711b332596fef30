"""The parameters of one snapshot (SPEC §2-§6), validated as a whole.

One value drives every step, so the window, the correlation, the neighbors, the clusters, the
lead-lag scan and the published ``snapshots.params`` row all see the same numbers. The Dagster
resource ``snapshot_params`` (:class:`corr_pipeline.defs.resources.SnapshotParams`) exposes the
same fields to the launchpad and builds this value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from corr_pipeline.compute.suspect import (
    DEFAULT_MAX_ABS_RETURN,
    DEFAULT_MAX_ZERO_RETURN_SHARE,
    SuspectScreen,
)
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB

LINKAGE_METHODS = ("average", "single", "complete", "weighted")

MAX_LEAD_LAG_MODES = 10
"""The most market modes the lead-lag's residuals may remove (SPEC §6; and below the session's
kept symbols)."""
_SCHEDULER_ADDRESS = re.compile(r"[a-z]+://\S+:\d+")


@dataclass(frozen=True)
class SnapshotParameters:
    """Parameters of one correlation snapshot; construction fails on any rule of
    :func:`parameter_problems`, with every message naming its field.

    ``lookback_days``: returns in the window (SPEC §2); ``min_history_days``: finite returns a
    symbol needs to be kept; ``min_overlap``: common finite returns for a defined correlation
    (SPEC §3, §6); ``k_neighbors``: neighbors per symbol (SPEC §4); ``max_lag``, ``k_leaders``,
    ``k_laggers``, ``min_improvement``, ``max_q_value``: the lead-lag scan and selection
    (SPEC §6; a candidate needs a q-value at most ``max_q_value``, 1: no condition);
    ``lead_lag_market_modes``: the lead-lag scans the returns less their ``m`` strongest
    eigenportfolios (SPEC §6 "Market residuals"; 0: the returns themselves);
    ``linkage_method``, exactly one of ``distance_threshold`` / ``n_clusters`` and
    ``market_modes_removed`` (the strongest eigenmodes taken out of the correlation first): the
    clusters (SPEC §5); ``max_zero_return_share``, ``max_abs_return``: the thresholds of the
    suspect prices (SPEC §2), ``drop_suspect``: drop suspect symbols from the universe (default:
    reported and kept); ``working_memory_mb``: the budget for each step's temporaries.

    ``dask_scheduler``: where the products run, not what they compute — the address of a Dask
    scheduler (``tls://host:8786``) for the correlation, neighbors and lead-lag stripes, or None
    for threads in the step's process. The results are bit-identical either way, so it is not
    recorded in ``snapshots.params`` (:meth:`as_dict` leaves it out).

    ``clusters_memory_mb``: where the clusters step keeps its float64 distances
    (``8 · N(N−1)/2`` bytes, 2.3 GB at N = 24,000, 16.4 GB at 64,000): in anonymous memory when
    they fit in this many MiB, else in a scratch file of the matrix store (page cache). The
    linkage is bit-identical either way, so it is not recorded in ``snapshots.params`` either.
    The file is the lean choice while the distances stay near the kernel's dirty-page
    write-back threshold (about a tenth of the free memory); far above it the kernel writes the
    file back while the linkage updates it, and every write-back round costs a write fault per
    page (at N = 48,000, minutes of system time). Raise it on a machine
    whose memory holds the distances beside the other steps.
    """

    lookback_days: int = 252
    min_history_days: int = 126
    min_overlap: int = 60
    k_neighbors: int = 10
    max_lag: int = 5
    k_leaders: int = 10
    k_laggers: int = 10
    min_improvement: float = 0.0
    max_q_value: float = 0.05
    lead_lag_market_modes: int = 1
    linkage_method: str = "average"
    distance_threshold: float | None = 1.2
    n_clusters: int | None = None
    market_modes_removed: int = 0
    max_zero_return_share: float = DEFAULT_MAX_ZERO_RETURN_SHARE
    max_abs_return: float = DEFAULT_MAX_ABS_RETURN
    drop_suspect: bool = False
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB
    dask_scheduler: str | None = None
    clusters_memory_mb: int = 1024

    def __post_init__(self) -> None:
        problems = parameter_problems(
            {
                **self.as_dict(),
                "dask_scheduler": self.dask_scheduler,
                "clusters_memory_mb": self.clusters_memory_mb,
            }
        )
        if problems:
            raise ValueError("invalid snapshot parameters: " + "; ".join(problems))

    def as_dict(self) -> dict[str, Any]:
        """The parameters of the result as plain JSON values (recorded in ``snapshots.params``,
        SPEC §7): every field but ``dask_scheduler`` and ``clusters_memory_mb``."""
        return {
            "lookback_days": int(self.lookback_days),
            "min_history_days": int(self.min_history_days),
            "min_overlap": int(self.min_overlap),
            "k_neighbors": int(self.k_neighbors),
            "max_lag": int(self.max_lag),
            "k_leaders": int(self.k_leaders),
            "k_laggers": int(self.k_laggers),
            "min_improvement": float(self.min_improvement),
            "max_q_value": float(self.max_q_value),
            "lead_lag_market_modes": int(self.lead_lag_market_modes),
            "linkage_method": str(self.linkage_method),
            "distance_threshold": (
                None if self.distance_threshold is None else float(self.distance_threshold)
            ),
            "n_clusters": None if self.n_clusters is None else int(self.n_clusters),
            "market_modes_removed": int(self.market_modes_removed),
            "max_zero_return_share": float(self.max_zero_return_share),
            "max_abs_return": float(self.max_abs_return),
            "drop_suspect": bool(self.drop_suspect),
            "working_memory_mb": float(self.working_memory_mb),
        }

    @property
    def suspect_screen(self) -> SuspectScreen:
        """The suspect-prices screen of the window (SPEC §2)."""
        return SuspectScreen(
            max_zero_return_share=float(self.max_zero_return_share),
            max_abs_return=float(self.max_abs_return),
            drop=bool(self.drop_suspect),
        )

    @property
    def cut(self) -> str:
        """The dendrogram cut in words, e.g. ``distance_threshold=1.2``."""
        if self.distance_threshold is not None:
            return f"distance_threshold={self.distance_threshold}"
        return f"n_clusters={self.n_clusters}"


def parameter_problems(p: dict[str, Any]) -> list[str]:
    """Every rule the parameters break, each message starting with the field it is about. A
    text field's message says what the field allows, never the value it was given (a refused
    text may be anything, a secret included, and the message reaches the run's event log).

    Rules: each count >= 1 (lookback_days, min_history_days and min_overlap >= 2, a correlation
    needs two points); ``min_overlap <= min_history_days <= lookback_days`` (SPEC §2);
    ``1 <= max_lag < min_history_days <= lookback_days`` (the window may be as short as
    min_history_days returns, and the lag scan needs ``max_lag < T``) and
    ``min_overlap <= lookback_days - max_lag`` (otherwise the largest lag can never reach
    min_overlap common returns, SPEC §6); a known linkage method; exactly one of
    ``distance_threshold`` (finite, > 0) and ``n_clusters`` (>= 1); ``market_modes_removed``
    >= 0 (and below the kept symbols, checked by the clusters step); ``lead_lag_market_modes``
    in 0 .. :data:`MAX_LEAD_LAG_MODES` (and below the kept symbols, checked by the lead-lag
    step); a finite min_improvement; ``0 < max_q_value <= 1``;
    ``0 < max_zero_return_share <= 1``; ``max_abs_return`` finite and > 0;
    ``dask_scheduler``, when given, an address ``scheme://host:port``;
    ``clusters_memory_mb`` >= 0.
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
            f"linkage_method must be one of {', '.join(LINKAGE_METHODS)} (the value given "
            "is not repeated)"
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
    if p["market_modes_removed"] < 0:
        problems.append(
            f"market_modes_removed must be >= 0 (got {p['market_modes_removed']}); "
            "0 clusters the correlation itself"
        )
    modes = p.get("lead_lag_market_modes", 0)
    if not 0 <= modes <= MAX_LEAD_LAG_MODES:
        problems.append(
            f"lead_lag_market_modes must be in 0 .. {MAX_LEAD_LAG_MODES} (got {modes}); 0 scans "
            "the returns themselves, 1 their residuals after the market mode"
        )
    if not math.isfinite(p["min_improvement"]):
        problems.append(f"min_improvement must be finite (got {p['min_improvement']})")
    if not 0.0 < p.get("max_q_value", 1.0) <= 1.0:
        problems.append(
            f"max_q_value must lie in (0, 1] (got {p['max_q_value']}); 1 keeps every candidate"
        )
    share = p.get("max_zero_return_share", DEFAULT_MAX_ZERO_RETURN_SHARE)
    if not 0.0 < share <= 1.0:
        problems.append(
            f"max_zero_return_share must lie in (0, 1] (got {share}); 1 never calls a symbol stale"
        )
    largest = p.get("max_abs_return", DEFAULT_MAX_ABS_RETURN)
    if not (math.isfinite(largest) and largest > 0):
        problems.append(f"max_abs_return must be a finite number > 0 (got {largest})")
    if p.get("clusters_memory_mb", 0) < 0:
        problems.append(f"clusters_memory_mb must be >= 0 (got {p['clusters_memory_mb']})")
    scheduler = p.get("dask_scheduler")
    if scheduler is not None and not _SCHEDULER_ADDRESS.fullmatch(scheduler):
        problems.append(
            "dask_scheduler must be a scheduler address such as tls://host:8786 (the value "
            "given is not repeated)"
        )
    return problems


#: The field names, in declaration order.
FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SnapshotParameters))
#: The default parameters.
DEFAULTS = SnapshotParameters()
