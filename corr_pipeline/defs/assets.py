"""The correlation snapshot as Dagster assets, one partition per session, computed by one op.

The op ``snapshot`` computes the assets of :mod:`corr_pipeline.defs.specs` session by session,
in date order: for each session its window, correlation and overlap, neighbors, clusters,
lead-lag pairs and publication one after the other (the session's chain,
:class:`corr_pipeline.snapshot.chain.SessionChain`, each step described to Dagster by
:mod:`corr_pipeline.defs.stages` and :mod:`corr_pipeline.defs.publication`), then its
changes; then it reports the session (:mod:`corr_pipeline.defs.ranges`) and goes on to the
next. A run covers one session (the nightly run) or a range of consecutive sessions (a
backfill: one query reads the union of their windows, the kernels are loaded once, and only
one session's matrices, with its predecessor's, exist at a time; those of sessions that
retention will not keep live in the store's memory area, never on disk). Each session publishes exactly what a run of it alone
publishes, in its own transaction; its changes compare it with the session published before
it.

Selecting some assets (the UI's Materialize of one asset) computes only their steps; their
inputs are then read from the matrix store, as the IO manager reads them for any other asset.
A retry of the op (the database was unreachable) or a re-execution from failure skips the
sessions that are already current (:mod:`corr_pipeline.snapshot.current`): published, with
these parameters, their changes recorded, and reported by the earlier attempt.
"""

from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from dataclasses import replace
from typing import Any

import dagster as dg

from corr_pipeline.db.price_source import PriceSourceError
from corr_pipeline.db.published_reads import published_dates
from corr_pipeline.defs import metadata, ranges
from corr_pipeline.defs.dagster_private import RESUME_RETRY_TAG
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.literal_config import literal_fields
from corr_pipeline.defs.partitions import snapshot_date
from corr_pipeline.defs.publication import (
    SnapshotConfig,
    apply_retention,
    changes_results,
    publication_results,
    refresh_following,
)
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource, SnapshotParams
from corr_pipeline.defs.retries import (
    DATABASE_RETRY_POLICY,
    interrupt_not_retried,
    is_database_unavailable,
    one_line_failure,
    retry_only_if_database_unavailable,
)
from corr_pipeline.defs.specs import (
    CORRELATION_ASSETS,
    is_blocking,
    snapshot_check_specs,
    snapshot_specs,
)
from corr_pipeline.defs.stages import (
    DESCRIBE,
    NO_PRICES_TAG,
    Session,
    SnapshotStep,
    session_chain,
)
from corr_pipeline.defs.step_options import SNAPSHOT_STEP
from corr_pipeline.snapshot import retention, steps
from corr_pipeline.snapshot.chain import STEPS
from corr_pipeline.snapshot.current import current_sessions
from corr_pipeline.snapshot.measure import (
    fix_mmap_threshold,
    measure_stage,
    release_freed_memory,
)
from corr_pipeline.snapshot.scheduler import SchedulerError
from corr_pipeline.snapshot.session_outputs import PublicationOutput
from corr_pipeline.store import memory

__all__ = ["NO_PRICES_TAG", "snapshot", "snapshot_assets"]

#: What each output of a session's chain reports (:mod:`corr_pipeline.defs.stages`).
RESULTS: dict[type, Callable[..., dict[str, ranges.SessionResult]]] = {
    **DESCRIBE,
    PublicationOutput: publication_results,
}


@dg.multi_asset(
    name="snapshot",
    specs=snapshot_specs(),
    check_specs=snapshot_check_specs(),
    can_subset=True,
    retry_policy=DATABASE_RETRY_POLICY,
    config_schema=literal_fields(SnapshotConfig),
    description="The correlation snapshot of each session of the run, in date order: window, "
    "correlation and overlap, neighbors, clusters, lead-lag pairs, publication and changes, "
    "each session reported as soon as it is done.",
    **SNAPSHOT_STEP,
)
def snapshot(
    context: dg.AssetExecutionContext,
    snapshot_params: SnapshotParams,
    postgres: PostgresResource,
    price_source: PriceSourceResource,
    matrix_store: MatrixStoreResource,
):
    with one_line_failure(SchedulerError):  # refused before anything connects
        params = snapshot_params.to_parameters()
    with one_line_failure(PriceSourceError):
        source = price_source.source()
    selected = {key.to_user_string() for key in context.selected_asset_keys}
    if len(selected & set(CORRELATION_ASSETS)) == 1:
        raise dg.Failure(
            description="correlation_matrix and overlap_matrix are computed together: select "
            "both or neither",
            allow_retries=False,
        )
    keys = ranges.session_keys(context)
    label = ranges.sessions_label(keys)
    _log_request(context, label, params, postgres, source, "returns_matrix" in selected)
    with interrupt_not_retried(f"snapshot {label}"):  # the run was asked to terminate
        with retry_only_if_database_unavailable(f"snapshot {label}"):
            engine = postgres.get_engine()  # a schema at another revision fails here, not retried
            todo = _sessions_to_compute(context, engine, keys, params)
        fix_mmap_threshold()  # the sessions' temporaries leave no high-water mark in the heap
        with steps.stripe_runner(params) as runner:
            step = SnapshotStep(
                context=context,
                params=params,
                keys=keys,
                engine=engine,
                database=postgres.describe(),
                source=source,
                matrix_store=matrix_store,
                top_m=SnapshotConfig(**context.op_execution_context.op_config).top_m,
                runner=runner,
                dashboard=metadata.dask_cluster(context, runner),
                last=todo[-1] if todo else "",
            )
            if "correlation_matrix" in selected:
                step.in_memory = _sessions_in_memory(step, todo)
            failed: dict[str, str] = {}
            yield from _sessions(step, todo, failed)
    if failed:
        raise ranges.failure(failed, len(todo))
    yield from _check_outputs(context)


def _check_outputs(context: dg.AssetExecutionContext) -> Iterator[dg.Output]:
    """The op's output of each selected check, empty. The evaluations themselves are the
    sessions' events (:func:`ranges.session_events`: one per session, with its partition), which
    Dagster does not count as the check's output; without these outputs it logs that the op
    "did not yield or return expected outputs" for every check. A check a session does not
    evaluate (``injected_pairs_found`` without synthetic ground truth) has its output all the
    same: nothing is missing."""
    for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
        name = context.assets_def.get_output_name_for_asset_check_key(key)
        yield dg.Output(None, output_name=name)


def _sessions(step: SnapshotStep, todo: list[str], failed: dict[str, str]) -> Iterator[Any]:
    """Compute and report each session of ``todo`` in turn; ``failed`` gets the reasons."""
    context, keys = step.context, step.keys
    selected = {key.to_user_string() for key in context.selected_asset_keys}
    with one_line_failure(PriceSourceError):
        for key in todo:
            session = Session(key)
            with ranges.gathered_lines(context, key, gather=len(keys) > 1):
                reason = _compute(step, session)
                if reason is None and "snapshot_publication" in selected:
                    _with_retention(step, session, {key} | {k for k in keys if k > key})
            yield from ranges.session_events(
                context,
                key,
                session.results,
                selected_checks=set(context.selected_asset_check_keys),
                blocking={name: is_blocking(name) for name in _check_names(session)},
            )
            if reason is not None:
                failed[key] = reason
                context.log.error(f"{key} failed: {reason}")
            del session
            # a pooled connection keeps libpq's input buffer at the largest row it received
            # (the published rows' arrays: ~20 MiB at N = 24,000) until it closes
            step.engine.dispose()
            release_freed_memory()
    if todo and todo[-1] in failed and "snapshot_changes" in selected:
        _refresh_after_failed_last(step, todo[-1])


def _refresh_after_failed_last(step: SnapshotStep, key: str) -> None:
    """The run's last session failed before its changes: the next published session's changes
    are computed again all the same (:func:`corr_pipeline.defs.publication.refresh_following`),
    against the newest session published before it. A failure is logged, not raised (the
    sessions are reported; ``query changes`` says the changes are stale)."""
    try:
        refresh_following(step, snapshot_date(key))
    except Exception as exc:
        if is_database_unavailable(exc):
            raise
        step.context.log.error(
            f"the changes of the session after {key} were not computed again: "
            f"{type(exc).__name__}: {exc}"
        )


def _check_names(session: Session) -> set[str]:
    return {str(c.check_name) for r in session.results.values() for c in r.checks}


def _log_request(context, label, params, postgres, source, reads_prices: bool) -> None:
    """The run's first lines: who asked (the prices sensor's tags) and what is read."""
    if not reads_prices:
        return
    tags = context.run.tags
    if "corr_pipeline/completeness" in tags:  # requested by prices_ready_sensor
        context.log.info(
            f"requested by the prices sensor ({tags.get('corr_pipeline/trigger')}): prices "
            f"of {label} {float(tags['corr_pipeline/completeness']):.1%} complete "
            f"({tags.get('corr_pipeline/symbols')} of the previous trade date's symbols)"
            + (", a re-run after a correction" if tags.get("corr_pipeline/rerun") else "")
        )
    context.log.info(
        f"loading the windows of {label}: lookback_days={params.lookback_days}, "
        f"min_history_days={params.min_history_days}, database {postgres.describe()}, price "
        f"source {source}"
    )


def _resumes(context: dg.AssetExecutionContext) -> bool:
    """Whether the run resumes an earlier attempt: a retry of the op, or a re-execution of a run
    that failed or was canceled (from failure, or whole)."""
    if context.retry_number > 0 or context.run.tags.get(RESUME_RETRY_TAG) == "true":
        return True
    parent_id = context.run.parent_run_id
    parent = context.instance.get_run_by_id(parent_id) if parent_id else None
    return parent is not None and parent.status in (
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.CANCELED,
    )


def _sessions_to_compute(context, engine, keys: list[str], params) -> list[str]:
    """``keys``, but without the sessions already current when the run resumes an earlier
    attempt (:func:`_resumes`): that attempt published and reported them."""
    if not _resumes(context):
        return keys
    done = set(current_sessions(engine, keys, params))
    if done:
        context.log.info(
            f"{ranges.sessions_label(sorted(done))} already current (published by an earlier "
            "attempt): not computed again"
        )
    return [key for key in keys if key not in done]


def _sessions_in_memory(step: SnapshotStep, keys: list[str]) -> set[str]:
    """The sessions whose matrices go to the store's memory area: those retention will not
    keep (:func:`corr_pipeline.snapshot.retention.not_kept`). When there are any, retention
    runs first, so that the memory of earlier runs' sessions is free before this run's fill
    it; it leaves the run's sessions and the published session before each (their changes read
    its matrices) alone."""
    published = published_dates(step.engine)
    days = {snapshot_date(key): key for key in keys}
    keep = step.matrix_store.keep()
    in_memory = {days[day] for day in retention.not_kept(days, published, keep)}
    if in_memory:
        ranges.log(
            step.context,
            f"matrices of {ranges.sessions_label(sorted(in_memory))} in memory: retention will "
            f"not keep them (the newest {keep} sessions keep theirs)",
        )
        predecessors = {day.isoformat() for day in retention.published_before(days, published)}
        apply_retention(step.context, step, min(keys), set(keys) | predecessors)
    return in_memory


def _compute(step: SnapshotStep, session: Session) -> str | None:
    """Run the selected steps of ``session``'s chain, then its changes (module docstring); the
    reason it failed, or None. "Database unreachable" propagates (the op's retry policy)."""
    chain, store = session_chain(step, session)
    wanted = [name for name in STEPS if step.selected(name)]
    try:
        with closing(chain.run(wanted)) as outputs:
            while True:
                with measure_stage() as stats:
                    output = next(outputs, None)
                if output is None:
                    break
                produced = RESULTS[type(output)](step, session, output, stats)
                reason = _report(session, produced, store.facts)
                if reason is not None:
                    return reason
        if step.selected("snapshot_changes"):
            return _report(session, changes_results(step, session), {})
    except steps.InconsistentInputsError as exc:
        return str(exc)
    except dg.Failure as exc:
        return str(exc.description)
    except PriceSourceError:
        raise  # the source, not the session: the op fails in its one line
    except Exception as exc:
        if is_database_unavailable(exc):
            raise
        failing = chain.computing or "snapshot_changes"  # the chain's step, else the changes
        return f"{failing} {session.key} failed: {type(exc).__name__}: {exc}"
    return None


def _report(
    session: Session,
    produced: Mapping[str, ranges.SessionResult],
    facts: Mapping[str, Mapping[str, Any]],
) -> str | None:
    """Add ``produced`` to the session's results, each stored bundle's ``facts`` appended to its
    metadata; the reason the session stops (a failed blocking check), or None."""
    for asset, result in produced.items():
        stored = facts.get(asset, {})
        session.results[asset] = replace(result, metadata={**result.metadata, **stored})
    for result in produced.values():
        for check in result.checks:
            severe = check.severity == dg.AssetCheckSeverity.ERROR
            if not check.passed and severe and is_blocking(str(check.check_name)):
                return f"blocking asset check failed: {check.check_name} of {session.key}"
    return None


def _with_retention(step: SnapshotStep, session: Session, still_needed: set[str]) -> None:
    """Apply retention after the session when it is due: after the run's last session, and
    after every session when :func:`_retain_each_session`; after the changes, which read the
    matrices of the session before. What it did goes into the publication's metadata."""
    last = session.key == step.keys[-1]
    if not (last or _retain_each_session(step, session)):
        return
    step.matrix_store.release_partitions_but(session.key)  # the earlier sessions are done
    facts: dict[str, Any] = apply_retention(step.context, step, session.key, still_needed)
    result = session.results["snapshot_publication"]
    session.results["snapshot_publication"] = replace(result, metadata={**result.metadata, **facts})


def _retain_each_session(step: SnapshotStep, session: Session) -> bool:
    """:func:`corr_pipeline.snapshot.retention.retain_after_each_session` of this range."""
    corr = session.bundles.get("correlation_matrix")
    overlap = session.bundles.get("overlap_matrix")
    if corr is None or overlap is None:
        return False
    matrices = corr["corr"].nbytes + overlap["overlap"].nbytes
    return retention.retain_after_each_session(
        len(step.in_memory), matrices, memory.area_budget_bytes()
    )


snapshot_assets = [snapshot]
