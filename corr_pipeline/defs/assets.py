"""The correlation snapshot as Dagster assets, one partition per snapshot date.

::

    prices ─► returns_matrix ─┬─► correlation_matrix + overlap_matrix ─┬─► top_k_neighbors ─┐
                              │                                        ├─► clusters ────────┤
                              └──────────(with the sync corr)──────────┴─► lead_lag_pairs ──┴─► snapshot_publication
                                                                                                         │
                                                                                 snapshot_changes ◄──────┘

Each asset loads its inputs (read-only memory maps through the matrix-store IO manager), calls
one step of :mod:`corr_pipeline.snapshot.steps`, verifies the result
(:mod:`corr_pipeline.snapshot.verify`, returned as asset checks) and describes it
(:mod:`corr_pipeline.defs.metadata`). Only ``snapshot_publication`` writes to PostgreSQL, in
one transaction for the three result tables (SPEC §7), recording the matrix-store versions the
results come from (each bundle records the versions it read as its ``inputs``); it then applies
the store's retention (SPEC §8). ``snapshot_changes`` then compares the publication with the
previous published session's (SPEC §10) and publishes the changes the same way (and applies
retention again, now that the previous session's matrices are no longer needed). Only
``returns_matrix`` reads prices; the synthetic ground truth is read by the separate check ``injected_pairs_found`` alone. The memory of each step is
listed in
:mod:`corr_pipeline.snapshot.steps`; with the multiprocess executor each step is its own
process. Retries: see :mod:`corr_pipeline.defs.retries`.
"""

import warnings
from functools import partial

import dagster as dg
import numpy as np
from pydantic import Field

from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.price_source import PriceSourceError
from corr_pipeline.db.publish import publish_snapshot, read_snapshot_counts
from corr_pipeline.db.reads import (
    changes_to_refresh,
    published_matrix_versions,
    recorded_change_dates,
)
from corr_pipeline.db.synth import read_truth
from corr_pipeline.defs import metadata, pictures
from corr_pipeline.defs.checks import check_result
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.partitions import snapshot_date
from corr_pipeline.defs.progress import dagster_progress
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.defs.retries import (
    DATABASE_RETRY_POLICY,
    one_line_failure,
    retry_only_if_database_unavailable,
)
from corr_pipeline.defs.runs import partitions_in_flight
from corr_pipeline.defs.step_options import (
    MATRIX_IO_MANAGER,
    MATRIX_STEP,
    SNAPSHOT_GROUP,
    SNAPSHOT_STEP,
)
from corr_pipeline.snapshot import changes, display, retention, steps, verify
from corr_pipeline.snapshot.measure import measure_stage
from corr_pipeline.store import writeback
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray, sources


def _symbols(bundle: MatrixBundle) -> list[str]:
    return list(bundle.labels["symbols"])


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
    "snapshot date, read from the price source (`prices` unless configured); labels: symbols, "
    "dates; dropped symbols with reasons.",
)
def returns_matrix(
    context: dg.AssetExecutionContext,
    postgres: PostgresResource,
    snapshot_params: SnapshotParams,
    price_source: PriceSourceResource,
):
    with retry_only_if_database_unavailable(f"returns_matrix {context.partition_key}"):
        params = snapshot_params.to_parameters()
        day = snapshot_date(context.partition_key)
        with one_line_failure(PriceSourceError):
            source = price_source.source()
        tags = context.run.tags
        if "corr_pipeline/completeness" in tags:  # requested by prices_ready_sensor
            context.log.info(
                f"requested by the prices sensor ({tags.get('corr_pipeline/trigger')}): prices "
                f"of {day} {float(tags['corr_pipeline/completeness']):.1%} complete "
                f"({tags.get('corr_pipeline/symbols')} of the previous trade date's symbols)"
                + (", a re-run after a correction" if tags.get("corr_pipeline/rerun") else "")
            )
        context.log.info(
            f"loading the window for {day}: lookback_days={params.lookback_days}, "
            f"min_history_days={params.min_history_days}, database {postgres.describe()}, "
            f"price source {source}"
        )
        with measure_stage() as stats:
            with one_line_failure(PriceSourceError):
                window = steps.load_returns(postgres.get_engine(), day, params, source=source)
            for note in window.source_notes:
                context.log.warning(f"price source: {note}")
            R = window.returns
            verdict = verify.verify_returns(
                R,
                window.symbols,
                min_history_days=params.min_history_days,
                lookback_days=params.lookback_days,
                working_memory_mb=params.working_memory_mb,
            )
        metadata.log_stage(context, f"returns_matrix {R.shape[0]} x {R.shape[1]}", stats)
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
        return dg.MaterializeResult(
            value=bundle,
            metadata={
                **metadata.returns_window(window, verdict, stats),
                "price_source": dg.MetadataValue.text(window.source),
            },
            check_results=[check_result(verdict, "returns_contract", "returns_matrix")],
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
#: Verdict of :func:`corr_pipeline.snapshot.verify.verify_correlation` behind each check.
CORRELATION_VERDICTS = {
    "corr_exactly_symmetric": "symmetry",
    "corr_unit_diagonal": "unit_diagonal",
    "corr_in_range": "range",
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
    params = snapshot_params.to_parameters()
    R = returns_matrix["returns"]
    symbols = _symbols(returns_matrix)
    n = len(symbols)
    labels = {"symbols": symbols}
    store_params = {"min_overlap": params.min_overlap, "n_returns": int(R.shape[0])}

    def allocate(asset: str, name: str, dtype: np.dtype):
        return matrix_store.allocate_for(
            context,
            name,
            (n, n),
            dtype,
            asset_key=dg.AssetKey(asset),
            labels=labels,
            params=store_params,
        )

    with measure_stage() as stats:
        with (
            allocate("correlation_matrix", "corr", np.dtype(np.float32)) as pending_corr,
            allocate("overlap_matrix", "overlap", overlap_dtype(int(R.shape[0]))) as pending_ov,
            steps.stripe_runner(params) as runner,
        ):
            dashboard = metadata.dask_cluster(context, runner)
            steps.correlation(
                R,
                params,
                out_corr=pending_corr.array,
                out_overlap=pending_ov.array,
                progress=dagster_progress(context, "correlation"),
                runner=runner,
            )
            stored_corr = pending_corr.commit()
            stored_overlap = pending_ov.commit()
    metadata.log_stage(context, f"correlation {n} x {n}", stats)
    with measure_stage() as check_stats:
        corr_stats = verify.correlation_stats(
            stored_corr.array,
            stored_overlap.array,
            min_overlap=params.min_overlap,
            finite_counts=np.isfinite(R).sum(axis=0),
            working_memory_mb=params.working_memory_mb,
        )
        verdicts = verify.verify_correlation(corr_stats)
    metadata.log_stage(context, "correlation checks", check_stats)
    yield dg.MaterializeResult(
        asset_key="correlation_matrix",
        value=MatrixBundle(
            {"corr": stored_corr},
            labels=labels,
            params=store_params,
            inputs=sources(returns_matrix),
        ),
        metadata={
            **metadata.correlation(n, corr_stats, stats, check_stats),
            **dashboard,
            **metadata.pictures(
                context,
                "correlation histogram",
                lambda: pictures.histogram_metadata(
                    stored_corr.array, working_memory_mb=params.working_memory_mb
                ),
            ),
        },
    )
    yield dg.MaterializeResult(
        asset_key="overlap_matrix",
        value=MatrixBundle(
            {"overlap": stored_overlap},
            labels=labels,
            params=store_params,
            inputs=sources(returns_matrix),
        ),
        metadata=metadata.overlap(n, corr_stats, stored_overlap.dtype),
    )
    for check_name, verdict_name in CORRELATION_VERDICTS.items():
        yield check_result(verdicts[verdict_name], check_name, "correlation_matrix")


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
    params = snapshot_params.to_parameters()
    corr, overlap = correlation_matrix["corr"], overlap_matrix["overlap"]
    symbols = _symbols(correlation_matrix)
    with measure_stage() as stats, steps.stripe_runner(params) as runner:
        dashboard = metadata.dask_cluster(context, runner)
        found = steps.neighbors(
            corr, overlap, params, progress=dagster_progress(context, "neighbors"), runner=runner
        )
        verdict = verify.verify_neighbors(
            found.index,
            found.corr,
            corr,
            k=params.k_neighbors,
            neighbor_overlap=found.overlap,
            overlap=overlap,
            working_memory_mb=params.working_memory_mb,
        )
    metadata.log_stage(context, "top_k_neighbors", stats)
    arrays: dict[str, np.ndarray | StoredArray] = {"index": found.index, "corr": found.corr}
    if found.overlap is not None:
        arrays["overlap"] = found.overlap
    return dg.MaterializeResult(
        value=MatrixBundle(
            arrays,
            labels={"symbols": symbols},
            params={"k": params.k_neighbors},
            inputs=sources(correlation_matrix, overlap_matrix),
        ),
        metadata={
            **metadata.neighbors(len(symbols), params.k_neighbors, verdict, stats),
            **dashboard,
        },
        check_results=[check_result(verdict, "neighbors_rows_filled", "top_k_neighbors")],
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
    matrix_store: MatrixStoreResource,
):
    params = snapshot_params.to_parameters()
    corr = correlation_matrix["corr"]
    symbols = _symbols(correlation_matrix)
    context.log.info(
        f"clustering {len(symbols)} symbols: {params.linkage_method} linkage, {params.cut}"
    )
    if steps.distances_in_scratch(len(symbols), params):
        warning = writeback.rewrite_warning(
            "the clustering step's scratch distances",
            steps.distance_bytes(len(symbols)),
            or_else="set clusters_memory_mb above it where memory allows",
        )
        if warning is not None:
            context.log.warning(warning)
    with measure_stage() as stats:
        labels = steps.clusters(corr, params, scratch=partial(matrix_store.scratch_for, context))
        verdict = verify.verify_clusters(labels, len(symbols))
    metadata.log_stage(context, "clusters", stats)
    return dg.MaterializeResult(
        value=MatrixBundle(
            {"labels": labels},
            labels={"symbols": symbols},
            params={
                "linkage_method": params.linkage_method,
                "distance_threshold": params.distance_threshold,
                "n_clusters": params.n_clusters,
            },
            inputs=sources(correlation_matrix),
        ),
        metadata={
            **metadata.clusters(labels, symbols, verdict, stats),
            **metadata.pictures(
                context,
                "clustered heatmap",
                lambda: pictures.heatmap_metadata(
                    corr, labels, working_memory_mb=params.working_memory_mb
                ),
            ),
        },
        check_results=[check_result(verdict, "every_symbol_labelled", "clusters")],
    )


# --------------------------------------------------------------------------------------------
# lead_lag_pairs (SPEC §6)
# --------------------------------------------------------------------------------------------


@dg.asset(
    **MATRIX_STEP,
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
    ],
    description="Lead-lag pairs (SPEC §6): exact best-lag scan over lags 1..max_lag, "
    "per-symbol top leaders/laggers by improvement over the synchronous correlation.",
)
def lead_lag_pairs(
    context: dg.AssetExecutionContext,
    returns_matrix: MatrixBundle,
    correlation_matrix: MatrixBundle,
    snapshot_params: SnapshotParams,
):
    with retry_only_if_database_unavailable(f"lead_lag_pairs {context.partition_key}"):
        params = snapshot_params.to_parameters()
        R, corr = returns_matrix["returns"], correlation_matrix["corr"]
        symbols = _symbols(returns_matrix)
        with measure_stage() as stats, steps.stripe_runner(params) as runner:
            dashboard = metadata.dask_cluster(context, runner)
            pairs = steps.lead_lag(
                R,
                corr,
                params,
                progress=dagster_progress(context, "lead-lag scan"),
                runner=runner,
            )
            contract = verify.verify_lead_lag_pairs(
                pairs,
                len(symbols),
                max_lag=params.max_lag,
                min_overlap=params.min_overlap,
                min_improvement=params.min_improvement,
            )
        metadata.log_stage(context, f"lead_lag_pairs ({pairs.shape[0]} pairs)", stats)
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
                inputs=sources(returns_matrix, correlation_matrix),
            ),
            metadata={
                **metadata.lead_lag(pairs, symbols, stats),
                **dashboard,
                **metadata.pictures(
                    context,
                    "lead-lag network",
                    lambda: pictures.lead_lag_network_metadata(pairs, symbols),
                ),
            },
            check_results=[check_result(contract, "lead_lag_contract", "lead_lag_pairs")],
        )


@dg.asset_check(  # type: ignore[arg-type]  # returning None (no result) is deliberate
    asset=lead_lag_pairs,
    name="injected_pairs_found",
    partitions_def=SNAPSHOT_STEP["partitions_def"],
    pool=SNAPSHOT_STEP["pool"],
    retry_policy=DATABASE_RETRY_POLICY,
    description="Synthetic data only: every injected (leader, lagger, lag) of "
    "synthetic.lead_lag_truth whose symbols were kept is found with its lag (warns otherwise). "
    "Reports nothing when there is no synthetic ground truth (production data).",
)
def injected_pairs_found(
    context: dg.AssetCheckExecutionContext,
    lead_lag_pairs: MatrixBundle,
    postgres: PostgresResource,
) -> dg.AssetCheckResult | None:
    """The recall of the synthetic universe's injected pairs, apart from the production asset
    (which never reads the synthetic ground truth). Without ground truth it returns no result:
    the check shows as not evaluated for that partition, and the run is unaffected."""
    with retry_only_if_database_unavailable(f"injected_pairs_found {context.partition_key}"):
        truth = read_truth(postgres.get_engine())
        if not truth:
            context.log.info("no synthetic ground truth (synthetic.lead_lag_truth is empty)")
            return None
        verdict = verify.verify_injected_pairs(
            lead_lag_pairs["pairs"], _symbols(lead_lag_pairs), truth
        )
        return check_result(
            verdict, "injected_pairs_found", "lead_lag_pairs", severity=dg.AssetCheckSeverity.WARN
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
    "transaction, replacing any earlier version of the same snapshot date (SPEC §7), with the "
    "matrix-store versions they were computed from (snapshots.matrix_versions, SPEC §8); then "
    "applies the store's retention (matrix_store.keep_matrices).",
)
def snapshot_publication(
    context: dg.AssetExecutionContext,
    returns_matrix: MatrixBundle,
    top_k_neighbors: MatrixBundle,
    clusters: MatrixBundle,
    lead_lag_pairs: MatrixBundle,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
    matrix_store: MatrixStoreResource,
):
    with retry_only_if_database_unavailable(f"snapshot_publication {context.partition_key}"):
        params = snapshot_params.to_parameters()
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
        try:
            versions = steps.matrix_versions(
                matrix_store.store,
                context.partition_key,
                returns=returns_matrix,
                neighbors=top_k_neighbors,
                clusters=clusters,
                lead_lag=lead_lag_pairs,
            )
        except steps.InconsistentInputsError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        window = returns_matrix.params
        results = steps.results_for_publication(
            day,
            as_of_trade_date=window["as_of_trade_date"],
            symbols=symbols,
            n_dropped=int(window["n_dropped"]),
            params=params,
            found=Neighbors(
                top_k_neighbors["index"], top_k_neighbors["corr"], top_k_neighbors["overlap"]
            ),
            labels=clusters["labels"],
            pairs=lead_lag_pairs["pairs"],
            recorded={
                "n_returns": int(returns_matrix["returns"].shape[0]),
                "bad_prices": int(window.get("bad_prices", 0)),
                "window_first_date": str(returns_matrix.labels["dates"][0]),
                "dagster_run_id": context.run.run_id,
            },
            matrix_versions=versions,
        )
        with measure_stage() as stats:
            engine = postgres.get_engine()
            report = publish_snapshot(engine, results)
            counts = read_snapshot_counts(engine, day)
        metadata.log_stage(context, f"published snapshot {day}", stats)
        verdict = verify.verify_published_counts(results, counts)
    retention_metadata = _apply_retention(context, matrix_store, engine)
    return dg.MaterializeResult(
        metadata={
            "snapshot_date": dg.MetadataValue.text(day.isoformat()),
            "as_of_trade_date": dg.MetadataValue.text(str(window["as_of_trade_date"])),
            **{f"{k}_rows": dg.MetadataValue.int(v) for k, v in counts.items()},
            "database": dg.MetadataValue.text(postgres.describe()),
            "replaced_previous": dg.MetadataValue.bool(report.replaced_previous),
            "lock_wait_seconds": metadata.number(report.lock_wait_seconds, display.seconds),
            **{
                f"publish_{k}": metadata.number(v, display.seconds)
                for k, v in report.timings.items()
            },
            "matrix_versions": dg.MetadataValue.json(versions),
            **retention_metadata,
            **metadata.stage(stats),
        },
        check_results=[check_result(verdict, "published_rows_match", "snapshot_publication")],
    )


def _apply_retention(
    context: dg.AssetExecutionContext, matrix_store: MatrixStoreResource, engine
) -> dict[str, dg.MetadataValue]:
    """Retention after a committed publication (:mod:`corr_pipeline.snapshot.retention`): never
    fails the publication, which is committed; a problem is logged and shown in the metadata
    (the next publication, or ``corr-pipeline store prune``, applies it again)."""
    try:
        keep = matrix_store.keep()
        in_flight = partitions_in_flight(context.instance, exclude_run_id=context.run.run_id)
        report = retention.apply_retention(
            matrix_store.store,
            lambda: published_matrix_versions(engine),
            keep,
            writing=context.partition_key,
            in_flight=in_flight,
            read_changed=lambda: recorded_change_dates(engine),
        )
    except Exception as exc:  # noqa: BLE001 - the publication itself succeeded
        context.log.warning(
            f"matrix-store retention skipped: {type(exc).__name__}: {exc} (the publication is "
            "committed; run `corr-pipeline store prune` or let the next publication apply it)"
        )
        return {"retention_error": dg.MetadataValue.text(f"{type(exc).__name__}: {exc}")}
    for line in report.lines():
        context.log.info(line)
    return {
        "retention_keep": dg.MetadataValue.int(keep),
        "retention_removed": dg.MetadataValue.json(report.removed_partitions),
        "retention_freed_bytes": dg.MetadataValue.int(report.freed_bytes),
        "retention_left_alone": dg.MetadataValue.json(sorted(report.busy)),
    }


# --------------------------------------------------------------------------------------------
# snapshot_changes (SPEC §10)
# --------------------------------------------------------------------------------------------


#: ``snapshot_changes`` of session ``D`` reads the publications of ``D`` and of the previous
#: session: the partitions ``[D - 1, D]`` of ``snapshot_publication`` (the previous *partition*
#: is the previous session of the calendar; none for the first). Only this asset depends on the
#: previous partition, so the snapshots of a backfill still run in parallel (one run per
#: partition, pool ``corr_pipeline_snapshot``): the backfill holds ``snapshot_changes`` of ``D``
#: until the publication of ``D - 1`` is done (the lineage shows both). Which session is
#: compared stays data-driven: the newest
#: *published* one before ``D`` (a session never published is passed over), SPEC §10.
#: ``allow_nonexistent_upstream_partitions`` ("beta" in Dagster 1.13, relied on deliberately:
#: the first partition has no previous one) warns once here, silenced like step_options' ones.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore",
        message="Parameter `allow_nonexistent_upstream_partitions`",
        category=dg.BetaWarning,
    )
    PREVIOUS_AND_THIS_PUBLICATION = dg.AssetDep(
        "snapshot_publication",
        partition_mapping=dg.TimeWindowPartitionMapping(
            start_offset=-1, end_offset=0, allow_nonexistent_upstream_partitions=True
        ),
    )


class ChangesConfig(dg.Config):
    """Run configuration of ``snapshot_changes``."""

    top_m: int = Field(
        default=100, ge=0, description="Pairs kept by |corr today - corr previous| (SPEC §10.2)."
    )


def _compute_changes(context, engine, matrix_store, day, config, params):
    """:func:`corr_pipeline.snapshot.changes.compute_and_publish` of ``day`` with the run's
    configuration, logging to the run: (results, rows, report), or None without a previous
    session."""
    return changes.compute_and_publish(
        engine,
        matrix_store.store,
        day,
        top_m=config.top_m,
        working_memory_mb=params.working_memory_mb,
        log=context.log.info,
    )


def _refresh_following(context, engine, matrix_store, day, config, params) -> dict:
    """Compute again the changes of the next published session when they are stale or missing
    now that ``day`` is published (:func:`corr_pipeline.db.reads.changes_to_refresh`): a
    re-published ``day``, or runs of a parallel backfill that computed the next session's
    changes before ``day`` was published. Returns the metadata saying which date (or none)."""
    following = changes_to_refresh(engine, day)
    if following is None:
        return {"refreshed_following": dg.MetadataValue.text("none")}
    refreshed = _compute_changes(context, engine, matrix_store, following, config, params)
    if refreshed is None:  # cannot happen: day is published before following
        return {"refreshed_following": dg.MetadataValue.text("none")}
    context.log.info(
        f"the changes of {following} were stale or missing: recomputed against "
        f"{refreshed[0].previous_date}"
    )
    return {"refreshed_following": dg.MetadataValue.text(following.isoformat())}


def _nothing_recorded(context, note: str, refreshed: dict) -> dg.MaterializeResult:
    """The result of a ``snapshot_changes`` run that compares nothing, saying why."""
    context.log.info(f"{note}: no changes recorded")
    return dg.MaterializeResult(
        metadata={
            "previous_date": dg.MetadataValue.text("none"),
            "recorded": dg.MetadataValue.bool(False),
            "note": dg.MetadataValue.text(note),
            **refreshed,
        }
    )


@dg.asset(
    **SNAPSHOT_STEP,
    group_name=SNAPSHOT_GROUP,
    retry_policy=DATABASE_RETRY_POLICY,
    kinds={"postgres", "numpy"},
    deps=[PREVIOUS_AND_THIS_PUBLICATION],
    description="What changed since the previous published session (SPEC §10): market-level "
    "drift, the largest correlation moves, neighbor turnover, cluster migrations, lead-lag "
    "changes, symbols entered and left; published in one transaction (change_* tables), "
    "replacing an earlier version of the date. Records nothing when no earlier session is "
    "published, or the date itself is not (yet) published.",
)
def snapshot_changes(
    context: dg.AssetExecutionContext,
    config: ChangesConfig,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
    matrix_store: MatrixStoreResource,
):
    with retry_only_if_database_unavailable(f"snapshot_changes {context.partition_key}"):
        params = snapshot_params.to_parameters()
        day = snapshot_date(context.partition_key)
        engine = postgres.get_engine()
        with measure_stage() as stats:
            try:
                published = _compute_changes(context, engine, matrix_store, day, config, params)
            except LookupError as exc:
                # an asset backfill of the sessions before ``day`` targets this partition too
                # (its changes depend on the previous session's publication): its own run
                # computes them once ``day`` is published
                return _nothing_recorded(context, f"{exc}: nothing to compare", {})
            if published is None:
                return _nothing_recorded(
                    context,
                    f"no snapshot before {day} is published: nothing to compare",
                    _refresh_following(context, engine, matrix_store, day, config, params),
                )
            results, rows, report = published
            refreshed = _refresh_following(context, engine, matrix_store, day, config, params)
        metadata.log_stage(context, f"changes {day} vs {results.previous_date}", stats)
        for part, reason in results.skipped.items():
            context.log.warning(f"{part} skipped: {reason}")
    retention_metadata = _apply_retention(context, matrix_store, engine)
    corr = results.correlation
    return dg.MaterializeResult(
        metadata={
            "recorded": dg.MetadataValue.bool(True),
            **metadata.changes(results, dict(rows.summary), dict(rows.rows), stats),
            **{f"{t}_rows": dg.MetadataValue.int(n) for t, n in report.rows.items()},
            "replaced_previous": dg.MetadataValue.bool(report.replaced_previous),
            **refreshed,
            **retention_metadata,
            **(
                {}
                if corr is None
                else metadata.pictures(
                    context,
                    "change histogram",
                    lambda: pictures.change_histogram_metadata(
                        corr.change_counts,
                        corr.change_edges,
                        mean_abs_change=corr.means["abs_change"],
                        title=f"Correlation changes {results.previous_date} → {day}",
                    ),
                )
            ),
        },
    )


snapshot_assets = [
    returns_matrix,
    correlation_and_overlap,
    top_k_neighbors_asset,
    clusters,
    lead_lag_pairs,
    snapshot_publication,
    snapshot_changes,
    injected_pairs_found,  # the one separate asset check (synthetic data only)
]
