"""Publication and changes as Dagster assets: ``snapshot_publication`` (SPEC §7, then the
store's retention, SPEC §8) and ``snapshot_changes`` (SPEC §10, against the previous published
session).

In a run over a range of sessions both go session by session in date order: each session is
published in its own transaction, then (in ``snapshot_changes``) compared with the session
before it, exactly as a run of that session alone would. Retention runs once per step, after
its last session: the run holds the partitions of all its sessions until it ends (later steps
read them), so the next publication (or ``corr-pipeline backfill``, when it is done) prunes
them.
"""

import warnings
from functools import partial

import dagster as dg
from pydantic import Field

from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.db.publish import publish_snapshot, read_snapshot_counts
from corr_pipeline.db.reads import (
    changes_to_refresh,
    published_matrix_versions,
    recorded_change_dates,
)
from corr_pipeline.defs import metadata, pictures, ranges
from corr_pipeline.defs.checks import check_result
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.metadata_order import in_reading_order
from corr_pipeline.defs.partitions import snapshot_date
from corr_pipeline.defs.resources import PostgresResource, SnapshotParams
from corr_pipeline.defs.retries import DATABASE_RETRY_POLICY, retry_only_if_database_unavailable
from corr_pipeline.defs.runs import partitions_in_flight
from corr_pipeline.defs.step_options import SNAPSHOT_GROUP, SNAPSHOT_STEP
from corr_pipeline.snapshot import changes, display, retention, steps, verify
from corr_pipeline.snapshot.measure import measure_stage
from corr_pipeline.store.matrix_store import MatrixBundle


@dg.asset(
    **SNAPSHOT_STEP,
    group_name=SNAPSHOT_GROUP,
    dagster_type=dg.Nothing,  # the rows are in PostgreSQL: nothing for an IO manager
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
    returns_matrix: ranges.Bundles,
    top_k_neighbors: ranges.Bundles,
    clusters: ranges.Bundles,
    lead_lag_pairs: ranges.Bundles,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
    matrix_store: MatrixStoreResource,
):
    params = snapshot_params.to_parameters()
    label = ranges.sessions_label(ranges.session_keys(context))
    with retry_only_if_database_unavailable(f"snapshot_publication {label}"):
        engine = postgres.get_engine()
    # the run's own sessions stay: snapshot_changes reads their matrices after this step
    this_run = set(ranges.session_keys(context))

    def session(key: str) -> dict[str, ranges.SessionResult]:
        window_bundle = ranges.of_session(returns_matrix, key)
        neighbors = ranges.of_session(top_k_neighbors, key)
        labels = ranges.of_session(clusters, key)
        pairs = ranges.of_session(lead_lag_pairs, key)
        with retry_only_if_database_unavailable(f"snapshot_publication {key}"):
            day = snapshot_date(key)
            results, versions = _results(
                context, matrix_store.store, key, params, window_bundle, neighbors, labels, pairs
            )
            with measure_stage() as stats:
                report = publish_snapshot(engine, results)
                counts = read_snapshot_counts(engine, day)
            metadata.log_stage(context, f"published snapshot {day}", stats)
            verdict = verify.verify_published_counts(results, counts)
        retention_metadata = (
            apply_retention(context, matrix_store, engine, key, this_run)
            if key == max(this_run)  # a run's sessions stay held until it ends: once is enough
            else {}
        )
        window = window_bundle.params
        return {
            "snapshot_publication": ranges.SessionResult(
                None,
                {
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
                [check_result(verdict, "published_rows_match", "snapshot_publication")],
            )
        }

    yield from ranges.report(context, session)


def _symbols(bundle: MatrixBundle) -> list[str]:
    return list(bundle.labels["symbols"])


def _results(context, store, key, params, window_bundle, neighbors, labels, pairs):
    """What session ``key`` publishes (:func:`corr_pipeline.snapshot.steps.results_for_publication`)
    and the store versions it pins; ``dg.Failure`` when its inputs do not belong together."""
    day = snapshot_date(key)
    symbols = _symbols(window_bundle)
    for name, bundle in (
        ("top_k_neighbors", neighbors),
        ("clusters", labels),
        ("lead_lag_pairs", pairs),
    ):
        if _symbols(bundle) != symbols:
            raise dg.Failure(
                description=f"{name} was computed on other symbols than returns_matrix for "
                f"{day}: re-materialize the whole partition",
                allow_retries=False,
            )
    try:
        versions = steps.matrix_versions(
            store,
            key,
            returns=window_bundle,
            neighbors=neighbors,
            clusters=labels,
            lead_lag=pairs,
        )
    except steps.InconsistentInputsError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    window = window_bundle.params
    results = steps.results_for_publication(
        day,
        as_of_trade_date=window["as_of_trade_date"],
        symbols=symbols,
        n_dropped=int(window["n_dropped"]),
        params=params,
        found=Neighbors(neighbors["index"], neighbors["corr"], neighbors["overlap"]),
        labels=labels["labels"],
        pairs=pairs["pairs"],
        recorded={
            "n_returns": int(window_bundle["returns"].shape[0]),
            "bad_prices": int(window.get("bad_prices", 0)),
            "window_first_date": str(window_bundle.labels["dates"][0]),
            "dagster_run_id": context.run.run_id,
        },
        matrix_versions=versions,
    )
    return results, versions


def apply_retention(
    context: dg.AssetExecutionContext,
    matrix_store: MatrixStoreResource,
    engine,
    writing: str,
    still_needed: set[str],
) -> dict[str, dg.MetadataValue]:
    """Retention after the committed publication of session ``writing``
    (:mod:`corr_pipeline.snapshot.retention`), leaving alone the partitions of the other runs in
    flight and ``still_needed`` (sessions of this run that later steps read). Never fails the
    publication, which is committed; a problem is logged and shown in the metadata (the next
    publication, or ``corr-pipeline store prune``, applies it again)."""
    try:
        keep = matrix_store.keep()
        in_flight = partitions_in_flight(context.instance, exclude_run_id=context.run.run_id)
        report = retention.apply_retention(
            matrix_store.store,
            lambda: published_matrix_versions(engine),
            keep,
            writing=writing,
            in_flight=in_flight | (still_needed - {writing}),
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
        log=partial(ranges.log, context),
    )


def _refresh_following(context, engine, matrix_store, day, config, params, later) -> dict:
    """Compute again the changes of the next published session when they are stale or missing
    now that ``day`` is published (:func:`corr_pipeline.db.reads.changes_to_refresh`): a
    re-published ``day``, or runs of a parallel backfill that computed the next session's
    changes before ``day`` was published. Returns the metadata saying which date (or none)."""
    following = changes_to_refresh(engine, day)
    if following is None or following.isoformat() in later:  # this step computes it next
        return {"refreshed_following": dg.MetadataValue.text("none")}
    with measure_stage() as stats:
        refreshed = _compute_changes(context, engine, matrix_store, following, config, params)
    if refreshed is None:  # cannot happen: day is published before following
        return {"refreshed_following": dg.MetadataValue.text("none")}
    results, rows, report = refreshed
    context.log.info(
        f"the changes of {following} were stale or missing: recomputed against "
        f"{results.previous_date}"
    )
    # the following session's partition shows what its rows now say (the UI and the database
    # agree): a materialization of that partition, logged by this run
    context.log_event(
        dg.AssetMaterialization(
            asset_key="snapshot_changes",
            partition=following.isoformat(),
            description=f"changes of {following} recomputed by the run of {day}",
            metadata=in_reading_order(
                {
                    "recorded": dg.MetadataValue.bool(True),
                    **metadata.changes(results, dict(rows.summary), dict(rows.rows), stats),
                    **{f"{t}_rows": dg.MetadataValue.int(n) for t, n in report.rows.items()},
                    "replaced_previous": dg.MetadataValue.bool(report.replaced_previous),
                    "refreshed_by": dg.MetadataValue.text(day.isoformat()),
                }
            ),
        )
    )
    return {"refreshed_following": dg.MetadataValue.text(following.isoformat())}


def _nothing_recorded(context, note: str, refreshed: dict) -> dict[str, ranges.SessionResult]:
    """The result of a session whose changes compare nothing, saying why."""
    context.log.info(f"{note}: no changes recorded")
    return {
        "snapshot_changes": ranges.SessionResult(
            None,
            {
                "previous_date": dg.MetadataValue.text("none"),
                "recorded": dg.MetadataValue.bool(False),
                "note": dg.MetadataValue.text(note),
                **refreshed,
            },
        )
    }


@dg.asset(
    **SNAPSHOT_STEP,
    group_name=SNAPSHOT_GROUP,
    dagster_type=dg.Nothing,  # the rows are in PostgreSQL: nothing for an IO manager
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
    params = snapshot_params.to_parameters()
    keys = ranges.session_keys(context)
    with retry_only_if_database_unavailable(f"snapshot_changes {ranges.sessions_label(keys)}"):
        engine = postgres.get_engine()

    def session(key: str) -> dict[str, ranges.SessionResult]:
        later = {k for k in keys if k > key}  # their changes still read this session's matrices
        with retry_only_if_database_unavailable(f"snapshot_changes {key}"):
            day = snapshot_date(key)
            with measure_stage() as stats:
                try:
                    published = _compute_changes(context, engine, matrix_store, day, config, params)
                except LookupError as exc:
                    # an asset backfill of the sessions before ``day`` targets this partition
                    # too (its changes depend on the previous session's publication): its own
                    # run computes them once ``day`` is published
                    return _nothing_recorded(context, f"{exc}: nothing to compare", {})
                if published is None:
                    return _nothing_recorded(
                        context,
                        f"no snapshot before {day} is published: nothing to compare",
                        _refresh_following(
                            context, engine, matrix_store, day, config, params, later
                        ),
                    )
                results, rows, report = published
                refreshed = _refresh_following(
                    context, engine, matrix_store, day, config, params, later
                )
            metadata.log_stage(context, f"changes {day} vs {results.previous_date}", stats)
            for part, reason in results.skipped.items():
                context.log.warning(f"{part} skipped: {reason}")
        retention_metadata = (
            {}
            if later  # a run's sessions stay held until it ends: once, after its last, is enough
            else apply_retention(context, matrix_store, engine, key, {key})
        )
        corr = results.correlation
        return {
            "snapshot_changes": ranges.SessionResult(
                None,
                {
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
                            session=key,
                        )
                    ),
                },
            )
        }

    yield from ranges.report(context, session)
