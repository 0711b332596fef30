"""The end of a session of the snapshot op: what its publication (SPEC §7, published by
:class:`corr_pipeline.snapshot.chain.SessionChain`) reports, then ``snapshot_changes`` (SPEC §10,
against the previous published session), and the store's retention (SPEC §8).

Each session is published in its own transaction, then compared with the session published
before it, exactly as a run of that session alone would: in a run over a range the session
before it is the range's previous session, published a moment earlier. A publication makes
the changes of the next published session stale (a session backfilled below it, or published
again); the run's last session computes those again once, after the range
(:func:`refresh_following`), and reports them as that session's materialization: the
sessions before it only make them stale again in turn.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import dagster as dg
from pydantic import ConfigDict, Field

from corr_pipeline.db.published_reads import (
    changes_to_refresh,
    published_matrix_versions,
    recorded_change_dates,
)
from corr_pipeline.defs import metadata, pictures, ranges
from corr_pipeline.defs.checks import check_result
from corr_pipeline.defs.metadata_order import in_reading_order
from corr_pipeline.defs.partitions import snapshot_calendar
from corr_pipeline.defs.runs import partitions_in_flight
from corr_pipeline.defs.stages import Session, SnapshotStep, logged, verified
from corr_pipeline.snapshot import changes, display, retention, session_gap
from corr_pipeline.snapshot.measure import StageStats, measure_stage
from corr_pipeline.snapshot.session_outputs import PublicationOutput

__all__ = [
    "SnapshotConfig",
    "apply_retention",
    "changes_results",
    "publication_results",
    "refresh_following",
]


class SnapshotConfig(dg.Config):
    """Run configuration of the snapshot op."""

    model_config = ConfigDict(hide_input_in_errors=True)  # pydantic's errors leave the input out

    top_m: int = Field(
        default=100, ge=0, description="Pairs kept by |corr today - corr previous| (SPEC §10.2)."
    )


# --------------------------------------------------------------------------------------------
# snapshot_publication (SPEC §7)
# --------------------------------------------------------------------------------------------


def publication_results(
    step: SnapshotStep, session: Session, out: PublicationOutput, stats: StageStats
) -> dict[str, ranges.SessionResult]:
    """What the session's publication reports: its rows per table, how it replaced an earlier
    one, the store versions it pins, and the check that the rows read back are the results'."""
    day, results, report = session.day, out.results, out.report
    logged(step, f"published snapshot {day}", stats)
    counts = out.counts if out.counts is not None else {}
    return {
        "snapshot_publication": ranges.SessionResult(
            None,
            {
                "snapshot_date": dg.MetadataValue.text(day.isoformat()),
                "as_of_trade_date": dg.MetadataValue.text(str(results.as_of_trade_date)),
                **{f"{k}_rows": dg.MetadataValue.int(v) for k, v in counts.items()},
                "database": dg.MetadataValue.text(step.database),
                "replaced_previous": dg.MetadataValue.bool(report.replaced_previous),
                "lock_wait_seconds": metadata.number(report.lock_wait_seconds, display.seconds),
                **{
                    f"publish_{k}": metadata.number(v, display.seconds)
                    for k, v in report.timings.items()
                },
                "matrix_versions": dg.MetadataValue.json(out.versions),
                **metadata.stage(stats),
            },
            [check_result(verified(out.verdict), "published_rows_match", "snapshot_publication")],
        )
    }


def apply_retention(
    context: dg.AssetExecutionContext,
    step: SnapshotStep,
    writing: str,
    still_needed: set[str],
) -> dict[str, dg.MetadataValue]:
    """Retention after the committed publication of session ``writing``
    (:mod:`corr_pipeline.snapshot.retention`), leaving alone the partitions of the other runs in
    flight and ``still_needed`` (sessions whose matrices this run still reads). Never fails the
    publication, which is committed; a problem is logged and shown in the metadata (the next
    publication, or ``corr-pipeline store prune``, applies it again)."""
    matrix_store = step.matrix_store
    try:
        keep = matrix_store.keep()
        in_flight = partitions_in_flight(context.instance, exclude_run_id=context.run.run_id)
        report = retention.apply_retention(
            matrix_store.store,
            lambda: published_matrix_versions(step.engine),
            keep,
            writing=writing,
            in_flight=in_flight | (still_needed - {writing}),
            read_changed=lambda: recorded_change_dates(step.engine),
        )
    except Exception as exc:  # noqa: BLE001 - the publication itself succeeded
        context.log.warning(
            f"matrix-store retention skipped: {type(exc).__name__}: {exc} (the publication is "
            "committed; run `corr-pipeline store prune` or let the next publication apply it)"
        )
        return {"retention_error": dg.MetadataValue.text(f"{type(exc).__name__}: {exc}")}
    for line in report.lines():
        ranges.log(context, line)
    return {
        "retention_keep": dg.MetadataValue.int(keep),
        "retention_removed": dg.MetadataValue.json(report.removed_partitions),
        "retention_freed_bytes": dg.MetadataValue.int(report.freed_bytes),
        "retention_left_alone": dg.MetadataValue.json(sorted(report.busy)),
    }


# --------------------------------------------------------------------------------------------
# snapshot_changes (SPEC §10)
# --------------------------------------------------------------------------------------------


def _compute_changes(step: SnapshotStep, day):
    """:func:`corr_pipeline.snapshot.changes.compute_and_publish` of ``day`` with the run's
    configuration, the gap counted in the partitions' calendar, logging to the run: (results,
    rows, report), or None without a previous session."""
    return changes.compute_and_publish(
        step.engine,
        step.matrix_store.store,
        day,
        top_m=step.top_m,
        working_memory_mb=step.params.working_memory_mb,
        calendar=snapshot_calendar,
        log=partial(ranges.log, step.context),
    )


def refresh_following(step: SnapshotStep, day) -> dict[str, Any]:
    """Compute again the changes of the next published session after ``day`` when they are
    stale or missing (:func:`corr_pipeline.db.published_reads.changes_to_refresh`): a
    re-published ``day``, a range backfilled below a published session, or runs of a parallel
    backfill that computed the next session's changes before ``day`` was published. Called once
    per run, after its last session (``day``, published or failed): the changes then compare
    the next session with the newest published before it. Returns the metadata saying which
    date (or none)."""
    following = changes_to_refresh(step.engine, day)
    if following is None:
        return {"refreshed_following": dg.MetadataValue.text("none")}
    with measure_stage() as stats:
        refreshed = _compute_changes(step, following)
    if refreshed is None:  # cannot happen: day is published before following
        return {"refreshed_following": dg.MetadataValue.text("none")}
    results, rows, report = refreshed
    step.context.log.info(
        f"the changes of {following} were stale or missing: recomputed against the "
        f"{session_gap.compared_with(results.previous_date, results.sessions_between)}"
    )
    # the following session's partition shows what its rows now say (the UI and the database
    # agree): a materialization of that partition, logged by this run
    step.context.log_event(
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


def _nothing_recorded(step: SnapshotStep, note: str, refreshed: dict) -> ranges.SessionResult:
    """The result of a session whose changes compare nothing, saying why."""
    ranges.log(step.context, f"{note}: no changes recorded")
    return ranges.SessionResult(
        None,
        {
            "previous_date": dg.MetadataValue.text("none"),
            "recorded": dg.MetadataValue.bool(False),
            "note": dg.MetadataValue.text(note),
            **refreshed,
        },
    )


def _refresh_after(step: SnapshotStep, session: Session) -> dict[str, Any]:
    """:func:`refresh_following` after the run's last session; nothing before it (the next
    session of the range, published next, makes the following session's changes stale again)."""
    if session.key != step.last:
        return {}
    return refresh_following(step, session.day)


def changes_results(step: SnapshotStep, session: Session) -> dict[str, ranges.SessionResult]:
    day, key = session.day, session.key
    with measure_stage() as stats:
        try:
            published = _compute_changes(step, day)
        except LookupError as exc:
            # an asset backfill of the sessions before ``day`` targets this partition too
            # (its changes depend on the previous session's publication): its own run
            # computes them once ``day`` is published
            return {"snapshot_changes": _nothing_recorded(step, f"{exc}: nothing to compare", {})}
        if published is None:
            note = f"no snapshot before {day} is published: nothing to compare"
            refreshed = _refresh_after(step, session)
            return {"snapshot_changes": _nothing_recorded(step, note, refreshed)}
        results, rows, report = published
        refreshed = _refresh_after(step, session)
    gap = session_gap.title_note(results.sessions_between)
    ranges.log(
        step.context, metadata.stage_line(f"changes {day} vs {results.previous_date}{gap}", stats)
    )
    for part, reason in results.skipped.items():
        step.context.log.warning(f"{part} skipped: {reason}")
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
                **(
                    {}
                    if corr is None
                    else metadata.pictures(
                        step.context,
                        "change histogram",
                        lambda: pictures.change_histogram_metadata(
                            corr.fine_change_counts,
                            corr.fine_change_edges,
                            mean_abs_change=corr.means["abs_change"],
                            title=f"Correlation changes {results.previous_date} → {day}{gap}",
                        ),
                        session=key,
                    )
                ),
            },
        )
    }
