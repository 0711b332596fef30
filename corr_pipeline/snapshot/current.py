"""Which sessions are *current*: published with the parameters asked for and their changes
recorded, so that a backfill or a retry need not compute them again (no Dagster here).

A session is current when its ``snapshots`` row records the same parameters
(:data:`RESULT_NEUTRAL` aside, which do not change a result) and its changes against the
session before it are recorded (SPEC §10), unless no session before it is published (then
there is nothing to compare). ``corr-pipeline backfill`` leaves current sessions out of its
runs; a run that is a retry or a re-execution of an earlier one skips them
(:mod:`corr_pipeline.defs.assets`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa

from corr_pipeline.db.published_reads import PublishedSession, first_published, published_sessions
from corr_pipeline.snapshot.params import DEFAULTS, PARAMETERS, SnapshotParameters

__all__ = ["RESULT_NEUTRAL", "WHEN_NOT_RECORDED", "current_sessions", "session_is_current"]

#: Recorded parameters that do not change a result (SPEC §9, declared ``neutral``): not
#: compared when deciding "current".
RESULT_NEUTRAL = frozenset(p.name for p in PARAMETERS if p.recorded and p.neutral)

#: Parameters added after sessions were first published, with the value a published session
#: that does not record them was computed with.
WHEN_NOT_RECORDED = {
    "market_modes_removed": 0,
    "max_zero_return_share": DEFAULTS.max_zero_return_share,
    "max_abs_return": DEFAULTS.max_abs_return,
    "drop_suspect": False,
}


def session_is_current(
    published: PublishedSession | None, params: SnapshotParameters, first_published: bool
) -> bool:
    """Whether a session needs no new run: published with ``params`` (but
    :data:`RESULT_NEUTRAL`) and its changes recorded, unless ``first_published`` (no published
    session before it)."""
    if published is None:
        return False
    wanted = {k: v for k, v in params.as_dict().items() if k not in RESULT_NEUTRAL}
    recorded = {**WHEN_NOT_RECORDED, **published.params}
    if any(recorded.get(k) != v for k, v in wanted.items()):
        return False
    return published.changes_recorded or first_published


def current_sessions(
    engine: sa.Engine, keys: Sequence[str], params: SnapshotParameters
) -> list[str]:
    """The partition keys (``YYYY-MM-DD``, ascending) among ``keys`` that are current."""
    if not keys:
        return []
    ordered = sorted(keys)
    published = published_sessions(engine, ordered[0], ordered[-1])
    earliest = first_published(engine)
    first = earliest.isoformat() if earliest else None
    return [
        key
        for key in ordered
        if session_is_current(published.get(dt.date.fromisoformat(key)), params, key == first)
    ]
