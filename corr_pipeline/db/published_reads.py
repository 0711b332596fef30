"""Reads of what is published (SQLAlchemy Core): the published snapshot dates and the
matrix-store versions each one pins (retention, SPEC §8), the changes recorded and whether they
are stale, the published rows of one snapshot as arrays (:func:`published_rows`, for the changes
between two sessions, SPEC §10) and, read first and fast, what its matrices are read by
(:func:`published_head`: the symbols and the pinned versions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.schema import (
    change_summaries,
    snapshots,
)

__all__ = [
    "PublishedHead",
    "PublishedRows",
    "PublishedSession",
    "change_staleness",
    "changes_to_refresh",
    "first_published",
    "published_at",
    "published_before",
    "published_dates",
    "published_head",
    "published_matrix_versions",
    "published_rows",
    "published_sessions",
    "recorded_change_dates",
]


def published_matrix_versions(engine: sa.Engine) -> dict[dt.date, dict[str, dict[str, str]] | None]:
    """Every published ``snapshot_date`` (oldest first) with the matrix-store versions its
    snapshot pins (``snapshots.matrix_versions``, ``{asset: {array: version}}``; None when it
    recorded none), read in one statement."""
    statement = sa.select(snapshots.c.snapshot_date, snapshots.c.matrix_versions).order_by(
        snapshots.c.snapshot_date
    )
    with engine.connect() as conn:
        return {
            day: (None if versions is None else {str(a): dict(v) for a, v in versions.items()})
            for day, versions in conn.execute(statement)
        }


def recorded_change_dates(engine: sa.Engine) -> list[dt.date]:
    """The snapshot dates whose changes are published (``change_summaries``, SPEC §10), oldest
    first: retention keeps a previous session's matrices until its successor is among them."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(change_summaries.c.snapshot_date).order_by(
                    change_summaries.c.snapshot_date
                )
            ).scalars()
        )


@dataclass(frozen=True)
class PublishedSession:
    """What a backfill needs to know of one published session: the parameters its snapshot was
    computed with (``snapshots.params``) and whether its changes (SPEC §10) are recorded."""

    snapshot_date: dt.date
    params: Mapping[str, Any]
    changes_recorded: bool


def published_sessions(
    engine: sa.Engine, first: dt.date | str, last: dt.date | str
) -> dict[dt.date, PublishedSession]:
    """The published sessions of ``[first, last]`` (one statement)."""
    start, end = as_iso_date(first, "first"), as_iso_date(last, "last")
    statement = (
        sa.select(
            snapshots.c.snapshot_date,
            snapshots.c.params,
            change_summaries.c.snapshot_date.is_not(None),
        )
        .select_from(
            snapshots.outerjoin(
                change_summaries, change_summaries.c.snapshot_date == snapshots.c.snapshot_date
            )
        )
        .where(snapshots.c.snapshot_date.between(start, end))
    )
    with engine.connect() as conn:
        return {
            day: PublishedSession(day, dict(params or {}), bool(recorded))
            for day, params, recorded in conn.execute(statement)
        }


def published_at(engine: sa.Engine, day: dt.date | str) -> dt.datetime | None:
    """When ``day`` was published (its ``snapshots.created_at``), or None when it is not (one
    indexed probe)."""
    statement = sa.select(snapshots.c.created_at).where(
        snapshots.c.snapshot_date == as_iso_date(day, "day")
    )
    with engine.connect() as conn:
        return conn.execute(statement).scalar_one_or_none()


def published_before(engine: sa.Engine, day: dt.date | str) -> dt.date | None:
    """The newest published ``snapshot_date`` before ``day``, or None (one indexed probe)."""
    statement = sa.select(sa.func.max(snapshots.c.snapshot_date)).where(
        snapshots.c.snapshot_date < as_iso_date(day, "day")
    )
    with engine.connect() as conn:
        return conn.execute(statement).scalar_one()


def first_published(engine: sa.Engine) -> dt.date | None:
    """The oldest published ``snapshot_date``, or None (one indexed probe)."""
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.min(snapshots.c.snapshot_date))).scalar_one()


def published_dates(engine: sa.Engine, *, before: dt.date | str | None = None) -> list[dt.date]:
    """Published ``snapshot_date`` values (oldest first), only those ``< before`` when given."""
    statement = sa.select(snapshots.c.snapshot_date).order_by(snapshots.c.snapshot_date)
    if before is not None:
        statement = statement.where(snapshots.c.snapshot_date < as_iso_date(before, "before"))
    with engine.connect() as conn:
        return list(conn.execute(statement).scalars())


def change_staleness(conn: sa.Connection, summary: Mapping[Any, Any]) -> list[str]:
    """Why the recorded changes ``summary`` (a ``change_summaries`` row) no longer describe the
    published snapshots (SPEC §10.7): a
    date re-published since (its ``snapshots.created_at`` is not the one recorded), or another
    previous session now (one published in between, or the previous one deleted). Empty when
    current; a change set recorded before migration 0006 (NULL publications) is checked only
    for the previous session."""
    day, previous = summary["snapshot_date"], summary["previous_date"]
    published = dict(
        conn.execute(
            sa.select(snapshots.c.snapshot_date, snapshots.c.created_at).where(
                snapshots.c.snapshot_date.in_([day, previous])
            )
        ).all()
    )
    newest_before = conn.execute(
        sa.select(sa.func.max(snapshots.c.snapshot_date)).where(snapshots.c.snapshot_date < day)
    ).scalar_one()
    reasons = []
    if newest_before != previous:
        reasons.append(
            f"the previous session is now {newest_before}, not {previous}"
            if newest_before is not None
            else f"{previous} is no longer published"
        )
    for d, column in ((day, "snapshot_published_at"), (previous, "previous_published_at")):
        recorded, now = summary.get(column), published.get(d)
        if recorded is not None and now is not None and now != recorded:
            reasons.append(
                f"the snapshot of {d} was re-published at {now:%Y-%m-%d %H:%M:%S %Z} after "
                f"these changes were computed from its publication of "
                f"{recorded:%Y-%m-%d %H:%M:%S %Z}"
            )
    return reasons


def changes_to_refresh(engine: sa.Engine, day: dt.date | str) -> dt.date | None:
    """The next published session after ``day`` when its changes must be computed again now
    that ``day`` is published (SPEC §10.7): none recorded (it ran before ``day`` was published,
    with no earlier session) or :func:`change_staleness` finds them stale. None otherwise."""
    d = as_iso_date(day, "day")
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        following = conn.execute(
            sa.select(sa.func.min(snapshots.c.snapshot_date)).where(snapshots.c.snapshot_date > d)
        ).scalar_one()
        if following is None:
            return None
        row = conn.execute(
            sa.select(change_summaries).where(change_summaries.c.snapshot_date == following)
        ).first()
        if row is None or change_staleness(conn, row._mapping):
            return following
    return None


@dataclass(frozen=True)
class PublishedHead:
    """What a published snapshot's matrices are read by: its ``symbols`` (sorted by code point,
    SPEC §2), ``params``, the ``matrix_versions`` it pins (SPEC §8) and ``published_at``
    (``created_at``: which publication of the date this is), from the ``snapshots`` row."""

    snapshot_date: dt.date
    symbols: list[str]
    params: dict
    matrix_versions: dict[str, dict[str, str]] | None
    published_at: dt.datetime | None


@dataclass(frozen=True)
class PublishedRows:
    """The published rows of one snapshot (SPEC §7) as the arrays the pipeline computed them in,
    indices into ``symbols`` (sorted by code point, SPEC §2).

    ``neighbor_index`` int32 N x k (−1 = padding; k = the largest published rank),
    ``cluster_labels`` int32 (N,), ``lead_lag_pairs`` a structured array of
    :data:`~corr_pipeline.compute.lead_lag.LEAD_LAG_DTYPE` (a NULL ``sync_corr`` read back as
    NaN, as are the NULL ``p_value``/``q_value`` of a snapshot published before migration
    0007; a NULL reverse direction, SPEC §6 "Direction", as ``reverse_lag`` 0 and NaN
    ``reverse_lagged_corr``/``reverse_q_value``: the reverse pair has no best lag, or the
    snapshot was published before migration 0008), ``params``, ``matrix_versions`` (SPEC §8)
    and ``published_at`` (``created_at``: which publication of the date this is) the
    ``snapshots`` row's."""

    snapshot_date: dt.date
    symbols: list[str]
    neighbor_index: np.ndarray
    cluster_labels: np.ndarray
    lead_lag_pairs: np.ndarray
    params: dict
    matrix_versions: dict[str, dict[str, str]] | None
    published_at: dt.datetime | None = None

    @property
    def head(self) -> PublishedHead:
        """The :class:`PublishedHead` of these rows (equal to :func:`published_head`'s as long as
        the date was not published again in between)."""
        return PublishedHead(
            self.snapshot_date, self.symbols, self.params, self.matrix_versions, self.published_at
        )


#: The published snapshot of :d as columns: symbols are turned into their positions in the
#: snapshot's symbol list (code-point order, ``COLLATE "C"``) by the server, and each column
#: comes back as one array (``array_agg``; the numbers in binary, ``array_send``): no Python
#: object per value.
_SYMBOLS_SQL = (
    "SELECT array_agg(symbol ORDER BY symbol), array_agg(cluster_id ORDER BY symbol) "
    "FROM symbol_clusters WHERE snapshot_date = :d"
)
_POSITIONS = (
    "WITH s AS (SELECT symbol, (row_number() OVER (ORDER BY symbol) - 1)::int AS i "
    "FROM symbol_clusters WHERE snapshot_date = :d) "
)
_NEIGHBORS_SQL = (
    _POSITIONS + "SELECT array_send(array_agg(a.i)), array_send(array_agg(p.rank::int)), "
    "array_send(array_agg(b.i)) "
    "FROM peer_neighbors p JOIN s a ON a.symbol = p.symbol JOIN s b ON b.symbol = p.neighbor "
    "WHERE p.snapshot_date = :d"
)
_PAIR_COLUMNS = (
    ("leader", "a.i", ">i4"),
    ("lagger", "b.i", ">i4"),
    ("lag", "x.lag::int", ">i4"),
    ("lagged_corr", "x.lagged_corr", ">f4"),
    ("sync_corr", "coalesce(x.sync_corr, 'NaN'::real)", ">f4"),
    ("improvement", "x.improvement", ">f4"),
    ("overlap", "x.overlap", ">i4"),
    ("p_value", "coalesce(x.p_value, 'NaN'::float8)", ">f8"),
    ("q_value", "coalesce(x.q_value, 'NaN'::float8)", ">f8"),
    ("reverse_lag", "coalesce(x.reverse_lag, 0)::int", ">i4"),
    ("reverse_lagged_corr", "coalesce(x.reverse_lagged_corr, 'NaN'::real)", ">f4"),
    ("reverse_q_value", "coalesce(x.reverse_q_value, 'NaN'::float8)", ">f8"),
)
#: The lead-lag pairs as one row of twelve arrays, each in PostgreSQL's binary array format
#: (``array_send``: a bytea the client reads straight into numpy, no Python object per value).
_PAIRS_SQL = (
    _POSITIONS
    + "SELECT "
    + ", ".join(f"array_send(array_agg({expr}))" for _, expr, _ in _PAIR_COLUMNS)
    + " FROM lead_lag_pairs x JOIN s a ON a.symbol = x.leader JOIN s b ON b.symbol = x.lagger "
    "WHERE x.snapshot_date = :d"
)
#: PostgreSQL's type OIDs of the arrays' elements (int4, float4, float8).
_ELEMENT_OID = {">i4": 23, ">f4": 700, ">f8": 701}


def _from_array_send(data: bytes | None, kind: str) -> np.ndarray:
    """A one-dimensional array of fixed-width ``kind`` values (``>i4``, ``>f4``, ``>f8``) from
    ``array_send``'s bytes (the header: dimensions, has-nulls flag, element OID, then per
    dimension its length and lower bound; then per element its byte length and big-endian
    value). None (an empty ``array_agg``) is an empty array."""
    if data is None:
        return np.zeros(0, kind)
    data = bytes(data)
    width = np.dtype(kind).itemsize
    if len(data) < 20 or (len(data) - 20) % (4 + width):
        raise ValueError(f"unexpected array_send output: {len(data)} bytes")
    ndim, has_nulls, oid = np.frombuffer(data, ">i4", 3)
    if ndim != 1 or has_nulls or oid != _ELEMENT_OID[kind]:
        raise ValueError(f"unexpected array_send output: {ndim} dims, nulls {has_nulls}, oid {oid}")
    n = int(np.frombuffer(data, ">i4", 1, 12)[0])
    items = np.frombuffer(data, [("length", ">i4"), ("value", kind)], offset=20)
    if items.size != n or (items["length"] != width).any():
        raise ValueError(f"unexpected array_send output: not one {width}-byte value per element")
    return items["value"]


def _read_pairs(conn: sa.Connection, d: str) -> np.ndarray:
    """The lead-lag pairs of ``d`` in SPEC §6 order, leader and lagger as positions in the
    sorted symbols (NaN improvements first, as PostgreSQL sorts them): one row of twelve binary
    arrays (``array_send``) on ``conn`` (its transaction), read straight into numpy (a binary
    ``COPY`` of the rows cost the client ~1 µs per row in psycopg, 0.5 s per 4·10⁵ pairs;
    these arrays 0.05 s)."""
    from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE

    row = conn.execute(sa.text(_PAIRS_SQL), {"d": d}).one()
    columns = {
        name: _from_array_send(value, kind)
        for (name, _, kind), value in zip(_PAIR_COLUMNS, row, strict=True)
    }
    if len({c.size for c in columns.values()}) > 1:
        raise ValueError("unexpected array_send output: columns of different lengths")
    out = np.zeros(columns["leader"].size, LEAD_LAG_DTYPE)
    for name in LEAD_LAG_DTYPE.names or ():
        out[name] = columns[name]
    # SPEC §6 order, ORDER BY improvement DESC, leader, lagger: the positions rank the symbols
    # in the database's order (_POSITIONS), so sorting by them sorts by the names (here, not
    # on the server: a sort of 4·10⁵ rows on text keys there cost more than the whole read)
    descending = np.where(np.isnan(out["improvement"]), -np.inf, -out["improvement"])
    return out[np.lexsort((out["lagger"], out["leader"], descending))]


def _read_head(conn: sa.Connection, d: dt.date) -> tuple[PublishedHead, Any] | None:
    """The :class:`PublishedHead` of ``d`` and its cluster labels (``array_agg``, in symbol
    order) on ``conn``, or None when ``d`` is not published."""
    row = conn.execute(
        sa.select(snapshots.c.params, snapshots.c.matrix_versions, snapshots.c.created_at).where(
            snapshots.c.snapshot_date == d
        )
    ).first()
    if row is None:
        return None
    symbol_list, labels = conn.execute(sa.text(_SYMBOLS_SQL), {"d": d}).one()
    versions = row.matrix_versions
    return (
        PublishedHead(
            snapshot_date=d,
            symbols=[str(s) for s in symbol_list or []],
            params=dict(row.params or {}),
            matrix_versions=None
            if versions is None
            else {
                str(a): {str(n): str(v) for n, v in arrays.items()}
                for a, arrays in versions.items()
            },
            published_at=row.created_at,
        ),
        labels,
    )


def published_head(engine: sa.Engine, day: dt.date | str) -> PublishedHead | None:
    """The :class:`PublishedHead` of ``day`` (None when ``day`` is not published): two small
    queries, for reading the matrices while :func:`published_rows` reads the rest."""
    d = as_iso_date(day, "day")
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        found = _read_head(conn, d)
    return None if found is None else found[0]


def published_rows(engine: sa.Engine, day: dt.date | str) -> PublishedRows | None:
    """The published snapshot of ``day`` as arrays (None when ``day`` is not published), read
    in one database snapshot (REPEATABLE READ: never a mix of two publications). The symbols
    are those of ``symbol_clusters`` (every kept symbol has its row); lead-lag pairs in SPEC §6
    order."""
    d = as_iso_date(day, "day")
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        found = _read_head(conn, d)
        if found is None:
            return None
        head, labels = found
        # Right after a publication the planner has no statistics of the new rows yet and may
        # estimate one row per join side: a nested loop over two 10⁵-row sides took minutes at
        # N = 24,000. Hash joins cost the same whatever the estimates.
        conn.execute(sa.text("SET LOCAL enable_nestloop = off"))
        rows, ranks, neighbors = (
            _from_array_send(value, ">i4")
            for value in conn.execute(sa.text(_NEIGHBORS_SQL), {"d": d}).one()
        )
        pairs = _read_pairs(conn, str(d))
    index = np.full((len(head.symbols), int(ranks.max(initial=0))), -1, np.int32)
    if ranks.size:
        index[rows, ranks - 1] = neighbors
    return PublishedRows(
        snapshot_date=d,
        symbols=head.symbols,
        neighbor_index=index,
        cluster_labels=np.asarray(labels or [], np.int32),
        lead_lag_pairs=pairs,
        params=head.params,
        matrix_versions=head.matrix_versions,
        published_at=head.published_at,
    )
