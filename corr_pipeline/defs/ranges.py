"""The sessions one step covers, and how each session is reported: a run of one partition (the
nightly run, a launch of one date) or of a range of consecutive sessions (a backfill run).

Every snapshot asset computes session by session, in date order, and describes each session
with a :class:`SessionResult` (the value the IO manager stores, its metadata, its check
results). :func:`report` turns them into Dagster's events:

- one session: ``MaterializeResult(value, metadata, check_results)``, as a run of one partition
  always did;
- a range: per session, its metadata attached to that partition's materialization
  (``context.add_asset_metadata(..., partition_key=...)``) and its checks as evaluations of that
  partition (``AssetCheckEvaluation(partition=...)``); then one ``MaterializeResult`` per asset
  whose value is ``{partition key: value}``, which Dagster records as one materialization per
  partition, each with its own metadata. The partitions view, the asset pages and the plots
  across partitions therefore read the same events whichever way a session was run.

A failed blocking check fails the step after its events (as for one session): the sessions
downstream of it in the same run are not published. A session that fails fails the step with a
``dg.Failure`` whose ``session`` metadata names it (:mod:`corr_pipeline.defs.backfill` goes on
with the other sessions in new runs); Dagster's range semantics allow no partial success of one
step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from corr_pipeline.defs.metadata_order import in_reading_order
from corr_pipeline.defs.retries import is_database_unavailable

#: An input of a snapshot asset: a ``MatrixBundle``, or ``{partition key: MatrixBundle}`` when
#: the step covers a range (use :func:`of_session`). ``Any`` for Dagster's type inference.
Bundles = Any

__all__ = [
    "Bundles",
    "SessionResult",
    "evaluation",
    "of_session",
    "report",
    "session_keys",
    "sessions_label",
]


@dataclass
class SessionResult:
    """What one asset produced for one session: ``value`` (stored by the asset's IO manager;
    None for an asset that stores nothing), ``metadata`` and ``checks``."""

    value: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    checks: Sequence[dg.AssetCheckResult] = ()


def session_keys(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> list[str]:
    """The partition keys (session dates ``YYYY-MM-DD``) the step covers, in date order."""
    if context.has_partition_key:
        return [context.partition_key]
    return sorted(context.partition_keys)


def of_session(value: Any, key: str) -> Any:
    """One session's input: the value itself in a run of one partition, ``value[key]`` when the
    IO manager loaded a range (``{partition key: value}``)."""
    if isinstance(value, dict):
        return value[key]
    return value


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


#: The lines :func:`log` gathers while a step over a range computes its sessions.
_step_lines: ContextVar[list[str] | None] = ContextVar("step_lines", default=None)


def log(context: dg.AssetExecutionContext, line: str) -> None:
    """Log ``line`` at info level; in a step over a range, the lines of all its sessions are
    gathered into one log message, a line per session, logged when the step's sessions are done
    or one fails (Dagster stores every log message as an event, about 19 ms each on a SQLite
    instance: seven fewer per session)."""
    lines = _step_lines.get()
    if lines is None:
        context.log.info(line)
    else:
        lines.append(line)


@contextmanager
def _gathered_log(context: dg.AssetExecutionContext) -> Iterator[None]:
    """Gather :func:`log`'s lines (above) while the block runs; log them as one message."""
    lines: list[str] = []
    token = _step_lines.set(lines)
    try:
        yield
    finally:
        _step_lines.reset(token)
        if lines:
            context.log.info("\n".join(lines))


def _compute_gathered(
    compute: Callable[[str], Mapping[str, SessionResult]], key: str
) -> Mapping[str, SessionResult]:
    """:func:`_compute_session`, its :func:`log` lines gathered into one line of the session."""
    lines = _step_lines.get()
    mark = len(lines) if lines is not None else 0
    try:
        return _compute_session(compute, key)
    finally:
        if lines is not None and len(lines) > mark:
            lines[mark:] = [f"{key}: " + "; ".join(lines[mark:])]


def _compute_session(
    compute: Callable[[str], Mapping[str, SessionResult]], key: str
) -> Mapping[str, SessionResult]:
    """``compute(key)``; a failure names its session (``session`` metadata, read by
    :mod:`corr_pipeline.defs.backfill`); "database unavailable" passes through for the retry
    policy."""
    try:
        return compute(key)
    except dg.Failure as exc:
        raise dg.Failure(
            description=exc.description,
            metadata={**exc.metadata, "session": key},
            allow_retries=exc.allow_retries,
        ) from exc
    except Exception as exc:
        if is_database_unavailable(exc):
            raise
        raise dg.Failure(
            description=f"session {key}: {type(exc).__name__}: {exc}",
            metadata={"session": key},
            allow_retries=False,
        ) from exc


def report(
    context: dg.AssetExecutionContext,
    compute: Callable[[str], Mapping[str, SessionResult]],
) -> Iterator[Any]:
    """Run ``compute(partition key) -> {asset name: SessionResult}`` for every session of the
    step in date order and yield Dagster's events for them (module docstring)."""
    keys = session_keys(context)
    if context.has_partition_key:
        for asset, result in _compute_session(compute, keys[0]).items():
            yield dg.MaterializeResult(
                asset_key=asset,
                value=result.value,
                metadata=in_reading_order(result.metadata),
                check_results=list(result.checks),
            )
        return
    assets_def = context.assets_def
    values: dict[str, dict[str, Any]] = {}
    checked: set[dg.AssetCheckKey] = set()
    with _gathered_log(context):
        for key in keys:
            for asset, result in _compute_gathered(compute, key).items():
                context.add_asset_metadata(
                    in_reading_order(result.metadata), asset_key=asset, partition_key=key
                )
                values.setdefault(asset, {})[key] = result.value
                for check in result.checks:
                    check_key = dg.AssetCheckKey(dg.AssetKey(asset), str(check.check_name))
                    spec = assets_def.get_spec_for_check_key(check_key)
                    checked.add(check_key)
                    yield evaluation(check, key, blocking=spec.blocking)
    for check_key in sorted(checked, key=str):
        yield dg.Output(None, output_name=assets_def.get_output_name_for_asset_check_key(check_key))
    for asset, by_key in values.items():
        stored = None if all(v is None for v in by_key.values()) else by_key
        yield dg.MaterializeResult(asset_key=asset, value=stored)
