"""The suspect prices of a published snapshot (SPEC §2), read from ``suspect_prices``.

``quality(engine, date)``: the screen the snapshot ran (its ``max_zero_return_share``,
``max_abs_return`` and ``drop_suspect``, from ``snapshots.params``) and every suspect symbol
with its zero-return share, its largest |log return|, the reason and whether it was dropped, in
symbol order. ``date=None`` (or ``"latest"``) is the latest published snapshot; one database
snapshot per answer (:func:`~corr_pipeline.query.published.consistent_read`). A snapshot
published before the screen was recorded (its ``params`` lack the thresholds) raises
:class:`QualityNotRecordedError`: "no suspect" is never said of prices nobody screened.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from corr_pipeline.db.schema import suspect_prices
from corr_pipeline.query.answers import QualityResult
from corr_pipeline.query.errors import QueryError
from corr_pipeline.query.published import consistent_read, resolve_snapshot

__all__ = ["QualityNotRecordedError", "quality"]


class QualityNotRecordedError(QueryError):
    """The snapshot was published before its suspect prices were recorded."""

    kind = "quality_not_recorded"


def quality(engine: sa.Engine, date: dt.date | str | None = None) -> QualityResult:
    """The suspect prices of the snapshot of ``date`` (None: the latest)."""
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        params = snap.params
        if "max_zero_return_share" not in params or "max_abs_return" not in params:
            raise QualityNotRecordedError(
                f"snapshot {snap.snapshot_date} was published before its suspect prices were "
                "recorded: materialize that partition again to record them"
            )
        t = suspect_prices
        rows = conn.execute(
            sa.select(
                t.c.symbol, t.c.zero_return_share, t.c.max_abs_return, t.c.reason, t.c.dropped
            )
            .where(t.c.snapshot_date == snap.snapshot_date)
            .order_by(t.c.symbol)
        ).mappings()
        suspects = [dict(row) for row in rows]
    return QualityResult(
        snapshot=snap,
        max_zero_return_share=float(params["max_zero_return_share"]),
        max_abs_return=float(params["max_abs_return"]),
        drop_suspect=bool(params.get("drop_suspect", False)),
        suspects=suspects,
    )
