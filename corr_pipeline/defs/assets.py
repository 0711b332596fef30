"""The correlation snapshot as Dagster assets (DESIGN "The flow"), one partition per snapshot date.

::

    prices ─► returns_matrix ─┬─► correlation_matrix + overlap_matrix ─┬─► top_k_neighbors ─┐
                              │                                        ├─► clusters ────────┤
                              └──────────(with the sync corr)──────────┴─► lead_lag_pairs ──┴─► snapshot_publication

Each asset is a thin wrapper: load its inputs (read-only memory maps through the matrix-store IO
manager), call one function of :mod:`corr_pipeline.compute`, hand the result to the store, verify
it (asset checks) and describe it (numeric metadata the UI plots across partitions, markdown
previews). Only ``snapshot_publication`` writes to PostgreSQL, in one transaction for the three
result tables (SPEC §7), so readers never see a half-published snapshot.

Memory at N = 24,000 (T = 252, int16 overlap), per step (each step is its own process with the
multiprocess executor):

- returns_matrix: the COPY buffer (~180 MB) and the close/returns pivots (~120 MB), then R 24 MB.
- correlation_matrix + overlap_matrix: both outputs are allocated *in the store* (2.3 GB float32 +
  1.15 GB int16, file-backed memory maps, committed with a rename, no copy); anonymous memory is
  R standardised plus one block of tiles (``working_memory_mb``). The checks reread the maps in
  ``b x b`` tiles (~64 MiB).
- top_k_neighbors: row blocks of corr (``working_memory_mb``) + the N x k results (~2 MB).
- clusters: the condensed float64 distances N(N-1)/2 (2.3 GB, anonymous) + the linkage (0.8 MB).
- lead_lag_pairs: R standardised, one block per lag (``working_memory_mb``), the running
  per-symbol top-k (N x k), corr read as a map.
- snapshot_publication: N x k neighbor rows + N cluster rows + the pairs, sent with COPY.

Retries: the two database-touching assets (``returns_matrix``, ``lead_lag_pairs`` reading the
synthetic truth, ``snapshot_publication``) retry with exponential backoff when PostgreSQL is
unreachable; every other error is raised as ``Failure(allow_retries=False)`` because running the
same deterministic computation again cannot help.
"""

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import dagster as dg
import numpy as np
import sqlalchemy as sa

from corr_pipeline import viz
from corr_pipeline.compute import (
    find_lead_lag_pairs,
    hierarchical_clusters,
    pairwise_correlation,
    top_k_neighbors,
)
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.engine import DatabaseUnavailableError
from corr_pipeline.db.publish import publish_snapshot, read_snapshot_counts
from corr_pipeline.db.synth import read_truth
from corr_pipeline.db.window import load_returns_window
from corr_pipeline.defs import checks
from corr_pipeline.defs.instrumentation import StageStats, measure_stage
from corr_pipeline.defs.jobs import SNAPSHOT_GROUP, SNAPSHOT_POOL
from corr_pipeline.defs.partitions import snapshot_date, snapshot_partitions
from corr_pipeline.defs.resources import PostgresResource, SnapshotParams
from corr_pipeline.progress import dagster_progress
from corr_pipeline.store.io_manager import MatrixStoreResource
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray

# BackfillPolicy is "beta" in Dagster 1.13; we rely on it deliberately (one partition per run),
# so silence exactly that warning instead of printing it for every asset in every process.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)

MATRIX_IO_MANAGER = "matrix_io_manager"

#: Database unreachable: 4 attempts over ~3 minutes (waits of about 15 s, 45 s, 105 s, each +/- 15 s).
DATABASE_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=15, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
#: One partition per run: the matrix store keeps one bundle per asset and partition.
ONE_PARTITION_PER_RUN = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)

#: What every step of the snapshot shares: its partitions, one partition per run, one pool.
SNAPSHOT_STEP: dict[str, Any] = dict(
    partitions_def=snapshot_partitions, backfill_policy=ONE_PARTITION_PER_RUN, pool=SNAPSHOT_POOL
)
#: ... and the steps whose output goes through the matrix store.
MATRIX_STEP: dict[str, Any] = dict(
    SNAPSHOT_STEP, group_name=SNAPSHOT_GROUP, io_manager_key=MATRIX_IO_MANAGER
)

T = TypeVar("T")


def _is_database_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, DatabaseUnavailableError):
        return True
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


@contextmanager
def retry_only_if_database_unavailable(what: str) -> Iterator[None]:
    """Let "database unreachable" errors through (the RetryPolicy retries them); turn anything
    else into ``dg.Failure(allow_retries=False)`` whose description names ``what`` and the error
    (deterministic failures: wrong data, inconsistent parameters, a bug)."""
    try:
        yield
    except dg.Failure:
        raise
    except Exception as exc:
        if _is_database_unavailable(exc):
            raise
        raise dg.Failure(
            description=f"{what} failed: {type(exc).__name__}: {exc}", allow_retries=False
        ) from exc


def _stage_metadata(stats: StageStats) -> dict[str, Any]:
    return {key: dg.MetadataValue.float(float(value)) for key, value in stats.metadata().items()}


def _float(value: float) -> dg.FloatMetadataValue:
    return dg.MetadataValue.float(float(value) if math.isfinite(value) else float("nan"))


def _symbols(bundle: MatrixBundle) -> list[str]:
    return list(bundle.labels["symbols"])


def _dropped_markdown(dropped: list[tuple[str, str]], limit: int = 25) -> str:
    if not dropped:
        return "_no symbol dropped_"
    lines = ["| symbol | reason |", "|---|---|"]
    lines += [f"| {symbol} | {reason} |" for symbol, reason in dropped[:limit]]
    if len(dropped) > limit:
        lines.append(f"| ... | {len(dropped) - limit} more |")
    return "\n".join(lines)


def _reason_counts(dropped: list[tuple[str, str]]) -> dict[str, int]:
    counts = {"too_few_returns": 0, "zero_variance": 0, "other": 0}
    for _, reason in dropped:
        if reason.startswith("too few"):
            counts["too_few_returns"] += 1
        elif reason.startswith("zero variance"):
            counts["zero_variance"] += 1
        else:
            counts["other"] += 1
    return counts


def _check(
    verdict: checks.Verdict,
    name: str,
    asset: str,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetCheckResult:
    return checks.to_check_result(
        verdict, check_name=name, asset_key=dg.AssetKey(asset), severity=severity
    )


def _pictures(
    context: dg.AssetExecutionContext, what: str, make: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Picture metadata from :mod:`corr_pipeline.viz` (PNG in markdown, bounded memory); a
    picture that cannot be drawn is logged as a warning and left out, never failing the asset."""
    try:
        return make()
    except Exception as exc:  # a picture is a nicety, the asset's data is what matters
        context.log.warning(f"{what} picture skipped: {type(exc).__name__}: {exc}")
        return {}


def _log_stage(context: dg.AssetExecutionContext, label: str, stats: StageStats) -> None:
    peak = f", peak RSS {stats.peak_rss_mib:.0f} MiB" if stats.peak_rss_mib is not None else ""
    context.log.info(f"{label}: {stats.seconds:.2f}s{peak}")


# --------------------------------------------------------------------------------------------
# returns_matrix (SPEC §2)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **MATRIX_STEP,
    retry_policy=DATABASE_RETRY_POLICY,
    kinds={"postgres", "numpy"},
    check_specs=[
        dg.AssetCheckSpec(
            "returns_contract",
            asset="returns_matrix",
            blocking=True,
            description="SPEC §2: float32 T x N, no infinities, symbols ascending, every kept "
            "symbol with >= min_history_days finite returns and non-zero variance.",
        )
    ],
    description="Returns matrix R (T x N float32, SPEC §2) of the window ending at the "
    "snapshot date, read from `prices`; labels: symbols, dates; dropped symbols with reasons.",
)
def returns_matrix(
    context: dg.AssetExecutionContext,
    postgres: PostgresResource,
    snapshot_params: SnapshotParams,
):
    with retry_only_if_database_unavailable(f"returns_matrix {context.partition_key}"):
        params = snapshot_params
        day = snapshot_date(context.partition_key)
        context.log.info(
            f"loading the window for {day}: lookback_days={params.lookback_days}, "
            f"min_history_days={params.min_history_days}, database {postgres.describe()}"
        )
        with measure_stage() as stats:
            engine = postgres.get_engine()
            window = load_returns_window(
                engine,
                day,
                lookback_days=params.lookback_days,
                min_history_days=params.min_history_days,
            )
            R = window.returns
            verdict = checks.verify_returns(
                R,
                window.symbols,
                min_history_days=params.min_history_days,
                lookback_days=params.lookback_days,
                working_memory_mb=checks.DEFAULT_CHECK_MEMORY_MB,
            )
        _log_stage(context, f"returns_matrix {R.shape[0]} x {R.shape[1]}", stats)
        reasons = _reason_counts(window.dropped)
        verdict.metadata.update(
            {"n_dropped": len(window.dropped), "bad_prices": int(window.bad_prices)}
        )
        bundle = MatrixBundle(
            {"returns": R},
            labels={"symbols": window.symbols, "dates": window.dates},
            params={
                "snapshot_date": day,
                "as_of_trade_date": window.as_of_trade_date,
                "n_dropped": len(window.dropped),
                "dropped": [[symbol, reason] for symbol, reason in window.dropped],
                "bad_prices": int(window.bad_prices),
                "snapshot_params": params.as_dict(),
            },
        )
        metadata = {
            "n_symbols": dg.MetadataValue.int(len(window.symbols)),
            "n_dropped": dg.MetadataValue.int(len(window.dropped)),
            "n_dropped_too_few_returns": dg.MetadataValue.int(reasons["too_few_returns"]),
            "n_dropped_zero_variance": dg.MetadataValue.int(reasons["zero_variance"]),
            "bad_prices": dg.MetadataValue.int(int(window.bad_prices)),
            "n_returns": dg.MetadataValue.int(int(R.shape[0])),
            "n_price_rows": dg.MetadataValue.int(int(window.n_price_rows)),
            "as_of_trade_date": dg.MetadataValue.text(window.as_of_trade_date.isoformat()),
            "window": dg.MetadataValue.text(f"{window.dates[0]} .. {window.dates[-1]}"),
            "missing_return_share": _float(verdict.metadata.get("missing_return_share", 0.0)),
            "dropped_symbols": dg.MetadataValue.md(_dropped_markdown(window.dropped)),
            **{f"load_{k}": dg.MetadataValue.float(round(v, 3)) for k, v in window.timings.items()},
            **_stage_metadata(stats),
        }
        return dg.MaterializeResult(
            value=bundle,
            metadata=metadata,
            check_results=[_check(verdict, "returns_contract", "returns_matrix")],
        )


# --------------------------------------------------------------------------------------------
# correlation_matrix + overlap_matrix (SPEC §3)
# --------------------------------------------------------------------------------------------

CORRELATION_CHECKS = {
    "corr_exactly_symmetric": "corr == corr.T bit for bit (and overlap == overlap.T), "
    "compared tile by tile from the memory maps.",
    "corr_unit_diagonal": "corr[i, i] == 1 for every kept symbol and overlap[i, i] equals "
    "its number of finite returns.",
    "corr_in_range": "finite values in [-1, 1]; NaN wherever overlap < min_overlap.",
}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "correlation_matrix",
            deps=["returns_matrix"],
            group_name=SNAPSHOT_GROUP,
            kinds={"numpy"},
            description="Pairwise-complete Pearson correlation (N x N float32, exactly "
            "symmetric, SPEC §3), memory-mapped in the matrix store.",
        ).with_io_manager_key(MATRIX_IO_MANAGER),
        dg.AssetSpec(
            "overlap_matrix",
            deps=["returns_matrix"],
            group_name=SNAPSHOT_GROUP,
            kinds={"numpy"},
            description="Common finite returns per pair (N x N, smallest integer type "
            "holding T, SPEC §3), memory-mapped in the matrix store.",
        ).with_io_manager_key(MATRIX_IO_MANAGER),
    ],
    **SNAPSHOT_STEP,
    check_specs=[
        dg.AssetCheckSpec(name, asset="correlation_matrix", blocking=True, description=text)
        for name, text in CORRELATION_CHECKS.items()
    ],
)
def correlation_and_overlap(
    context: dg.AssetExecutionContext,
    returns_matrix: MatrixBundle,
    snapshot_params: SnapshotParams,
    matrix_store: MatrixStoreResource,
):
    params = snapshot_params
    R = returns_matrix["returns"]
    symbols = _symbols(returns_matrix)
    n = len(symbols)
    labels = {"symbols": symbols}
    store_params = {"min_overlap": params.min_overlap, "n_returns": int(R.shape[0])}
    with measure_stage() as stats:
        with (
            matrix_store.allocate_for(
                context,
                "corr",
                (n, n),
                np.float32,
                asset_key=dg.AssetKey("correlation_matrix"),
                labels=labels,
                params=store_params,
            ) as pending_corr,
            matrix_store.allocate_for(
                context,
                "overlap",
                (n, n),
                overlap_dtype(int(R.shape[0])),
                asset_key=dg.AssetKey("overlap_matrix"),
                labels=labels,
                params=store_params,
            ) as pending_overlap,
        ):
            pairwise_correlation(
                R,
                min_overlap=params.min_overlap,
                working_memory_mb=params.working_memory_mb,
                out_corr=pending_corr.array,
                out_overlap=pending_overlap.array,
                progress=dagster_progress(context, "correlation"),
            )
            stored_corr = pending_corr.commit()
            stored_overlap = pending_overlap.commit()
    _log_stage(context, f"correlation {n} x {n}", stats)
    with measure_stage() as check_stats:
        corr_stats = checks.correlation_stats(
            stored_corr.array,
            stored_overlap.array,
            min_overlap=params.min_overlap,
            finite_counts=np.isfinite(R).sum(axis=0),
        )
        verdicts = checks.verify_correlation(corr_stats)
    _log_stage(context, "correlation checks", check_stats)
    defined_share = (
        corr_stats.pairs_defined / corr_stats.pairs_total if corr_stats.pairs_total else 0.0
    )
    yield dg.MaterializeResult(
        asset_key="correlation_matrix",
        value=MatrixBundle({"corr": stored_corr}, labels=labels, params=store_params),
        metadata={
            "n_symbols": dg.MetadataValue.int(n),
            "mean_abs_corr": _float(corr_stats.mean_abs_corr),
            "defined_pair_share": _float(defined_share),
            "max_abs_offdiag_corr": _float(corr_stats.max_abs_offdiag),
            "check_seconds": dg.MetadataValue.float(round(check_stats.seconds, 3)),
            **_stage_metadata(stats),
            **_pictures(
                context,
                "correlation histogram",
                lambda: viz.histogram_metadata(
                    stored_corr.array, working_memory_mb=params.working_memory_mb
                ),
            ),
        },
    )
    yield dg.MaterializeResult(
        asset_key="overlap_matrix",
        value=MatrixBundle({"overlap": stored_overlap}, labels=labels, params=store_params),
        metadata={
            "n_symbols": dg.MetadataValue.int(n),
            "mean_overlap": _float(corr_stats.mean_overlap),
            "dtype": dg.MetadataValue.text(str(stored_overlap.dtype)),
        },
    )
    names = {
        "symmetry": "corr_exactly_symmetric",
        "unit_diagonal": "corr_unit_diagonal",
        "range": "corr_in_range",
    }
    for key, check_name in names.items():
        yield _check(verdicts[key], check_name, "correlation_matrix")


# --------------------------------------------------------------------------------------------
# top_k_neighbors (SPEC §4)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **MATRIX_STEP,
    kinds={"numpy"},
    check_specs=[
        dg.AssetCheckSpec(
            "neighbors_rows_filled",
            asset="top_k_neighbors",
            blocking=True,
            description="SPEC §4 against corr: every row filled with min(k, defined "
            "correlations) neighbors, values equal corr[i, j], ordered by |corr|, none stronger "
            "left out.",
        )
    ],
    name="top_k_neighbors",
    description="The k strongest |corr| neighbors of every symbol (index, signed corr, "
    "overlap; N x k, SPEC §4).",
)
def top_k_neighbors_asset(
    context: dg.AssetExecutionContext,
    correlation_matrix: MatrixBundle,
    overlap_matrix: MatrixBundle,
    snapshot_params: SnapshotParams,
):
    params = snapshot_params
    corr, overlap = correlation_matrix["corr"], overlap_matrix["overlap"]
    symbols = _symbols(correlation_matrix)
    with measure_stage() as stats:
        neighbors = top_k_neighbors(
            corr,
            k=params.k_neighbors,
            overlap=overlap,
            working_memory_mb=params.working_memory_mb,
        )
        verdict = checks.verify_neighbors(
            neighbors.index,
            neighbors.corr,
            corr,
            k=params.k_neighbors,
            neighbor_overlap=neighbors.overlap,
            overlap=overlap,
        )
    _log_stage(context, "top_k_neighbors", stats)
    arrays: dict[str, np.ndarray | StoredArray] = {
        "index": neighbors.index,
        "corr": neighbors.corr,
    }
    if neighbors.overlap is not None:
        arrays["overlap"] = neighbors.overlap
    return dg.MaterializeResult(
        value=MatrixBundle(arrays, labels={"symbols": symbols}, params={"k": params.k_neighbors}),
        metadata={
            "n_symbols": dg.MetadataValue.int(len(symbols)),
            "k": dg.MetadataValue.int(params.k_neighbors),
            "neighbors_published": dg.MetadataValue.int(
                int(verdict.metadata["neighbors_published"])
            ),
            "fill_rate": _float(verdict.metadata["fill_rate"]),
            "rows_short_of_k": dg.MetadataValue.int(int(verdict.metadata["rows_short_of_k"])),
            **_stage_metadata(stats),
        },
        check_results=[_check(verdict, "neighbors_rows_filled", "top_k_neighbors")],
    )


# --------------------------------------------------------------------------------------------
# clusters (SPEC §5)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **MATRIX_STEP,
    kinds={"numpy", "scipy"},
    check_specs=[
        dg.AssetCheckSpec(
            "every_symbol_labelled",
            asset="clusters",
            blocking=True,
            description="SPEC §5: one int32 label per symbol, 0..K-1 all used, numbered by "
            "first appearance; reports K and the largest cluster sizes.",
        )
    ],
    description="Hierarchical clusters on the Mantegna distance sqrt(2(1 - corr)) "
    "(int32 label per symbol, SPEC §5).",
)
def clusters(
    context: dg.AssetExecutionContext,
    correlation_matrix: MatrixBundle,
    snapshot_params: SnapshotParams,
):
    params = snapshot_params
    corr = correlation_matrix["corr"]
    symbols = _symbols(correlation_matrix)
    cut = (
        f"distance_threshold={params.distance_threshold}"
        if params.distance_threshold is not None
        else f"n_clusters={params.n_clusters}"
    )
    context.log.info(f"clustering {len(symbols)} symbols: {params.linkage_method} linkage, {cut}")
    with measure_stage() as stats:
        labels = hierarchical_clusters(
            corr,
            method=params.linkage_method,
            distance_threshold=params.distance_threshold,
            n_clusters=params.n_clusters,
            working_memory_mb=params.working_memory_mb,
        )
        verdict = checks.verify_clusters(labels, len(symbols))
    _log_stage(context, "clusters", stats)
    return dg.MaterializeResult(
        value=MatrixBundle(
            {"labels": labels},
            labels={"symbols": symbols},
            params={
                "linkage_method": params.linkage_method,
                "distance_threshold": params.distance_threshold,
                "n_clusters": params.n_clusters,
            },
        ),
        metadata={
            "n_symbols": dg.MetadataValue.int(len(symbols)),
            "n_clusters": dg.MetadataValue.int(int(verdict.metadata.get("n_clusters", 0))),
            "largest_cluster_size": dg.MetadataValue.int(
                int(verdict.metadata.get("largest_cluster_size", 0))
            ),
            "n_singletons": dg.MetadataValue.int(int(verdict.metadata.get("n_singletons", 0))),
            "largest_clusters": dg.MetadataValue.md(
                checks.largest_clusters_markdown(labels, symbols)
            ),
            **_stage_metadata(stats),
            **_pictures(
                context,
                "clustered heatmap",
                lambda: viz.heatmap_metadata(
                    corr, labels, working_memory_mb=params.working_memory_mb
                ),
            ),
        },
        check_results=[_check(verdict, "every_symbol_labelled", "clusters")],
    )


# --------------------------------------------------------------------------------------------
# lead_lag_pairs (SPEC §6)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **MATRIX_STEP,
    retry_policy=DATABASE_RETRY_POLICY,
    kinds={"numpy", "numba"},
    check_specs=[
        dg.AssetCheckSpec(
            "lead_lag_contract",
            asset="lead_lag_pairs",
            blocking=True,
            description="SPEC §6: lags in 1..max_lag, distinct in-range symbols, each ordered "
            "pair once, overlap >= min_overlap, improvement > min_improvement and consistent, "
            "SPEC order.",
        ),
        dg.AssetCheckSpec(
            "injected_pairs_found",
            asset="lead_lag_pairs",
            description="Synthetic data only: every injected (leader, lagger, lag) whose "
            "symbols were kept is found with its lag (warns otherwise).",
        ),
    ],
    description="Lead-lag pairs (SPEC §6): exact best-lag scan over lags 1..max_lag, "
    "per-symbol top leaders/laggers by improvement over the synchronous correlation.",
)
def lead_lag_pairs(
    context: dg.AssetExecutionContext,
    returns_matrix: MatrixBundle,
    correlation_matrix: MatrixBundle,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
):
    with retry_only_if_database_unavailable(f"lead_lag_pairs {context.partition_key}"):
        params = snapshot_params
        R, corr = returns_matrix["returns"], correlation_matrix["corr"]
        symbols = _symbols(returns_matrix)
        # the (cheap) database read first, so that a retry never repeats the scan
        truth = read_truth(postgres.get_engine())
        with measure_stage() as stats:
            pairs = find_lead_lag_pairs(
                R,
                max_lag=params.max_lag,
                k_leaders=params.k_leaders,
                k_laggers=params.k_laggers,
                min_overlap=params.min_overlap,
                min_improvement=params.min_improvement,
                corr=corr,
                working_memory_mb=params.working_memory_mb,
                progress=dagster_progress(context, "lead-lag scan"),
            )
            contract = checks.verify_lead_lag_pairs(
                pairs,
                len(symbols),
                max_lag=params.max_lag,
                min_overlap=params.min_overlap,
                min_improvement=params.min_improvement,
            )
            injected = checks.verify_injected_pairs(pairs, symbols, truth)
        _log_stage(context, f"lead_lag_pairs ({pairs.shape[0]} pairs)", stats)
        metadata: dict[str, Any] = {
            "n_pairs": dg.MetadataValue.int(int(pairs.shape[0])),
            "n_symbols": dg.MetadataValue.int(len(symbols)),
            "strongest_pairs": dg.MetadataValue.md(checks.strongest_pairs_markdown(pairs, symbols)),
            **_stage_metadata(stats),
            **_pictures(
                context,
                "lead-lag network",
                lambda: {
                    "lead_lag_network": viz.png_metadata(
                        viz.lead_lag_network_png(pairs, symbols, top=30), "lead-lag network"
                    )
                },
            ),
        }
        if pairs.shape[0]:
            metadata["max_improvement"] = _float(float(pairs["improvement"].max()))
            metadata["median_improvement"] = _float(float(np.median(pairs["improvement"])))
        if truth:
            metadata["injected_pair_recall"] = _float(float(injected.metadata["recall"]))
        return dg.MaterializeResult(
            value=MatrixBundle(
                {"pairs": pairs},
                labels={"symbols": symbols},
                params={
                    "max_lag": params.max_lag,
                    "k_leaders": params.k_leaders,
                    "k_laggers": params.k_laggers,
                    "min_overlap": params.min_overlap,
                    "min_improvement": params.min_improvement,
                },
            ),
            metadata=metadata,
            check_results=[
                _check(contract, "lead_lag_contract", "lead_lag_pairs"),
                _check(
                    injected,
                    "injected_pairs_found",
                    "lead_lag_pairs",
                    severity=dg.AssetCheckSeverity.WARN,
                ),
            ],
        )


# --------------------------------------------------------------------------------------------
# snapshot_publication (SPEC §7)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **SNAPSHOT_STEP,
    group_name=SNAPSHOT_GROUP,
    retry_policy=DATABASE_RETRY_POLICY,
    kinds={"postgres"},
    check_specs=[
        dg.AssetCheckSpec(
            "published_rows_match",
            asset="snapshot_publication",
            description="Rows read back for the snapshot date equal what was published: one "
            "snapshots row, N x filled neighbors, N clusters, every pair (no duplicates, "
            "nothing missing).",
        )
    ],
    description="Publishes neighbors, clusters and lead-lag pairs of the partition to "
    "PostgreSQL (snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs) in ONE "
    "transaction, replacing any earlier version of the same snapshot date (SPEC §7).",
)
def snapshot_publication(
    context: dg.AssetExecutionContext,
    returns_matrix: MatrixBundle,
    top_k_neighbors: MatrixBundle,
    clusters: MatrixBundle,
    lead_lag_pairs: MatrixBundle,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
):
    with retry_only_if_database_unavailable(f"snapshot_publication {context.partition_key}"):
        params = snapshot_params
        day = snapshot_date(context.partition_key)
        symbols = _symbols(returns_matrix)
        for name, bundle in (
            ("top_k_neighbors", top_k_neighbors),
            ("clusters", clusters),
            ("lead_lag_pairs", lead_lag_pairs),
        ):
            if _symbols(bundle) != symbols:
                raise dg.Failure(
                    description=f"{name} was computed on other symbols than returns_matrix for "
                    f"{day}: re-materialize the whole partition",
                    allow_retries=False,
                )
        window = returns_matrix.params
        index = np.asarray(top_k_neighbors["index"])
        expected = {
            "snapshots": 1,
            "peer_neighbors": int(np.count_nonzero(index >= 0)),
            "symbol_clusters": len(symbols),
            "lead_lag_pairs": int(lead_lag_pairs["pairs"].shape[0]),
        }
        recorded_params = {
            **params.as_dict(),
            "n_returns": int(returns_matrix["returns"].shape[0]),
            "bad_prices": int(window.get("bad_prices", 0)),
            "window_first_date": str(returns_matrix.labels["dates"][0]),
            "dagster_run_id": context.run.run_id,
        }
        with measure_stage() as stats:
            engine = postgres.get_engine()
            report = publish_snapshot(
                engine,
                snapshot_date=day,
                as_of_trade_date=window["as_of_trade_date"],
                symbols=symbols,
                n_dropped=int(window["n_dropped"]),
                lookback_days=params.lookback_days,
                params=recorded_params,
                neighbor_index=index,
                neighbor_corr=np.asarray(top_k_neighbors["corr"]),
                neighbor_overlap=np.asarray(top_k_neighbors["overlap"]),
                cluster_labels=np.asarray(clusters["labels"]),
                lead_lag_pairs=np.asarray(lead_lag_pairs["pairs"]),
            )
            counts = read_snapshot_counts(engine, day)
        _log_stage(context, f"published snapshot {day}", stats)
        verdict = checks.Verdict(passed=True, metadata={f"{k}_rows": v for k, v in counts.items()})
        for table, want in expected.items():
            if counts[table] != want:
                verdict.fail(f"{table}: {counts[table]} rows for {day}, expected {want}")
        return dg.MaterializeResult(
            metadata={
                "snapshot_date": dg.MetadataValue.text(day.isoformat()),
                "as_of_trade_date": dg.MetadataValue.text(str(window["as_of_trade_date"])),
                **{f"{k}_rows": dg.MetadataValue.int(v) for k, v in counts.items()},
                "database": dg.MetadataValue.text(postgres.describe()),
                "replaced_previous": dg.MetadataValue.bool(report.replaced_previous),
                "lock_wait_seconds": dg.MetadataValue.float(round(report.lock_wait_seconds, 3)),
                **{
                    f"publish_{k}": dg.MetadataValue.float(round(v, 3))
                    for k, v in report.timings.items()
                },
                **_stage_metadata(stats),
            },
            check_results=[_check(verdict, "published_rows_match", "snapshot_publication")],
        )


snapshot_assets = [
    returns_matrix,
    correlation_and_overlap,
    top_k_neighbors_asset,
    clusters,
    lead_lag_pairs,
    snapshot_publication,
]
