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

import bisect
from functools import partial
from typing import NoReturn

import dagster as dg
import numpy as np

from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.price_source import PriceSourceError
from corr_pipeline.db.reads import published_dates
from corr_pipeline.db.synth import read_truth
from corr_pipeline.db.window import StaleSessionError, WindowError
from corr_pipeline.defs import metadata, pictures, publication, ranges
from corr_pipeline.defs.checks import check_result
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.partitions import snapshot_calendar, snapshot_date
from corr_pipeline.defs.progress import session_progress
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.defs.retries import (
    DATABASE_RETRY_POLICY,
    one_line_failure,
    retry_only_if_database_unavailable,
)
from corr_pipeline.defs.step_options import (
    MATRIX_IO_MANAGER,
    MATRIX_STEP,
    SNAPSHOT_GROUP,
    SNAPSHOT_STEP,
)
from corr_pipeline.snapshot import retention, steps, verify
from corr_pipeline.snapshot.measure import measure_stage
from corr_pipeline.snapshot.scheduler import SchedulerError
from corr_pipeline.store import writeback
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray, sources

#: The run tag naming the sessions a run was asked for before their prices were in (SPEC §2).
NO_PRICES_TAG = "corr_pipeline/no_prices_for"


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
    with one_line_failure(SchedulerError):  # refused before anything connects
        params = snapshot_params.to_parameters()
    with one_line_failure(PriceSourceError):
        source = price_source.source()
    tags = context.run.tags
    if "corr_pipeline/completeness" in tags:  # requested by prices_ready_sensor
        context.log.info(
            f"requested by the prices sensor ({tags.get('corr_pipeline/trigger')}): prices "
            f"of {context.partition_key} {float(tags['corr_pipeline/completeness']):.1%} "
            f"complete ({tags.get('corr_pipeline/symbols')} of the previous trade date's "
            "symbols)"
            + (", a re-run after a correction" if tags.get("corr_pipeline/rerun") else "")
        )
    context.log.info(
        f"loading the windows of {ranges.sessions_label(ranges.session_keys(context))}: "
        f"lookback_days={params.lookback_days}, min_history_days={params.min_history_days}, "
        f"database {postgres.describe()}, price source {source}"
    )
    keys = ranges.session_keys(context)
    with retry_only_if_database_unavailable(f"returns_matrix {ranges.sessions_label(keys)}"):
        engine = postgres.get_engine()  # a schema at another revision fails here, not retried
    windows: dict = {}
    if len(keys) > 1:  # one query for the union of the windows of the range
        days = [snapshot_date(k) for k in keys]
        with (
            retry_only_if_database_unavailable(f"returns_matrix {ranges.sessions_label(keys)}"),
            one_line_failure(PriceSourceError),
        ):
            windows = steps.load_returns_range(
                engine,
                days,
                params,
                source=source,
                session=all(snapshot_calendar.is_session(d) for d in days),
            )
    stale: list[str] = []

    def refuse_stale(exc: StaleSessionError) -> NoReturn:
        """A session without its prices: said in the run's tags and log, then one line."""
        stale.append(f"{exc.session} (latest trade date {exc.latest})")
        context.instance.add_run_tags(context.run_id, {NO_PRICES_TAG: ", ".join(stale)})
        context.log.error(str(exc))
        raise dg.Failure(description=str(exc), allow_retries=False) from exc

    def session(key: str) -> dict[str, ranges.SessionResult]:
        with retry_only_if_database_unavailable(f"returns_matrix {key}"):
            day = snapshot_date(key)
            with measure_stage() as stats:
                try:
                    if windows:
                        window = windows[day]
                        if isinstance(window, WindowError):
                            raise window
                    else:
                        with one_line_failure(PriceSourceError):
                            window = steps.load_returns(
                                engine,
                                day,
                                params,
                                source=source,
                                session=snapshot_calendar.is_session(day),
                            )
                except StaleSessionError as exc:
                    refuse_stale(exc)
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
            metadata.log_stage(context, f"returns_matrix {key} {R.shape[0]} x {R.shape[1]}", stats)
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

    yield from ranges.report(context, session)


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
    returns_matrix: ranges.Bundles,
    snapshot_params: SnapshotParams,
    matrix_store: MatrixStoreResource,
    postgres: PostgresResource,
):
    params = snapshot_params.to_parameters()
    in_memory = _sessions_in_memory(context, matrix_store, postgres)

    def session(key: str) -> dict[str, ranges.SessionResult]:
        window = ranges.of_session(returns_matrix, key)
        R = window["returns"]
        symbols = _symbols(window)
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
                partition=key,
                labels=labels,
                params=store_params,
                in_memory=key in in_memory,
            )

        with measure_stage() as stats:
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
                    runner=runner,
                )
                stored_corr = pending_corr.commit()
                stored_overlap = pending_ov.commit()
        metadata.log_stage(context, f"correlation {key} {n} x {n}", stats)
        with measure_stage() as check_stats:
            corr_stats = verify.correlation_stats(
                stored_corr.array,
                stored_overlap.array,
                min_overlap=params.min_overlap,
                finite_counts=np.isfinite(R).sum(axis=0),
                working_memory_mb=params.working_memory_mb,
            )
            verdicts = verify.verify_correlation(corr_stats)
        metadata.log_stage(context, f"correlation checks {key}", check_stats)
        placement = {
            "matrices_in_memory": dg.MetadataValue.bool(
                not stored_corr.path.is_relative_to(matrix_store.store.base_dir)
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
                    **dashboard,
                    **metadata.pictures(
                        context,
                        "correlation histogram",
                        lambda: pictures.histogram_metadata(
                            stored_corr.array, working_memory_mb=params.working_memory_mb
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

    with steps.stripe_runner(params) as runner:
        dashboard = metadata.dask_cluster(context, runner)
        yield from ranges.report(context, session)


def _sessions_in_memory(
    context: dg.AssetExecutionContext, matrix_store: MatrixStoreResource, postgres: PostgresResource
) -> set[str]:
    """The step's sessions whose matrices go to the store's memory area: those retention will
    not keep (:func:`corr_pipeline.snapshot.retention.not_kept`). When there are any, retention
    runs first, so that the memory of earlier runs' sessions is free before this run's fill it;
    it leaves the run's sessions and the published session before each (their changes read
    its matrices) alone."""
    keys = ranges.session_keys(context)
    label = ranges.sessions_label(keys)
    with retry_only_if_database_unavailable(f"correlation_and_overlap {label}"):
        engine = postgres.get_engine()
        published = published_dates(engine)
    days = {snapshot_date(key): key for key in keys}
    in_memory = {days[day] for day in retention.not_kept(days, published, matrix_store.keep())}
    if in_memory:
        context.log.info(
            f"matrices of {ranges.sessions_label(sorted(in_memory))} in memory: retention will "
            f"not keep them (the newest {matrix_store.keep()} sessions keep theirs)"
        )
        ordered = sorted(published)
        predecessors = {
            ordered[i - 1].isoformat() for day in days if (i := bisect.bisect_left(ordered, day))
        }
        publication.apply_retention(
            context, matrix_store, engine, min(keys), set(keys) | predecessors
        )
    return in_memory


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
    correlation_matrix: ranges.Bundles,
    overlap_matrix: ranges.Bundles,
    snapshot_params: SnapshotParams,
):
    params = snapshot_params.to_parameters()

    def session(key: str) -> dict[str, ranges.SessionResult]:
        corr_bundle = ranges.of_session(correlation_matrix, key)
        overlap_bundle = ranges.of_session(overlap_matrix, key)
        corr, overlap = corr_bundle["corr"], overlap_bundle["overlap"]
        symbols = _symbols(corr_bundle)
        with measure_stage() as stats:
            found = steps.neighbors(
                corr,
                overlap,
                params,
                progress=session_progress(context, f"neighbors {key}"),
                runner=runner,
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
        metadata.log_stage(context, f"top_k_neighbors {key}", stats)
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
                    **dashboard,
                },
                [check_result(verdict, "neighbors_rows_filled", "top_k_neighbors")],
            )
        }

    with steps.stripe_runner(params) as runner:
        dashboard = metadata.dask_cluster(context, runner)
        yield from ranges.report(context, session)


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
    correlation_matrix: ranges.Bundles,
    snapshot_params: SnapshotParams,
    matrix_store: MatrixStoreResource,
):
    params = snapshot_params.to_parameters()

    def session(key: str) -> dict[str, ranges.SessionResult]:
        corr_bundle = ranges.of_session(correlation_matrix, key)
        corr = corr_bundle["corr"]
        symbols = _symbols(corr_bundle)
        ranges.log(
            context,
            f"clustering {len(symbols)} symbols of {key}: {params.linkage_method} linkage, "
            f"{params.cut}",
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
            modes = steps.market_modes(corr, params)
            labels = steps.clusters(
                corr,
                params,
                modes=modes,
                scratch=partial(matrix_store.scratch_for, context, partition=key),
            )
            verdict = verify.verify_clusters(labels, len(symbols))
        metadata.log_stage(context, f"clusters {key}", stats)
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

    yield from ranges.report(context, session)


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
    returns_matrix: ranges.Bundles,
    correlation_matrix: ranges.Bundles,
    snapshot_params: SnapshotParams,
):
    params = snapshot_params.to_parameters()

    def session(key: str) -> dict[str, ranges.SessionResult]:
        window = ranges.of_session(returns_matrix, key)
        corr_bundle = ranges.of_session(correlation_matrix, key)
        R, corr = window["returns"], corr_bundle["corr"]
        symbols = _symbols(window)
        with (
            retry_only_if_database_unavailable(f"lead_lag_pairs {key}"),
            measure_stage() as stats,
        ):
            pairs = steps.lead_lag(
                R,
                corr,
                params,
                progress=session_progress(context, f"lead-lag scan {key}"),
                runner=runner,
            )
            contract = verify.verify_lead_lag_pairs(
                pairs,
                len(symbols),
                max_lag=params.max_lag,
                min_overlap=params.min_overlap,
                min_improvement=params.min_improvement,
            )
        metadata.log_stage(context, f"lead_lag_pairs {key} ({pairs.shape[0]} pairs)", stats)
        bundle = MatrixBundle(
            {"pairs": pairs},
            labels={"symbols": symbols},
            params={
                "max_lag": params.max_lag,
                "k_leaders": params.k_leaders,
                "k_laggers": params.k_laggers,
                "min_overlap": params.min_overlap,
                "min_improvement": params.min_improvement,
            },
            inputs=sources(window, corr_bundle),
        )
        return {
            "lead_lag_pairs": ranges.SessionResult(
                bundle,
                {
                    **metadata.lead_lag(pairs, symbols, stats),
                    **dashboard,
                    **metadata.pictures(
                        context,
                        "lead-lag network",
                        lambda: pictures.lead_lag_network_metadata(pairs, symbols),
                        session=key,
                    ),
                },
                [check_result(contract, "lead_lag_contract", "lead_lag_pairs")],
            )
        }

    with steps.stripe_runner(params) as runner:
        dashboard = metadata.dask_cluster(context, runner)
        yield from ranges.report(context, session)


@dg.asset_check(  # type: ignore[arg-type]  # a generator: no result without ground truth
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
    lead_lag_pairs: ranges.Bundles,
    postgres: PostgresResource,
):
    """The recall of the synthetic universe's injected pairs, apart from the production asset
    (which never reads the synthetic ground truth). Without ground truth it reports nothing:
    the check shows as not evaluated for that partition, and the run is unaffected. In a run
    over a range, one evaluation per session."""
    keys = ranges.session_keys(context)
    with retry_only_if_database_unavailable(f"injected_pairs_found {ranges.sessions_label(keys)}"):
        truth = read_truth(postgres.get_engine())
    if not truth:
        context.log.info("no synthetic ground truth (synthetic.lead_lag_truth is empty)")
        yield dg.Output(None)  # the check's output, with no evaluation
        return
    for key in keys:
        bundle = ranges.of_session(lead_lag_pairs, key)
        verdict = verify.verify_injected_pairs(bundle["pairs"], _symbols(bundle), truth)
        result = check_result(
            verdict, "injected_pairs_found", "lead_lag_pairs", severity=dg.AssetCheckSeverity.WARN
        )
        yield result if context.has_partition_key else ranges.evaluation(result, key, False)
    if not context.has_partition_key:
        yield dg.Output(None)


snapshot_assets = [
    returns_matrix,
    correlation_and_overlap,
    top_k_neighbors_asset,
    clusters,
    lead_lag_pairs,
    publication.snapshot_publication,
    publication.snapshot_changes,
    injected_pairs_found,  # the one separate asset check (synthetic data only)
]
