"""Publish the changes of one snapshot date (SPEC §10), atomically replacing an earlier version.

:func:`publish_changes` runs ONE transaction, like :func:`corr_pipeline.db.publish.publish_snapshot`
and under the same per-date advisory lock (``pg_advisory_xact_lock(hashtext('corr_pipeline.snapshot'),
<days since 1970-01-01>)``), so a publication of the snapshot and one of its changes never
interleave, and two publishers of the same date's changes end with one whole version:

1. take the lock, then check that the change set is still current (:class:`StaleChangesError`
   otherwise, nothing written): a run of a parallel backfill may have computed it against an
   older session while the previous session was being published, and the run publishing that
   session may already have recorded the current changes (SPEC §10.7);
2. ``DELETE`` the date's rows from the four child tables, then its ``change_summaries`` row;
3. ``INSERT`` the ``change_summaries`` row (jsonb: quantiles, histogram, skipped parts, params);
4. one ``COPY ... FROM STDIN (FORMAT BINARY)`` per child table (psycopg's row writer with the
   column types set: float32 values go into ``real`` columns exactly; NULL for ``None``; NaN is
   refused before the transaction);
5. ``COMMIT``: readers see the previous version until then, the new one after, never a mix.

Everything is validated before the transaction starts (:class:`PublishError`, nothing written).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import sqlalchemy as sa

from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.publish import (
    PublishError,
    delete_change_rows,
    read_snapshot_counts,
)
from corr_pipeline.db.published_reads import change_staleness
from corr_pipeline.db.replace import replace_date_rows
from corr_pipeline.db.schema import CHANGE_TABLES, DRIFT_COLUMNS

__all__ = [
    "CHANGE_COLUMNS",
    "ChangesPublication",
    "ChangesReport",
    "StaleChangesError",
    "publish_changes",
    "read_change_counts",
]

#: The columns of each child table, in the order of the row tuples of :class:`ChangesPublication`.
CHANGE_COLUMNS: dict[str, tuple[str, ...]] = {
    "change_pairs": (
        "rank",
        "symbol_a",
        "symbol_b",
        "corr",
        "previous_corr",
        "overlap",
        "previous_overlap",
        "change",
    ),
    "change_symbols": (
        "symbol",
        "status",
        "cluster_id",
        "previous_cluster_id",
        "moved",
        "n_neighbors",
        "new_neighbors",
    ),
    "change_clusters": (
        "line",
        "cluster_id",
        "previous_cluster_id",
        "size",
        "previous_size",
        "shared",
        "status",
        "split",
        "merged",
    ),
    "change_lead_lag": (
        "leader",
        "lagger",
        "change",
        "lag",
        "previous_lag",
        "improvement",
        "previous_improvement",
    ),
}

#: PostgreSQL types of the columns of :data:`CHANGE_COLUMNS`, for the binary COPY.
_COPY_TYPES: dict[str, tuple[str, ...]] = {
    "change_pairs": ("int2", "text", "text", "float4", "float4", "int4", "int4", "float8"),
    "change_symbols": ("text", "text", "int4", "int4", "bool", "int4", "int4"),
    "change_clusters": ("int4", "int4", "int4", "int4", "int4", "int4", "text", "bool", "bool"),
    "change_lead_lag": ("text", "text", "text", "int2", "int2", "float4", "float4"),
}

#: The ``change_summaries`` columns a publication sets (``created_at`` is ``now()``).
SUMMARY_COLUMNS = (
    "previous_date",
    "n_symbols",
    "n_previous_symbols",
    "n_common",
    "n_entered",
    "n_left",
    "n_pairs",
    *DRIFT_COLUMNS,
    "quantiles",
    "change_histogram",
    "skipped",
    "params",
    "snapshot_published_at",
    "previous_published_at",
    "sessions_between",
)
_JSON_COLUMNS = ("quantiles", "change_histogram", "skipped", "params")


class StaleChangesError(PublishError):
    """The change set no longer describes the published snapshots (another previous session,
    or either date re-published since it was computed): compute it again."""


@dataclass(frozen=True)
class ChangesPublication:
    """What one publication of changes writes (SPEC §10): ``summary`` maps every
    :data:`SUMMARY_COLUMNS` name to its value (None = NULL; the jsonb ones as plain JSON values),
    ``rows`` every child table to its row tuples in :data:`CHANGE_COLUMNS` order."""

    snapshot_date: dt.date
    summary: Mapping[str, Any]
    rows: Mapping[str, Sequence[tuple[Any, ...]]]


@dataclass(frozen=True)
class ChangesReport:
    """Rows written per table, seconds (waiting for the lock included), whether an earlier
    version of the date's changes was replaced."""

    snapshot_date: dt.date
    rows: dict[str, int]
    seconds: float
    lock_wait_seconds: float
    replaced_previous: bool
    timings: dict[str, float] = field(default_factory=dict)


def _finite_or_none(value: Any, where: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise PublishError(f"{where}: {value} cannot be published (use None for NULL)")
    return value


def _validate(changes: ChangesPublication) -> tuple[dt.date, list[Any]]:
    d = as_iso_date(changes.snapshot_date, "snapshot_date", PublishError)
    missing = [c for c in SUMMARY_COLUMNS if c not in changes.summary]
    if missing:
        raise PublishError(f"the change summary lacks {missing}")
    if set(changes.rows) != set(CHANGE_COLUMNS):
        raise PublishError(f"rows must be given for exactly {sorted(CHANGE_COLUMNS)}")
    previous = as_iso_date(changes.summary["previous_date"], "previous_date", PublishError)
    if not previous < d:
        raise PublishError(f"previous_date {previous} must be before the snapshot date {d}")
    between = changes.summary["sessions_between"]
    if between is not None and (
        isinstance(between, bool) or not isinstance(between, int) or between < 0
    ):
        raise PublishError(
            f"change_summaries.sessions_between: {between!r} is not a count of sessions "
            "(an int >= 0, or None when unknown)"
        )
    values: list[Any] = []
    for column in SUMMARY_COLUMNS:
        value = changes.summary[column]
        if column in _JSON_COLUMNS:
            try:
                value = None if value is None else json.dumps(value, allow_nan=False)
            except ValueError as exc:
                raise PublishError(f"change_summaries.{column}: {exc}") from None
        values.append(_finite_or_none(value, f"change_summaries.{column}"))
    values[0] = previous
    for table, rows in changes.rows.items():
        width = len(CHANGE_COLUMNS[table])
        # only a float can be non-finite, and only the float columns take one
        floats = [
            (i, f"{table}.{CHANGE_COLUMNS[table][i]}")
            for i, kind in enumerate(_COPY_TYPES[table])
            if kind.startswith("float")
        ]
        for row in rows:
            if len(row) != width:
                raise PublishError(f"{table}: a row of {len(row)} values for {width} columns")
            for i, where in floats:
                _finite_or_none(row[i], where)
    return d, values


def publish_changes(engine: sa.Engine, changes: ChangesPublication) -> ChangesReport:
    """Replace the changes of ``changes.snapshot_date`` with ``changes``, in one transaction
    under the date's advisory lock (module docstring)."""
    t_start = time.perf_counter()
    d, summary = _validate(changes)
    timings = {"prepare_s": time.perf_counter() - t_start}
    columns = ", ".join(("snapshot_date", *SUMMARY_COLUMNS, "created_at"))
    placeholders = ", ".join(
        "%s::jsonb" if c in _JSON_COLUMNS else "%s" for c in ("snapshot_date", *SUMMARY_COLUMNS)
    )

    def check(conn: sa.Connection) -> None:
        stale = change_staleness(conn, {"snapshot_date": d, **changes.summary})
        if stale:
            raise StaleChangesError(f"the changes of {d} are stale: {'; '.join(stale)}")

    done = replace_date_rows(
        engine,
        d,
        what=f"publishing the changes of {d}",
        check=check,
        delete=partial(delete_change_rows, d=d),
        head=(
            "change_summaries",
            "replace_summary_s",
            f"INSERT INTO change_summaries ({columns}) VALUES ({placeholders}, now())",
            (d, *summary),
        ),
        copies={
            table: (len(changes.rows[table]), partial(_copy_rows, table, d, changes.rows[table]))
            for table in CHANGE_COLUMNS
        },
    )
    return done.report(ChangesReport, d, t_start, timings)


def _copy_rows(table: str, d: dt.date, rows: Sequence[tuple[Any, ...]], cursor: Any) -> None:
    """COPY the change rows of ``table`` for ``d`` (binary format, typed per column)."""
    names = CHANGE_COLUMNS[table]
    statement = f"COPY {table} (snapshot_date, {', '.join(names)}) FROM STDIN (FORMAT BINARY)"
    with cursor.copy(statement) as copy:
        copy.set_types(["date", *_COPY_TYPES[table]])
        for row in rows:
            copy.write_row((d, *row))


def read_change_counts(engine: sa.Engine, snapshot_date: dt.date | str) -> dict[str, int]:
    """Rows per change table for ``snapshot_date``, read in one consistent snapshot."""
    return read_snapshot_counts(engine, snapshot_date, CHANGE_TABLES)
