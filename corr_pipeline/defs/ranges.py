"""How the snapshot op reports each session: the sessions of a run (one partition, the nightly
run; or a range of consecutive sessions, a backfill run) in date order, each as if alone.

A session's assets are computed one after the other (its chain, :mod:`corr_pipeline.defs.stages`),
each described by a :class:`SessionResult` (its value, its metadata, its check results). When the
session is done, :func:`session_events` turns them into that partition's events: for each asset
an ``AssetMaterialization`` of the partition with its own metadata, then the evaluations of its
checks for the partition. So the partitions view, the asset pages and the plots across
partitions read the same events whichever way a session was run, a session appears in the UI
as soon as it is published, and a run killed part-way leaves exactly its finished sessions
materialized. A session that fails (an error, a failed blocking check) reports what it
finished and stops; the others go on, and the op fails at the end naming every failed session
(:func:`failure`), which Dagster then marks failed and nothing else.

While a session of a range is computed, the lines its stages log (:func:`log`) are gathered
into one message for the session (Dagster stores every log message as an event).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from corr_pipeline.defs.dagster_private import DagsterEventBatchMetadata, generate_event_batch_id
from corr_pipeline.defs.metadata_order import in_reading_order

__all__ = [
    "FAILED_SESSIONS",
    "SessionResult",
    "evaluation",
    "failure",
    "gathered_lines",
    "log",
    "session_events",
    "session_keys",
    "sessions_label",
]

#: The metadata key of the op's failure: ``{session: reason}`` of every failed session.
FAILED_SESSIONS = "failed_sessions"


@dataclass
class SessionResult:
    """What one asset produced for one session: ``value`` (a matrix-store bundle, or None for
    an asset whose rows are in PostgreSQL), ``metadata`` and ``checks``."""

    value: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    checks: Sequence[dg.AssetCheckResult] = ()


def session_keys(context: dg.AssetExecutionContext) -> list[str]:
    """The partition keys (session dates ``YYYY-MM-DD``) the step covers, in date order."""
    if context.has_partition_key:
        return [context.partition_key]
    return sorted(context.partition_keys)


def sessions_label(keys: Sequence[str]) -> str:
    """``2024-01-02`` for one session, ``2024-01-02..2024-03-28 (60 sessions)`` for a range."""
    if len(keys) == 1:
        return keys[0]
    return f"{keys[0]}..{keys[-1]} ({len(keys)} sessions)"


def evaluation(result: dg.AssetCheckResult, partition: str, blocking: bool) -> Any:
    """``result`` as the evaluation of ``partition`` (what Dagster derives from an
    ``AssetCheckResult`` in a run of one partition)."""
    assert result.asset_key is not None  # check_result always names its asset
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey.from_coercible(result.asset_key),
        check_name=str(result.check_name),
        passed=bool(result.passed),
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
        blocking=blocking,
        partition=partition,
    )


def session_events(
    context: dg.AssetExecutionContext,
    key: str,
    results: Mapping[str, SessionResult],
    *,
    selected_checks: set[dg.AssetCheckKey],
    blocking: Mapping[str, bool],
) -> Iterator[dg.DagsterEvent]:
    """The events of session ``key`` (module docstring): per asset its materialization, then
    the evaluations of its selected checks; logged as one batch (the instance stores them
    together, as it stores the materializations of a range's output) and yielded, so the run's
    events list them."""
    step_context = context.get_step_execution_context()
    events: list[tuple[dg.DagsterEventType, Any, str | None]] = []
    for asset, result in results.items():
        metadata = in_reading_order(result.metadata)
        materialization = dg.AssetMaterialization(asset_key=asset, partition=key, metadata=metadata)
        events.append((dg.DagsterEventType.ASSET_MATERIALIZATION, materialization, None))
        for check in result.checks:
            check_key = dg.AssetCheckKey(dg.AssetKey(asset), str(check.check_name))
            if check_key in selected_checks:
                checked = evaluation(check, key, blocking=blocking[check_key.name])
                said = "passed" if checked.passed else "did not pass"
                events.append(
                    (
                        dg.DagsterEventType.ASSET_CHECK_EVALUATION,
                        checked,
                        f"Asset check '{checked.check_name}' on '{asset}' {said}.",
                    )
                )
    batch = generate_event_batch_id()
    for i, (kind, data, message) in enumerate(events):
        end = DagsterEventBatchMetadata(batch, i == len(events) - 1)
        if kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            yield dg.DagsterEvent.asset_materialization(step_context, data, end)
        else:
            yield dg.DagsterEvent.from_step(kind, step_context, data, message, end)


def failure(failed: Mapping[str, str], total: int) -> dg.Failure:
    """The op's failure once its sessions are done: the reason of a run of one session (one
    line), else which sessions failed and why (a line each)."""
    lines = [f"{key}: {reason}" for key, reason in sorted(failed.items())]
    if total == 1:
        description = next(iter(failed.values()))
    else:
        description = f"{len(failed)} of {total} sessions failed:\n" + "\n".join(lines)
    return dg.Failure(
        description=description,
        metadata={FAILED_SESSIONS: dg.MetadataValue.json(dict(sorted(failed.items())))},
        allow_retries=False,
    )


#: The lines :func:`log` gathers while a session of a range is computed.
_session_lines: ContextVar[list[str] | None] = ContextVar("session_lines", default=None)


def log(context: dg.AssetExecutionContext, line: str) -> None:
    """Log ``line`` at info level; while a session of a range is computed
    (:func:`gathered_lines`), gathered into the session's one message."""
    lines = _session_lines.get()
    if lines is None:
        context.log.info(line)
    else:
        lines.append(line)


@contextmanager
def gathered_lines(context: dg.AssetExecutionContext, key: str, gather: bool) -> Iterator[None]:
    """While the block runs, :func:`log` gathers its lines (when ``gather``); they are logged as
    one message ``key: line; line; ...`` when it ends, however it ends."""
    if not gather:
        yield
        return
    lines: list[str] = []
    token = _session_lines.set(lines)
    try:
        yield
    finally:
        _session_lines.reset(token)
        if lines:
            context.log.info(f"{key}: " + "; ".join(lines))
