"""One date's published rows replaced in one transaction, the skeleton both publications share
(the snapshot's, :mod:`corr_pipeline.db.publish`, and its changes',
:mod:`corr_pipeline.db.publish_changes`).

Under the date's advisory lock (:func:`lock_date`, held until the commit by every writer of a
date's rows): an optional check (that the rows are still current), the deletion of the date's
previous rows, the one head row (``snapshots`` or ``change_summaries``), then one ``COPY`` per
table; the counts must be exactly the head row and each table's rows, or nothing is committed.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa

from corr_pipeline.db.bulk import driver_connection

__all__ = ["Replacement", "lock_date", "replace_date_rows"]

Report = TypeVar("Report")

#: First key of the advisory lock of a date (the second: the date's day number).
_LOCK_NAMESPACE = "corr_pipeline.snapshot"
_EPOCH = dt.date(1970, 1, 1)


def lock_date(cursor: Any, d: dt.date) -> float:
    """Take the transaction-scoped advisory lock of ``d`` that every writer of a date's rows
    (a snapshot's publication or withdrawal, its changes' publication) holds; seconds waited."""
    t = time.perf_counter()
    cursor.execute(
        "SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (_LOCK_NAMESPACE, (d - _EPOCH).days)
    )
    return time.perf_counter() - t


@dataclass
class Replacement:
    """What :func:`replace_date_rows` did: rows inserted per table, seconds per phase, the lock
    wait and whether the date had rows before."""

    rows: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    lock_wait_seconds: float = 0.0
    replaced_previous: bool = False

    def report(
        self, cls: Callable[..., Report], d: dt.date, started: float, timings: dict[str, float]
    ) -> Report:
        """``cls`` (a publication's report) of this replacement of ``d``: seconds since
        ``started``, the caller's ``timings`` (its preparation) before the replacement's."""
        return cls(
            snapshot_date=d,
            rows=self.rows,
            seconds=time.perf_counter() - started,
            lock_wait_seconds=self.lock_wait_seconds,
            replaced_previous=self.replaced_previous,
            timings={**timings, **self.timings},
        )


def replace_date_rows(
    engine: sa.Engine,
    d: dt.date,
    *,
    what: str,
    delete: Callable[[Any], bool],
    head: tuple[str, str, str, tuple[Any, ...]],
    copies: Mapping[str, tuple[int, Callable[[Any], None]]],
    check: Callable[[sa.Connection], None] | None = None,
) -> Replacement:
    """Replace the rows of ``d`` (module docstring). ``delete(cursor)``: delete them, True if
    there were any; ``head``: ``(table, timing name, INSERT statement, its parameters)``;
    ``copies``: per table its row count and ``write(cursor)`` that copies them; ``check(conn)``:
    raise to abandon the replacement (timed as ``check_current_s``). ``what`` names the
    publication in the error when a count differs (a ``RuntimeError``: never committed)."""
    done = Replacement()
    with engine.begin() as conn, driver_connection(conn).cursor() as cur:
        done.lock_wait_seconds = lock_date(cur, d)
        if check is not None:
            t = time.perf_counter()
            check(conn)
            done.timings["check_current_s"] = time.perf_counter() - t
        t = time.perf_counter()
        done.replaced_previous = delete(cur)
        table, timing, statement, params = head
        cur.execute(statement, params)
        done.rows[table] = cur.rowcount
        done.timings[timing] = time.perf_counter() - t
        for name, (_, write) in copies.items():
            t = time.perf_counter()
            write(cur)
            done.rows[name] = cur.rowcount
            done.timings[f"copy_{name}_s"] = time.perf_counter() - t
        expected = {table: 1, **{name: n_rows for name, (n_rows, _) in copies.items()}}
        if done.rows != expected:  # impossible unless COPY lost rows: never commit that
            raise RuntimeError(f"{what}: inserted {done.rows}, expected {expected}")
        t = time.perf_counter()
    done.timings["commit_s"] = time.perf_counter() - t
    return done
