"""The parameters of one snapshot (SPEC §2-§6), each declared once and validated as a whole.

One value drives every step, so the window, the correlation, the neighbors, the clusters, the
lead-lag scan and the published ``snapshots.params`` row all see the same numbers. Each field of
:class:`SnapshotParameters` is one parameter's declaration (:mod:`.parameter`): name, type,
default, range, help and the steps that read it. :data:`PARAMETERS` is read from them; the
Dagster resource ``snapshot_params`` (:class:`corr_pipeline.defs.resources.SnapshotParams`)
exposes the launchpad's ones and builds this value, and the docs' table is
:func:`parameter_table`.

Each step takes its own small record (:class:`CorrelationParameters`,
:class:`NeighborsParameters`, :class:`ClustersParameters`, :class:`LeadLagParameters`:
``params.lead_lag`` and so on), built from the parameters the declarations give that step, a
parameter's field named without the step's prefix (``lead_lag_market_modes`` is the lead-lag's
``market_modes``). :func:`bundle_params` is what a step's bundle records of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from corr_pipeline.compute.suspect import (
    DEFAULT_MAX_ABS_RETURN,
    DEFAULT_MAX_ZERO_RETURN_SHARE,
    SuspectScreen,
)
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.snapshot.parameter import (
    Parameter,
    StepRecord,
    markdown_table,
    parameter,
    parameters_of,
    step_fields,
)

LINKAGE_METHODS = ("average", "single", "complete", "weighted")

MAX_LEAD_LAG_MODES = 10
"""The most market modes the lead-lag's residuals may remove (SPEC §6; and below the session's
kept symbols)."""

#: The steps that take a record of their own, with the budget of their temporaries.
BUDGETED = ("correlation", "neighbors", "clusters", "lead_lag")


@dataclass(frozen=True)
class CorrelationParameters:
    """What the correlation reads (SPEC §3)."""

    STEP: ClassVar[str] = "correlation"
    min_overlap: int
    working_memory_mb: float


@dataclass(frozen=True)
class NeighborsParameters:
    """What the neighbors read (SPEC §4)."""

    STEP: ClassVar[str] = "neighbors"
    k_neighbors: int
    working_memory_mb: float


@dataclass(frozen=True)
class ClustersParameters:
    """What the clusters read (SPEC §5): the linkage, its cut, the modes removed, and where
    the distances live (``memory_mb``: ``clusters_memory_mb``)."""

    STEP: ClassVar[str] = "clusters"
    linkage_method: str
    distance_threshold: float | None
    n_clusters: int | None
    market_modes_removed: int
    working_memory_mb: float
    memory_mb: int

    @property
    def cut(self) -> str:
        """The dendrogram cut in words, e.g. ``distance_threshold=1.2``."""
        if self.distance_threshold is not None:
            return f"distance_threshold={self.distance_threshold}"
        return f"n_clusters={self.n_clusters}"


@dataclass(frozen=True)
class LeadLagParameters:
    """What the lead-lag scan and its selection read (SPEC §6); ``market_modes``:
    ``lead_lag_market_modes``."""

    STEP: ClassVar[str] = "lead_lag"
    max_lag: int
    k_leaders: int
    k_laggers: int
    min_overlap: int
    min_improvement: float
    max_q_value: float
    market_modes: int
    working_memory_mb: float


@dataclass(frozen=True)
class SnapshotParameters:
    """Parameters of one correlation snapshot; construction fails on any rule of
    :func:`parameter_problems`, with every message naming its field.

    ``dask_scheduler`` and ``clusters_memory_mb`` say where the work runs, not what it computes
    (the results are bit-identical either way), so they are not recorded in
    ``snapshots.params`` (:meth:`as_dict` leaves them out). The scratch file of
    ``clusters_memory_mb`` is the lean choice while the distances stay near the kernel's
    dirty-page write-back threshold (about a tenth of the free memory); far above it the kernel
    writes the file back while the linkage updates it, and every write-back round costs a write
    fault per page (at N = 48,000, minutes of system time).
    """

    lookback_days: int = parameter(
        252,
        "returns in the window: the last `lookback_days + 1` trade dates ≤ the snapshot date "
        "(SPEC §2; 252: one trading year)",
        low=2,
    )
    min_history_days: int = parameter(
        126,
        "finite returns (with non-zero variance) a symbol needs in the window to be kept; a "
        "window with fewer returns fails the snapshot (SPEC §2)",
        low=2,
    )
    min_overlap: int = parameter(
        60,
        "common finite returns needed for a correlation, same-day and lagged; below it: NaN "
        "(SPEC §3, §6)",
        low=2,
        steps=("correlation", "lead_lag"),
    )
    k_neighbors: int = parameter(
        10, "neighbors published per symbol, by |corr| (SPEC §4)", low=1, steps=("neighbors",)
    )
    max_lag: int = parameter(
        5, "largest lead-lag lag scanned, in days (SPEC §6)", low=1, steps=("lead_lag",)
    )
    k_leaders: int = parameter(
        10, "per symbol, its best leaders kept (SPEC §6)", low=1, steps=("lead_lag",)
    )
    k_laggers: int = parameter(
        10, "per symbol, its best laggers kept (SPEC §6)", low=1, steps=("lead_lag",)
    )
    min_improvement: float = parameter(
        0.0,
        "a lead-lag candidate needs |lagged corr| − |same-day corr| above this (SPEC §6)",
        finite=True,
        steps=("lead_lag",),
    )
    max_q_value: float = parameter(
        0.05,
        "a lead-lag candidate needs a Benjamini–Hochberg q-value at most this, from a test "
        "robust to common volatility (SPEC §6 Significance): 0.05 publishes only the pairs that "
        "stand out from the chance maxima of N² correlations, 1 every symbol's best pairs "
        "whatever their q-value",
        low=0,
        low_open=True,
        high=1,
        note="1 keeps every candidate",
        steps=("lead_lag",),
    )
    lead_lag_market_modes: int = parameter(
        1,
        "the lead-lag scans each symbol's returns less its m strongest eigenportfolios "
        "(SPEC §6 Market residuals): 1 takes the market out, so that its own reversal is not "
        "read as one stock leading another; 0 scans the returns themselves; fewer than the "
        'symbols kept (user guide §3 "What a lead-lag pair means")',
        low=0,
        high=MAX_LEAD_LAG_MODES,
        note="0 scans the returns themselves, 1 their residuals after the market mode",
        steps=("lead_lag",),
    )
    linkage_method: str = parameter(
        "average",
        "agglomerative linkage of the clusters (SPEC §5)",
        choices=LINKAGE_METHODS,
        steps=("clusters",),
    )
    distance_threshold: float | None = parameter(
        1.2,
        "cut the dendrogram at this Mantegna distance `sqrt(2(1 − corr))` (1.2 ⇔ corr 0.28); "
        "`null` when cutting into `n_clusters` (exactly one cut; prefer `n_clusters` with "
        '`market_modes_removed` ≥ 1, user guide §3 "Which cut")',
        low=0,
        low_open=True,
        finite=True,
        steps=("clusters",),
    )
    n_clusters: int | None = parameter(
        None,
        "cut the dendrogram into this many clusters instead (then `distance_threshold: null`)",
        low=1,
        steps=("clusters",),
    )
    market_modes_removed: int = parameter(
        0,
        "cluster the correlation without its m strongest eigenmodes (SPEC §5): 0 clusters corr "
        "itself; 1 removes the market mode, so that in a sell-off the sectors stay apart "
        "instead of one cluster; fewer than the symbols kept",
        low=0,
        note="0 clusters the correlation itself",
        steps=("clusters",),
    )
    max_zero_return_share: float = parameter(
        DEFAULT_MAX_ZERO_RETURN_SHARE,
        "a symbol whose share of zero returns (among its finite returns in the window) is "
        "above this is reported as suspect: stale or forward-filled closes (SPEC §2; user "
        'guide §9 "Suspect prices")',
        low=0,
        low_open=True,
        high=1,
        note="1 never calls a symbol stale",
    )
    max_abs_return: float = parameter(
        DEFAULT_MAX_ABS_RETURN,
        "a symbol whose largest |log return| in the window is above this is reported as "
        "suspect: a price error or an unadjusted split (SPEC §2; 0.5: +65 % / −39 % in a day)",
        low=0,
        low_open=True,
        finite=True,
    )
    drop_suspect: bool = parameter(
        False,
        "drop the suspect symbols from the universe before the correlation, with that reason "
        "among the dropped symbols; false: report them and keep them (SPEC §2)",
    )
    working_memory_mb: float = parameter(
        DEFAULT_WORKING_MEMORY_MB,
        "budget in MiB for the temporaries of each step (a block of tiles of the correlation, "
        "neighbors or lead-lag); the N × N results are memory-mapped and not counted",
        low=1,
        neutral=True,
        steps=BUDGETED,
    )
    dask_scheduler: str | None = parameter(
        None,
        "the Dask scheduler (`tls://host:8786`) the correlation, neighbors and lead-lag stripes "
        "run on; None: threads in the step's process (deployment configuration: "
        "`$CORR_PIPELINE_DASK_SCHEDULER`)",
        pattern=r"[a-z]+://\S+:\d+",
        allows="a scheduler address such as tls://host:8786",
        recorded=False,
        neutral=True,
        launchpad=False,
    )
    clusters_memory_mb: int = parameter(
        1024,
        "the clustering step keeps its float64 distances (8·N(N−1)/2 bytes: 0.58 GB at "
        "N = 12,000, 2.3 GB at 24,000, 8.1 GB at 45,000, 14.3 GB at 60,000) in anonymous memory "
        "up to this many MiB, above it in a scratch file of the matrix store (page cache). Same "
        "clusters either way, not recorded in `snapshots.params`; raise it where the machine's "
        "memory holds the distances beside the other steps (user guide §11)",
        low=0,
        recorded=False,
        neutral=True,
        steps=("clusters",),
    )

    def __post_init__(self) -> None:
        unrecorded = {p.name: getattr(self, p.name) for p in PARAMETERS if not p.recorded}
        problems = parameter_problems({**self.as_dict(), **unrecorded})
        if problems:
            raise ValueError("invalid snapshot parameters: " + "; ".join(problems))

    def as_dict(self) -> dict[str, Any]:
        """The parameters of the result as plain JSON values (recorded in ``snapshots.params``,
        SPEC §7): every recorded one, in declaration order."""
        return {p.name: p.plain(getattr(self, p.name)) for p in PARAMETERS if p.recorded}

    @property
    def suspect_screen(self) -> SuspectScreen:
        """The suspect-prices screen of the window (SPEC §2)."""
        return SuspectScreen(
            max_zero_return_share=float(self.max_zero_return_share),
            max_abs_return=float(self.max_abs_return),
            drop=bool(self.drop_suspect),
        )

    correlation = StepRecord(CorrelationParameters)
    neighbors = StepRecord(NeighborsParameters)
    clusters = StepRecord(ClustersParameters)
    lead_lag = StepRecord(LeadLagParameters)


#: Every parameter, in declaration order.
PARAMETERS: tuple[Parameter, ...] = parameters_of(SnapshotParameters)
#: Each parameter by name.
BY_NAME = {p.name: p for p in PARAMETERS}


def parameter_problems(p: dict[str, Any]) -> list[str]:
    """Every rule the parameters ``p`` (``{name: value}``; a name left out: its default) break,
    each message starting with the field it is about: first each field's own range
    (:meth:`.parameter.Parameter.problem`, in declaration order), then the rules between fields.

    Between fields: ``min_overlap <= min_history_days <= lookback_days`` (SPEC §2);
    ``max_lag < min_history_days <= lookback_days`` (the window may be as short as
    min_history_days returns, and the lag scan needs ``max_lag < T``) and
    ``min_overlap <= lookback_days - max_lag`` (otherwise the largest lag can never reach
    min_overlap common returns, SPEC §6); exactly one of ``distance_threshold`` and
    ``n_clusters``. A rule is checked only when its fields are in range. The modes removed
    must also be fewer than the kept symbols: checked by the step that finds them.
    """
    values = {name: p.get(name, declared.default) for name, declared in BY_NAME.items()}
    own = {name: declared.problem(values[name]) for name, declared in BY_NAME.items()}
    problems = [problem for problem in own.values() if problem is not None]
    out_of_range = {name for name, problem in own.items() if problem is not None}

    def ok(*names: str) -> bool:
        return not out_of_range.intersection(names)

    lookback, history, overlap, lag = (
        values["lookback_days"],
        values["min_history_days"],
        values["min_overlap"],
        values["max_lag"],
    )
    if ok("min_overlap", "min_history_days") and overlap > history:
        problems.append(
            f"min_overlap ({overlap}) must be <= min_history_days ({history}): a kept symbol "
            "must be able to reach min_overlap"
        )
    if ok("min_history_days", "lookback_days") and history > lookback:
        problems.append(
            f"min_history_days ({history}) must be <= lookback_days ({lookback}): the window "
            "holds at most lookback_days returns"
        )
    if ok("max_lag", "lookback_days"):
        if lag >= lookback:
            problems.append(f"max_lag ({lag}) must be < lookback_days ({lookback})")
        elif ok("min_history_days") and lag >= history:
            problems.append(
                f"max_lag ({lag}) must be < min_history_days ({history}): a window may hold "
                "only min_history_days returns"
            )
        elif ok("min_overlap") and overlap > lookback - lag:
            problems.append(
                f"max_lag ({lag}) leaves at most lookback_days - max_lag = {lookback - lag} "
                f"lagged returns, fewer than min_overlap ({overlap}): lower max_lag or "
                "min_overlap"
            )
    threshold, n_clusters = values["distance_threshold"], values["n_clusters"]
    if (threshold is None) == (n_clusters is None):
        problems.append(
            "distance_threshold / n_clusters: set exactly one cut "
            f"(got distance_threshold={threshold}, n_clusters={n_clusters}); "
            "set the other to null"
        )
    return problems


def parameter_table() -> str:
    """The docs' table of the launchpad's parameters (docs/user_guide.md §6)."""
    return markdown_table(PARAMETERS)


#: A step's own record.
StepParameters = (
    CorrelationParameters | NeighborsParameters | ClustersParameters | LeadLagParameters
)


def step_parameters(step: str) -> dict[str, Parameter]:
    """``{field of step's record: parameter}``: the parameters declared for ``step``."""
    return step_fields(PARAMETERS, step)


def bundle_params(record: StepParameters) -> dict[str, Any]:
    """``{parameter: value}`` of what ``record``'s results depend on, in the record's order:
    the parameters its step's bundle records (none of the :attr:`~.parameter.Parameter.neutral`
    ones)."""
    fields = step_parameters(record.STEP)
    return {
        fields[f.name].name: getattr(record, f.name)
        for f in dataclasses.fields(record)
        if not fields[f.name].neutral
    }


#: The default parameters.
DEFAULTS = SnapshotParameters()
