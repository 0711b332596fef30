"""The stages of one session of the snapshot op: the window, the correlation, the neighbors, the
clusters and the lead-lag scan, each turning its inputs into what its assets report.

A stage reads the session's inputs (:attr:`Session.bundles`: computed by an earlier stage of
the same session, or loaded from the matrix store when that stage is not selected), calls one
step of :mod:`corr_pipeline.snapshot.steps`, verifies the result
(:mod:`corr_pipeline.snapshot.verify`, returned as check results) and describes it
(:mod:`corr_pipeline.defs.metadata`). It returns ``{asset: SessionResult}``; the op stores each
bundle in the matrix store and reports it (:mod:`corr_pipeline.defs.assets`). The publication
and the changes are the last two stages (:mod:`corr_pipeline.defs.publication`). The memory of
each step is listed in :mod:`corr_pipeline.snapshot.steps`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.compute.tiling import overlap_dtype
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
from corr_pipeline.defs.specs import INJECTED_PAIRS_CHECK
from corr_pipeline.snapshot import steps, verify
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.store import writeback
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray, sources

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.dask_runner import DaskRunner

__all__ = ["COMPUTE_STAGES", "NO_PRICES_TAG", "Session", "SnapshotStep", "Stage"]

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
    """One session of the run: its key, its inputs and outputs by asset (``bundles``), what
    each asset reports (``results``, in the order computed), and the market modes of its
    correlation once found (the clusters and the lead-lag share them)."""

    key: str
    bundles: dict[str, MatrixBundle] = field(default_factory=dict)
    results: dict[str, ranges.SessionResult] = field(default_factory=dict)
    modes: MarketModes | None = None

    @property
    def day(self) -> dt.date:
        return snapshot_date(self.key)

    def market_modes(self, corr: np.ndarray, params: SnapshotParameters) -> MarketModes:
        """:func:`corr_pipeline.snapshot.steps.market_modes` of the session's ``corr``, found
        on first use: one Lanczos pass for the clusters and the lead-lag."""
        if self.modes is None:
            self.modes = steps.market_modes(corr, params)
        return self.modes


@dataclass(frozen=True)
class Stage:
    """One stage: the assets it ``produces``, the assets it ``needs`` (from the same session,
    else the store), and ``run(step, session) -> {asset: SessionResult}``."""

    produces: tuple[str, ...]
    needs: tuple[str, ...]
    run: Callable[[SnapshotStep, Session], Mapping[str, ranges.SessionResult]]


def _symbols(bundle: MatrixBundle) -> list[str]:
    return list(bundle.labels["symbols"])


# --------------------------------------------------------------------------------------------
# returns_matrix (SPEC §2)
# --------------------------------------------------------------------------------------------


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


def returns_stage(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    params = step.params
    R: np.ndarray
    with metadata.measured(
        step.context, lambda: f"returns_matrix {session.key} {R.shape[0]} x {R.shape[1]}"
    ) as stats:
        window = _window(step, session.key)
        for note in window.source_notes:
            step.context.log.warning(f"price source: {note}")
        R = window.returns
        verdict = verify.verify_returns(
            R,
            window.symbols,
            min_history_days=params.min_history_days,
            lookback_days=params.lookback_days,
            working_memory_mb=params.working_memory_mb,
        )
    verdict.metadata.update(
        {"n_dropped": len(window.dropped), "bad_prices": int(window.bad_prices)}
    )
    bundle = MatrixBundle(
        {"returns": R},
        labels={"symbols": window.symbols, "dates": window.dates},
        params={
            "snapshot_date": session.day,
            "as_of_trade_date": window.as_of_trade_date,
            "n_dropped": len(window.dropped),
            "dropped": [[symbol, reason] for symbol, reason in window.dropped],
            "suspects": [suspect.as_list() for suspect in window.suspects],
            "bad_prices": int(window.bad_prices),
            "snapshot_params": params.as_dict(),
        },
    )
    return {
        "returns_matrix": ranges.SessionResult(
            bundle,
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


def correlation_stage(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    params, context, key = step.params, step.context, session.key
    window = session.bundles["returns_matrix"]
    R = window["returns"]
    symbols = _symbols(window)
    n = len(symbols)
    labels = {"symbols": symbols}
    store_params = {"min_overlap": params.min_overlap, "n_returns": int(R.shape[0])}

    def allocate(asset: str, name: str, dtype: np.dtype):
        return step.matrix_store.allocate_for(
            context,
            name,
            (n, n),
            dtype,
            asset_key=dg.AssetKey(asset),
            partition=key,
            labels=labels,
            params=store_params,
            in_memory=key in step.in_memory,
        )

    with metadata.measured(context, f"correlation {key} {n} x {n}") as stats:
        with (
            allocate("correlation_matrix", "corr", np.dtype(np.float32)) as pending_corr,
            allocate("overlap_matrix", "overlap", overlap_dtype(int(R.shape[0]))) as pending_ov,
        ):
            steps.correlation(
                R,
                params,
                out_corr=pending_corr.array,
                out_overlap=pending_ov.array,
                progress=session_progress(context, f"correlation {key}"),
                runner=step.runner,
            )
            stored_corr = pending_corr.commit()
            stored_overlap = pending_ov.commit()
    with metadata.measured(context, f"correlation checks {key}") as check_stats:
        corr_stats = verify.correlation_stats(
            stored_corr.array,
            stored_overlap.array,
            min_overlap=params.min_overlap,
            finite_counts=np.isfinite(R).sum(axis=0),
        )
        verdicts = verify.verify_correlation(corr_stats)
    return _correlation_results(
        step, key, window, stored_corr, stored_overlap, corr_stats, stats, check_stats, verdicts
    )


def _correlation_results(
    step: SnapshotStep,
    key: str,
    window: MatrixBundle,
    stored_corr: StoredArray,
    stored_overlap: StoredArray,
    corr_stats: verify.CorrelationStats,
    stats: StageStats,
    check_stats: StageStats,
    verdicts: dict[str, verify.Verdict],
) -> dict[str, ranges.SessionResult]:
    """The session's ``correlation_matrix`` (metadata, histogram, checks) and ``overlap_matrix``
    results from the committed matrices."""
    n = len(_symbols(window))
    labels = {"symbols": _symbols(window)}
    store_params = {
        "min_overlap": step.params.min_overlap,
        "n_returns": int(window["returns"].shape[0]),
    }
    placement = {
        "matrices_in_memory": dg.MetadataValue.bool(
            not stored_corr.path.is_relative_to(step.matrix_store.store.base_dir)
        )
    }
    corr_bundle = MatrixBundle(
        {"corr": stored_corr}, labels=labels, params=store_params, inputs=sources(window)
    )
    overlap_bundle = MatrixBundle(
        {"overlap": stored_overlap}, labels=labels, params=store_params, inputs=sources(window)
    )
    return {
        "correlation_matrix": ranges.SessionResult(
            corr_bundle,
            {
                **metadata.correlation(n, corr_stats, stats, check_stats),
                **placement,
                **step.dashboard,
                **metadata.pictures(
                    step.context,
                    "correlation histogram",
                    lambda: pictures.histogram_metadata(
                        stored_corr.array, working_memory_mb=step.params.working_memory_mb
                    ),
                    session=key,
                ),
            },
            [
                check_result(verdicts[verdict_name], check_name, "correlation_matrix")
                for check_name, verdict_name in CORRELATION_VERDICTS.items()
            ],
        ),
        "overlap_matrix": ranges.SessionResult(
            overlap_bundle, metadata.overlap(n, corr_stats, stored_overlap.dtype)
        ),
    }


# --------------------------------------------------------------------------------------------
# top_k_neighbors (SPEC §4)
# --------------------------------------------------------------------------------------------


def neighbors_stage(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    params = step.params
    corr_bundle = session.bundles["correlation_matrix"]
    overlap_bundle = session.bundles["overlap_matrix"]
    corr, overlap = corr_bundle["corr"], overlap_bundle["overlap"]
    symbols = _symbols(corr_bundle)
    with metadata.measured(step.context, f"top_k_neighbors {session.key}") as stats:
        found = steps.neighbors(
            corr,
            overlap,
            params,
            progress=session_progress(step.context, f"neighbors {session.key}"),
            runner=step.runner,
        )
        verdict = verify.verify_neighbors(
            found.index,
            found.corr,
            corr,
            k=params.k_neighbors,
            neighbor_overlap=found.overlap,
            overlap=overlap,
        )
    arrays: dict[str, np.ndarray | StoredArray] = {"index": found.index, "corr": found.corr}
    if found.overlap is not None:
        arrays["overlap"] = found.overlap
    bundle = MatrixBundle(
        arrays,
        labels={"symbols": symbols},
        params={"k": params.k_neighbors},
        inputs=sources(corr_bundle, overlap_bundle),
    )
    return {
        "top_k_neighbors": ranges.SessionResult(
            bundle,
            {
                **metadata.neighbors(len(symbols), params.k_neighbors, verdict, stats),
                **step.dashboard,
            },
            [check_result(verdict, "neighbors_rows_filled", "top_k_neighbors")],
        )
    }


# --------------------------------------------------------------------------------------------
# clusters (SPEC §5)
# --------------------------------------------------------------------------------------------


@contextmanager
def _distances_scratch(
    step: SnapshotStep, key: str, name: str, shape: tuple[int, ...], dtype: np.dtype
) -> Iterator[np.ndarray]:
    """The clustering's scratch distances (:func:`corr_pipeline.snapshot.steps.clusters`): in
    the store's memory area when it has room (no page is ever written back to a disk), else a
    file of the store, with a warning when the kernel would write it back while the linkage
    rewrites it (:mod:`corr_pipeline.store.writeback`)."""
    with step.matrix_store.scratch_for(
        step.context,
        name,
        shape,
        dtype,
        asset_key=dg.AssetKey("clusters"),
        partition=key,
        in_memory=True,
    ) as work:
        on_disk = Path(str(getattr(work, "filename", ""))).is_relative_to(
            step.matrix_store.store.base_dir
        )
        if on_disk:
            warning = writeback.rewrite_warning(
                "the clustering step's scratch distances",
                int(work.nbytes),
                or_else="set clusters_memory_mb above it where memory allows",
            )
            if warning is not None:
                step.context.log.warning(warning)
        yield work


def clusters_stage(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    params, context, key = step.params, step.context, session.key
    corr_bundle = session.bundles["correlation_matrix"]
    corr = corr_bundle["corr"]
    symbols = _symbols(corr_bundle)
    ranges.log(
        context,
        f"clustering {len(symbols)} symbols of {key}: {params.linkage_method} linkage, "
        f"{params.cut}",
    )
    with metadata.measured(context, f"clusters {key}") as stats:
        modes = session.market_modes(corr, params)
        labels = steps.clusters(
            corr, params, modes=modes, scratch=partial(_distances_scratch, step, key)
        )
        verdict = verify.verify_clusters(labels, len(symbols))
    bundle = MatrixBundle(
        {"labels": labels},
        labels={"symbols": symbols},
        params={
            "linkage_method": params.linkage_method,
            "distance_threshold": params.distance_threshold,
            "n_clusters": params.n_clusters,
            "market_modes_removed": params.market_modes_removed,
        },
        inputs=sources(corr_bundle),
    )
    return {
        "clusters": ranges.SessionResult(
            bundle,
            {
                **metadata.clusters(labels, symbols, verdict, stats, modes, params),
                **metadata.pictures(
                    context,
                    "clustered heatmap",
                    lambda: pictures.heatmap_metadata(
                        corr, labels, working_memory_mb=params.working_memory_mb
                    ),
                    session=key,
                ),
            },
            [check_result(verdict, "every_symbol_labelled", "clusters")],
        )
    }


# --------------------------------------------------------------------------------------------
# lead_lag_pairs (SPEC §6), and the recall of the synthetic universe's injected pairs
# --------------------------------------------------------------------------------------------


def lead_lag_stage(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    params, context, key = step.params, step.context, session.key
    window = session.bundles["returns_matrix"]
    corr_bundle = session.bundles["correlation_matrix"]
    R, corr = window["returns"], corr_bundle["corr"]
    symbols = _symbols(window)
    pairs: np.ndarray
    with metadata.measured(
        context, lambda: f"lead_lag_pairs {key} ({pairs.shape[0]} pairs)"
    ) as stats:
        pairs = steps.lead_lag(
            R,
            corr,
            params,
            modes=session.market_modes(corr, params) if params.lead_lag_market_modes else None,
            progress=session_progress(context, f"lead-lag scan {key}"),
            runner=step.runner,
        )
        contract = verify.verify_lead_lag_pairs(
            pairs,
            len(symbols),
            max_lag=params.max_lag,
            min_overlap=params.min_overlap,
            min_improvement=params.min_improvement,
            max_q_value=params.max_q_value,
        )
    bundle = MatrixBundle(
        {"pairs": pairs},
        labels={"symbols": symbols},
        params={
            "max_lag": params.max_lag,
            "k_leaders": params.k_leaders,
            "k_laggers": params.k_laggers,
            "min_overlap": params.min_overlap,
            "min_improvement": params.min_improvement,
            "max_q_value": params.max_q_value,
            "lead_lag_market_modes": params.lead_lag_market_modes,
        },
        inputs=sources(window, corr_bundle),
    )
    checks = [check_result(contract, "lead_lag_contract", "lead_lag_pairs")]
    checks += _injected_pairs_check(step, pairs, symbols)
    return {
        "lead_lag_pairs": ranges.SessionResult(
            bundle,
            {
                **metadata.lead_lag(pairs, symbols, stats, max_q_value=params.max_q_value),
                **step.dashboard,
                **metadata.pictures(
                    context,
                    "lead-lag network",
                    lambda: pictures.lead_lag_network_metadata(
                        pairs, symbols, max_q_value=params.max_q_value
                    ),
                    session=key,
                ),
            },
            checks,
        )
    }


#: The stages before the publication, in the order of a session.
COMPUTE_STAGES = (
    Stage(("returns_matrix",), (), returns_stage),
    Stage(("correlation_matrix", "overlap_matrix"), ("returns_matrix",), correlation_stage),
    Stage(("top_k_neighbors",), ("correlation_matrix", "overlap_matrix"), neighbors_stage),
    Stage(("clusters",), ("correlation_matrix",), clusters_stage),
    Stage(("lead_lag_pairs",), ("returns_matrix", "correlation_matrix"), lead_lag_stage),
)


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
