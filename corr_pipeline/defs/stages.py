"""One session of the snapshot op: its chain (:class:`corr_pipeline.snapshot.chain.SessionChain`,
which computes, verifies and stores every step), and what each step's outputs report to
Dagster.

:func:`session_chain` gives the chain the op's matrix store
(:mod:`corr_pipeline.defs.session_store`), the session's window (its part of a range's union,
or its own query; a session whose prices are not in fails, said in the run's tags), the run's
Dask runner, its progress and its log. For each output the chain yields, :data:`DESCRIBE` logs
the step's line and returns ``{asset: SessionResult}``: the stored bundle, its metadata
(:mod:`corr_pipeline.defs.metadata`; the op appends the store's facts) and its check results
(:mod:`corr_pipeline.defs.checks`). The publication's and the changes' are in
:mod:`corr_pipeline.defs.publication`. The memory of each step is listed in
:mod:`corr_pipeline.snapshot.steps`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

import dagster as dg
import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.price_source import PriceSource
from corr_pipeline.db.synth import read_truth
from corr_pipeline.db.window import (
    ReturnsWindow,
    StaleSessionError,
    UnionWindows,
    WindowError,
)
from corr_pipeline.defs import metadata, pictures, ranges
from corr_pipeline.defs.checks import check_result
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.partitions import snapshot_calendar, snapshot_date
from corr_pipeline.defs.progress import session_progress
from corr_pipeline.defs.session_store import ResourceSessionStore
from corr_pipeline.defs.specs import INJECTED_PAIRS_CHECK
from corr_pipeline.snapshot import steps, verify
from corr_pipeline.snapshot.chain import SessionChain
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.snapshot.session_outputs import (
    ClustersOutput,
    CorrelationChecked,
    CorrelationOutput,
    LeadLagOutput,
    NeighborsOutput,
    ReturnsOutput,
)
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.dask_runner import DaskRunner

__all__ = [
    "DESCRIBE",
    "NO_PRICES_TAG",
    "Session",
    "SnapshotStep",
    "logged",
    "session_chain",
    "verified",
]

#: The run tag naming the sessions a run was asked for before their prices were in (SPEC §2).
NO_PRICES_TAG = "corr_pipeline/no_prices_for"


@dataclass
class SnapshotStep:
    """What every session of one run of the op shares: the context, the parameters, the
    resources, the Dask runner (None: threads), the sessions whose matrices go to the store's
    memory area, ``last``: the last session the run computes (after it, the next published
    session's stale changes are computed again), and (read once, on first use) the windows of a
    range and the synthetic truth."""

    context: dg.AssetExecutionContext
    params: SnapshotParameters
    keys: list[str]
    engine: sa.Engine
    database: str
    source: PriceSource
    matrix_store: MatrixStoreResource
    top_m: int
    runner: DaskRunner | None = None
    dashboard: dict[str, Any] = field(default_factory=dict)
    in_memory: set[str] = field(default_factory=set)
    stale: list[str] = field(default_factory=list)
    last: str = ""

    def selected(self, asset: str) -> bool:
        return dg.AssetKey(asset) in self.context.selected_asset_keys

    def check_selected(self, check: dg.AssetCheckKey) -> bool:
        return check in self.context.selected_asset_check_keys

    @cached_property
    def windows(self) -> UnionWindows | None:
        """The windows of the sessions of a range, read with one query for their union
        (:func:`corr_pipeline.snapshot.steps.load_returns_range`); None for one session."""
        if len(self.keys) < 2:
            return None
        days = [snapshot_date(k) for k in self.keys]
        return steps.load_returns_range(
            self.engine,
            days,
            self.params,
            source=self.source,
            session=all(snapshot_calendar.is_session(d) for d in days),
        )

    @cached_property
    def truth(self) -> list[tuple[str, str, int]]:
        """The synthetic universe's injected pairs (empty on production data)."""
        return read_truth(self.engine)


@dataclass
class Session:
    """One session of the run: its key, what each asset reports (``results``, in the order
    computed), the bundles its chain stored or loaded (``bundles``, by asset), and the
    correlation's outputs until their verification is in (``correlation``)."""

    key: str
    results: dict[str, ranges.SessionResult] = field(default_factory=dict)
    bundles: dict[str, MatrixBundle] = field(default_factory=dict)
    correlation: tuple[CorrelationOutput, StageStats] | None = None

    @property
    def day(self) -> dt.date:
        return snapshot_date(self.key)


def session_chain(
    step: SnapshotStep, session: Session
) -> tuple[SessionChain, ResourceSessionStore]:
    """The chain of ``session`` (module docstring) and its store, whose ``facts`` the
    descriptions add to their metadata."""
    store = ResourceSessionStore(
        step.matrix_store.store, session.key, resource=step.matrix_store, context=step.context
    )
    chain = SessionChain(
        session.day,
        step.params,
        store,
        step.engine,
        load_window=partial(_window, step, session.key),
        recorded={"dagster_run_id": step.context.run.run_id},
        runner=step.runner,
        progress=lambda what: session_progress(step.context, f"{what} {session.key}"),
        info=partial(ranges.log, step.context),
        warn=step.context.log.warning,
        in_memory=session.key in step.in_memory,
        bundles=session.bundles,
    )
    return chain, store


def _window(step: SnapshotStep, key: str) -> ReturnsWindow:
    """The session's window: its part of the range's union, else its own query."""
    day = snapshot_date(key)
    try:
        if step.windows is not None:
            window = step.windows.window(day)
            if isinstance(window, WindowError):
                raise window
            return window
        return steps.load_returns(
            step.engine,
            day,
            step.params,
            source=step.source,
            session=snapshot_calendar.is_session(day),
        )
    except StaleSessionError as exc:  # said in the run's tags and log, then one line
        step.stale.append(f"{exc.session} (latest trade date {exc.latest})")
        step.context.instance.add_run_tags(
            step.context.run.run_id, {NO_PRICES_TAG: ", ".join(step.stale)}
        )
        step.context.log.error(str(exc))
        raise dg.Failure(description=str(exc), allow_retries=False) from exc


def logged(step: SnapshotStep, label: str, stats: StageStats) -> None:
    """The step's line: ``label``, its time and peak RSS."""
    ranges.log(step.context, metadata.stage_line(label, stats))


def verified(verdict: verify.Verdict | None) -> verify.Verdict:
    """The verdict of a step of the op's chain, which always verifies."""
    if verdict is None:
        raise ValueError("the snapshot op's chain runs its verifications")
    return verdict


# --------------------------------------------------------------------------------------------
# returns_matrix (SPEC §2)
# --------------------------------------------------------------------------------------------


def returns_results(
    step: SnapshotStep, session: Session, out: ReturnsOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    window, verdict = out.window, verified(out.verdict)
    R = window.returns
    logged(step, f"returns_matrix {session.key} {R.shape[0]} x {R.shape[1]}", stats)
    return {
        "returns_matrix": ranges.SessionResult(
            out.bundle,
            {
                **metadata.returns_window(window, verdict, stats),
                "price_source": dg.MetadataValue.text(window.source),
            },
            [check_result(verdict, "returns_contract", "returns_matrix")],
        )
    }


# --------------------------------------------------------------------------------------------
# correlation_matrix + overlap_matrix (SPEC §3)
# --------------------------------------------------------------------------------------------

#: Verdict of :func:`corr_pipeline.snapshot.verify.verify_correlation` behind each check.
CORRELATION_VERDICTS = {
    "corr_exactly_symmetric": "symmetry",
    "corr_unit_diagonal": "unit_diagonal",
    "corr_in_range": "range",
}


def correlation_computed(
    step: SnapshotStep, session: Session, out: CorrelationOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    """Nothing yet: the correlation's results wait for its verification."""
    n = len(out.corr.labels["symbols"])
    logged(step, f"correlation {session.key} {n} x {n}", stats)
    session.correlation = (out, stats)
    return {}


def correlation_results(
    step: SnapshotStep, session: Session, checked: CorrelationChecked, check_stats: StageStats
) -> dict[str, ranges.SessionResult]:
    """The session's ``correlation_matrix`` (metadata, histogram, checks) and ``overlap_matrix``
    results, once the matrices are verified."""
    logged(step, f"correlation checks {session.key}", check_stats)
    assert session.correlation is not None  # the chain yields the matrices first
    out, stats = session.correlation
    session.correlation = None
    stored_corr, stored_overlap = out.corr.arrays["corr"], out.overlap.arrays["overlap"]
    n = len(out.corr.labels["symbols"])
    in_memory = isinstance(stored_corr, StoredArray) and not stored_corr.path.is_relative_to(
        step.matrix_store.store.base_dir
    )
    return {
        "correlation_matrix": ranges.SessionResult(
            out.corr,
            {
                **metadata.correlation(n, checked.stats, stats, check_stats),
                "matrices_in_memory": dg.MetadataValue.bool(in_memory),
                **step.dashboard,
                **metadata.pictures(
                    step.context,
                    "correlation histogram",
                    lambda: pictures.histogram_metadata(
                        out.corr["corr"], working_memory_mb=step.params.working_memory_mb
                    ),
                    session=session.key,
                ),
            },
            [
                check_result(checked.verdicts[verdict_name], check_name, "correlation_matrix")
                for check_name, verdict_name in CORRELATION_VERDICTS.items()
            ],
        ),
        "overlap_matrix": ranges.SessionResult(
            out.overlap, metadata.overlap(n, checked.stats, stored_overlap.dtype)
        ),
    }


# --------------------------------------------------------------------------------------------
# top_k_neighbors (SPEC §4)
# --------------------------------------------------------------------------------------------


def neighbors_results(
    step: SnapshotStep, session: Session, out: NeighborsOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    logged(step, f"top_k_neighbors {session.key}", stats)
    verdict, k = verified(out.verdict), step.params.k_neighbors
    return {
        "top_k_neighbors": ranges.SessionResult(
            out.bundle,
            {
                **metadata.neighbors(len(out.bundle.labels["symbols"]), k, verdict, stats),
                **step.dashboard,
            },
            [check_result(verdict, "neighbors_rows_filled", "top_k_neighbors")],
        )
    }


# --------------------------------------------------------------------------------------------
# clusters (SPEC §5)
# --------------------------------------------------------------------------------------------


def clusters_results(
    step: SnapshotStep, session: Session, out: ClustersOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    logged(step, f"clusters {session.key}", stats)
    params, verdict = step.params, verified(out.verdict)
    symbols = list(out.bundle.labels["symbols"])
    corr = session.bundles["correlation_matrix"]["corr"]
    return {
        "clusters": ranges.SessionResult(
            out.bundle,
            {
                **metadata.clusters(out.labels, symbols, verdict, stats, out.modes, params),
                **metadata.pictures(
                    step.context,
                    "clustered heatmap",
                    lambda: pictures.heatmap_metadata(
                        corr, out.labels, working_memory_mb=params.working_memory_mb
                    ),
                    session=session.key,
                ),
            },
            [check_result(verdict, "every_symbol_labelled", "clusters")],
        )
    }


# --------------------------------------------------------------------------------------------
# lead_lag_pairs (SPEC §6), and the recall of the synthetic universe's injected pairs
# --------------------------------------------------------------------------------------------


def lead_lag_results(
    step: SnapshotStep, session: Session, out: LeadLagOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    pairs, params = out.pairs, step.params
    logged(step, f"lead_lag_pairs {session.key} ({pairs.shape[0]} pairs)", stats)
    symbols = list(out.bundle.labels["symbols"])
    checks = [check_result(verified(out.verdict), "lead_lag_contract", "lead_lag_pairs")]
    checks += _injected_pairs_check(step, pairs, symbols)
    return {
        "lead_lag_pairs": ranges.SessionResult(
            out.bundle,
            {
                **metadata.lead_lag(pairs, symbols, stats, max_q_value=params.max_q_value),
                **step.dashboard,
                **metadata.pictures(
                    step.context,
                    "lead-lag network",
                    lambda: pictures.lead_lag_network_metadata(
                        pairs, symbols, max_q_value=params.max_q_value
                    ),
                    session=session.key,
                ),
            },
            checks,
        )
    }


def _injected_pairs_check(
    step: SnapshotStep, pairs: np.ndarray, symbols: list[str]
) -> list[dg.AssetCheckResult]:
    """The recall of the synthetic universe's injected pairs (a warning), when the check is
    selected and the prices hold the synthetic truth; else nothing."""
    if not (step.check_selected(INJECTED_PAIRS_CHECK) and step.truth):
        return []
    found = verify.verify_injected_pairs(pairs, symbols, step.truth)
    return [
        check_result(
            found, INJECTED_PAIRS_CHECK.name, "lead_lag_pairs", severity=dg.AssetCheckSeverity.WARN
        )
    ]


#: What each of the chain's outputs reports, by the output's type (the publication's is
#: :func:`corr_pipeline.defs.publication.publication_results`).
DESCRIBE: dict[type, Callable[..., dict[str, ranges.SessionResult]]] = {
    ReturnsOutput: returns_results,
    CorrelationOutput: correlation_computed,
    CorrelationChecked: correlation_results,
    NeighborsOutput: neighbors_results,
    ClustersOutput: clusters_results,
    LeadLagOutput: lead_lag_results,
}
