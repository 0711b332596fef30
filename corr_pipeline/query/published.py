"""Answers read from the published tables (SPEC §7): snapshots, peers, cluster, lead-lag.

``snapshots(engine)``                 the published snapshots, newest first
``peers(engine, symbol, date)``       its top-k neighbors (``peer_neighbors``, SPEC §4)
``cluster(engine, symbol, date)``     its cluster id, the cluster's size and some members
                                      (``symbol_clusters``, SPEC §5)
``lead_lag(engine, symbol, date)``    the lead-lag pairs where it leads or lags
                                      (``lead_lag_pairs``, SPEC §6), with their direction
``direction_recorded(conn, day)``     whether a snapshot recorded its pairs' direction

``date=None`` (or ``"latest"``) means the latest published snapshot. Each answer reads one
snapshot of the database (:func:`consistent_read`), so it never mixes two publications. Every
statement uses bound parameters (SQLAlchemy Core): symbols are passed and returned verbatim
whatever they contain (quotes, semicolons, spaces, non-ASCII). Lookups go through the primary
keys ``(snapshot_date, symbol[, rank])`` / ``(snapshot_date, leader, lagger)``. For an unknown symbol,
"it has prices but was dropped" is read from the configured price source
(:mod:`corr_pipeline.db.price_source`), the one the pipeline read.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from corr_pipeline.dates import date_problem, missing_day
from corr_pipeline.db.price_source import (
    PriceSource,
    configured_price_source,
    resolve_price_source,
)
from corr_pipeline.db.schema import lead_lag_pairs as t_lead_lag
from corr_pipeline.db.schema import peer_neighbors as t_peers
from corr_pipeline.db.schema import snapshots as t_snapshots
from corr_pipeline.db.schema import symbol_clusters as t_clusters
from corr_pipeline.query.answers import (
    ClusterResult,
    LeadLagResult,
    PeersResult,
    Snapshot,
    SnapshotsResult,
)
from corr_pipeline.query.errors import (
    NoSnapshotError,
    QueryError,
    SnapshotNotFoundError,
    UnknownSymbolError,
    quote,
)
from corr_pipeline.query.symbols import suggest_symbols
from corr_pipeline.snapshot.direction import snapshot_max_q_value

__all__ = [
    "LATEST_SHOWN",
    "MAX_Q_RANGE",
    "cluster",
    "consistent_read",
    "direction_recorded",
    "lead_lag",
    "parse_date",
    "parse_max_q",
    "peers",
    "require_symbol",
    "resolve_snapshot",
    "snapshots",
]

LATEST_SHOWN = 5  # dates listed when a requested date has no snapshot
#: The values ``--max-q`` takes (:func:`parse_max_q`).
MAX_Q_RANGE = "0 < Q <= 1"


def parse_date(value: dt.date | str | None) -> dt.date | None:
    """``None``/``"latest"`` → None (latest snapshot); a ``date`` or ``YYYY-MM-DD`` string → date.

    Anything else raises :class:`QueryError` saying what is wrong
    (:func:`corr_pipeline.dates.date_problem`: ``--date 2024-02-30: not a date (February 2024
    has 29 days)``).
    """
    if value is None or isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.datetime):
        return value.date()
    text = str(value).strip()
    if text.lower() in ("", "latest"):
        return None
    problem = date_problem(text)
    if problem is None:
        return dt.date.fromisoformat(text)
    if missing_day(text) is not None:  # digits and dashes: shown as typed
        raise QueryError(f"--date {text}: {problem}")
    raise QueryError(f"--date {quote(text)}: {problem} (or 'latest')")


def parse_max_q(value: float | str | None) -> float | None:
    """A q-value bound (``--max-q``): None → None; a number ``0 < q <= 1``, or its text, → that
    number. Anything else raises :class:`QueryError` in one line saying the valid range:
    ``--max-q 0: out of range: a q-value bound Q must satisfy 0 < Q <= 1``."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        raise QueryError(
            f"--max-q {quote(text)}: not a number: a q-value bound Q must satisfy {MAX_Q_RANGE}"
        ) from None
    if not 0.0 < number <= 1.0:  # False for NaN as well
        raise QueryError(
            f"--max-q {text}: out of range: a q-value bound Q must satisfy {MAX_Q_RANGE}"
        )
    return number


def consistent_read(engine: sa.Engine) -> sa.Connection:
    """A connection whose statements all read ONE snapshot of the database (REPEATABLE READ:
    PostgreSQL takes the snapshot at the first statement and keeps it until the block ends).

    An answer takes several statements (resolve the snapshot date, check the symbol, read its
    rows); reading them all from one database snapshot means a publication or a withdrawal
    committing in between is either wholly visible or not at all. SPEC §7: readers never see
    a mix.
    """
    return engine.connect().execution_options(isolation_level="REPEATABLE READ")


_SNAPSHOT_COLUMNS = (
    t_snapshots.c.snapshot_date,
    t_snapshots.c.as_of_trade_date,
    t_snapshots.c.n_symbols,
    t_snapshots.c.n_dropped,
    t_snapshots.c.lookback_days,
    t_snapshots.c.params,
    t_snapshots.c.created_at,
    t_snapshots.c.matrix_versions,
)


def _snapshot_from_row(row: Any) -> Snapshot:
    m = row._mapping
    return Snapshot(
        snapshot_date=m["snapshot_date"],
        as_of_trade_date=m["as_of_trade_date"],
        n_symbols=int(m["n_symbols"]),
        n_dropped=int(m["n_dropped"]),
        lookback_days=int(m["lookback_days"]),
        params=dict(m["params"] or {}),
        created_at=m["created_at"],
        matrix_versions=None
        if m["matrix_versions"] is None
        else {str(a): dict(v) for a, v in m["matrix_versions"].items()},
    )


def _latest_dates(conn: sa.Connection, limit: int = LATEST_SHOWN) -> list[dt.date]:
    rows = conn.execute(
        sa.select(t_snapshots.c.snapshot_date)
        .order_by(t_snapshots.c.snapshot_date.desc())
        .limit(limit)
    )
    return [r[0] for r in rows]


def resolve_snapshot(conn: sa.Connection, date: dt.date | str | None) -> Snapshot:
    """The published snapshot of ``date`` (None: the latest one).

    Raises :class:`NoSnapshotError` when nothing is published, :class:`SnapshotNotFoundError`
    (with the latest dates and the nearest earlier one) when ``date`` has no snapshot.
    """
    day = parse_date(date)
    query = sa.select(*_SNAPSHOT_COLUMNS)
    if day is None:
        row = conn.execute(query.order_by(t_snapshots.c.snapshot_date.desc()).limit(1)).first()
        if row is None:
            raise NoSnapshotError(
                "no snapshot has been published yet: materialize the snapshot assets "
                "(see docs/user_guide.md), then query again"
            )
        return _snapshot_from_row(row)
    row = conn.execute(query.where(t_snapshots.c.snapshot_date == day)).first()
    if row is not None:
        return _snapshot_from_row(row)
    total = conn.execute(sa.select(sa.func.count()).select_from(t_snapshots)).scalar_one()
    earlier = conn.execute(
        sa.select(sa.func.max(t_snapshots.c.snapshot_date)).where(t_snapshots.c.snapshot_date < day)
    ).scalar_one()
    raise SnapshotNotFoundError(day, _latest_dates(conn), earlier, int(total))


def _snapshot_symbols(conn: sa.Connection, day: dt.date) -> list[str]:
    rows = conn.execute(
        sa.select(t_clusters.c.symbol).where(t_clusters.c.snapshot_date == day)
    ).scalars()
    symbols = list(rows)
    if not symbols:  # a snapshot without clusters: fall back to the neighbor table
        symbols = list(
            conn.execute(
                sa.select(t_peers.c.symbol).where(t_peers.c.snapshot_date == day).distinct()
            ).scalars()
        )
    return symbols


def require_symbol(
    conn: sa.Connection, snap: Snapshot, symbol: str, price_source: PriceSource | None = None
) -> None:
    """Raise :class:`UnknownSymbolError` unless ``symbol`` is in the snapshot (PK lookups).

    For an unknown symbol, whether it has prices (dropped by SPEC §2 rather than unknown) is
    read from ``price_source``, default the configured one
    (:func:`~corr_pipeline.db.price_source.configured_price_source`): the source the pipeline
    read, not necessarily the project's ``prices`` table."""
    day = snap.snapshot_date
    in_clusters = sa.exists().where(
        t_clusters.c.snapshot_date == day, t_clusters.c.symbol == symbol
    )
    in_peers = sa.exists().where(t_peers.c.snapshot_date == day, t_peers.c.symbol == symbol)
    if conn.execute(sa.select(sa.or_(in_clusters, in_peers))).scalar_one():
        return
    src = resolve_price_source(conn, price_source or configured_price_source())
    table = src.table_clause()
    has_prices = conn.execute(
        sa.select(sa.exists().where(src.symbol_expr(table) == symbol))
    ).scalar_one()
    candidates = _snapshot_symbols(conn, day)
    raise UnknownSymbolError(
        symbol, snap, suggest_symbols(symbol, candidates), has_prices=bool(has_prices)
    )


def snapshots(engine: sa.Engine, *, limit: int | None = 10) -> SnapshotsResult:
    """The ``limit`` newest published snapshots (None = all) and how many exist."""
    with consistent_read(engine) as conn:
        query = sa.select(*_SNAPSHOT_COLUMNS).order_by(t_snapshots.c.snapshot_date.desc())
        if limit is not None:
            query = query.limit(max(1, int(limit)))
        rows = conn.execute(query)
        found = [_snapshot_from_row(r) for r in rows]
        total = conn.execute(sa.select(sa.func.count()).select_from(t_snapshots)).scalar_one()
    return SnapshotsResult(found, int(total))


def peers(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    limit: int | None = None,
    price_source: PriceSource | None = None,
) -> PeersResult:
    """Neighbors of ``symbol`` by ``|corr|`` (``peer_neighbors``, SPEC §4), rank ascending,
    at most ``limit`` (None = all).

    Each peer: rank, neighbor, corr (signed), overlap, and the neighbor's cluster id.
    """
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        require_symbol(conn, snap, symbol, price_source)
        day = snap.snapshot_date
        neighbor_cluster = t_clusters.alias("neighbor_cluster")
        query = (
            sa.select(
                t_peers.c.rank,
                t_peers.c.neighbor,
                t_peers.c.corr,
                t_peers.c.overlap,
                neighbor_cluster.c.cluster_id.label("neighbor_cluster_id"),
            )
            .select_from(
                t_peers.outerjoin(
                    neighbor_cluster,
                    sa.and_(
                        neighbor_cluster.c.snapshot_date == t_peers.c.snapshot_date,
                        neighbor_cluster.c.symbol == t_peers.c.neighbor,
                    ),
                )
            )
            .where(t_peers.c.snapshot_date == day, t_peers.c.symbol == symbol)
            .order_by(t_peers.c.rank)
        )
        if limit is not None:
            query = query.limit(max(0, int(limit)))
        rows = [dict(r._mapping) for r in conn.execute(query)]
        cluster_id = conn.execute(
            sa.select(t_clusters.c.cluster_id).where(
                t_clusters.c.snapshot_date == day, t_clusters.c.symbol == symbol
            )
        ).scalar_one_or_none()
    return PeersResult(snap, symbol, cluster_id, rows)


def cluster(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    members: int | None = 20,
    price_source: PriceSource | None = None,
) -> ClusterResult:
    """Cluster id of ``symbol`` (``symbol_clusters``, SPEC §5), the cluster's size, the number
    of clusters, its first ``members`` members by symbol (None = all) and its top-k peers that
    share the cluster."""
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        require_symbol(conn, snap, symbol, price_source)
        day = snap.snapshot_date
        cluster_id = conn.execute(
            sa.select(t_clusters.c.cluster_id).where(
                t_clusters.c.snapshot_date == day, t_clusters.c.symbol == symbol
            )
        ).scalar_one_or_none()
        if cluster_id is None:
            raise QueryError(
                f"{quote(symbol)} has no cluster in the snapshot of {day} "
                "(symbol_clusters holds no row for it: re-materialize the partition)"
            )
        in_cluster = sa.and_(
            t_clusters.c.snapshot_date == day, t_clusters.c.cluster_id == cluster_id
        )
        size = conn.execute(sa.select(sa.func.count()).where(in_cluster)).scalar_one()
        n_clusters = conn.execute(
            sa.select(sa.func.count(sa.distinct(t_clusters.c.cluster_id))).where(
                t_clusters.c.snapshot_date == day
            )
        ).scalar_one()
        member_query = (
            sa.select(t_clusters.c.symbol).where(in_cluster).order_by(t_clusters.c.symbol)
        )
        if members is not None:
            member_query = member_query.limit(max(0, int(members)))
        member_list = list(conn.execute(member_query).scalars())
        peer_rows = conn.execute(
            sa.select(t_peers.c.rank, t_peers.c.neighbor, t_peers.c.corr)
            .select_from(
                t_peers.join(
                    t_clusters,
                    sa.and_(
                        t_clusters.c.snapshot_date == t_peers.c.snapshot_date,
                        t_clusters.c.symbol == t_peers.c.neighbor,
                    ),
                )
            )
            .where(
                t_peers.c.snapshot_date == day,
                t_peers.c.symbol == symbol,
                t_clusters.c.cluster_id == cluster_id,
            )
            .order_by(t_peers.c.rank)
        )
        peers_in = [dict(r._mapping) for r in peer_rows]
    return ClusterResult(
        snap, symbol, int(cluster_id), int(size), int(n_clusters), member_list, peers_in
    )


def lead_lag(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    limit: int | None = None,
    max_q: float | None = None,
    one_way: bool = False,
    price_source: PriceSource | None = None,
) -> LeadLagResult:
    """Pairs of ``lead_lag_pairs`` (SPEC §6) with ``leader = symbol`` or ``lagger = symbol``,
    by improvement descending (then leader, lagger), at most ``limit`` (None = all); with
    ``max_q`` (``0 < max_q <= 1``, else :class:`QueryError`: :func:`parse_max_q`) only those with
    ``q_value <= max_q`` (a pair without a q-value, NULL, never passes).

    Each pair comes with its reverse direction (SPEC §6 "Direction"), judged at ``max_q`` when
    given, else at the snapshot's ``max_q_value`` (``snapshots.params``; 1 when it recorded
    none): two-way when ``reverse_q_value`` is at most that, else one-way; unknown for a
    snapshot that did not record the direction (:func:`direction_recorded`). With ``one_way``
    only the pairs known to be one-way: the reverse pair is not significant or has no best lag
    (a pair of unknown direction never passes)."""
    max_q = parse_max_q(max_q)
    c = t_lead_lag.c
    involved = sa.or_(c.leader == symbol, c.lagger == symbol)
    passing = involved if max_q is None else sa.and_(involved, c.q_value <= max_q)
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        require_symbol(conn, snap, symbol, price_source)
        threshold = max_q if max_q is not None else snapshot_max_q_value(snap.params)
        recorded = direction_recorded(conn, snap.snapshot_date)
        # a NULL reverse direction is "no best lag" when the snapshot recorded the direction,
        # else unknown; reverse_q_value is NULL exactly where reverse_lag is (publication)
        # (neither is ever NULL, so that NOT of them is what it says)
        two_way = sa.and_(c.reverse_q_value.is_not(None), c.reverse_q_value <= threshold)
        unknown = sa.and_(c.reverse_lag.is_(None), sa.false() if recorded else sa.true())
        if one_way:
            passing = sa.and_(passing, sa.not_(two_way), sa.not_(unknown))
        query = (
            sa.select(
                c.leader,
                c.lagger,
                c.lag,
                c.lagged_corr,
                c.sync_corr,
                c.improvement,
                c.overlap,
                c.p_value,
                c.q_value,
                c.reverse_lag,
                c.reverse_lagged_corr,
                c.reverse_q_value,
            )
            .where(c.snapshot_date == snap.snapshot_date, passing)
            .order_by(c.improvement.desc(), c.leader, c.lagger)
        )
        if limit is not None:
            query = query.limit(max(0, int(limit)))
        rows = [dict(r._mapping) for r in conn.execute(query)]
        n_leads, n_lags, n_two_way, n_without_q, n_unknown = conn.execute(
            sa.select(
                sa.func.count().filter(passing, c.leader == symbol),
                sa.func.count().filter(passing, c.lagger == symbol),
                sa.func.count().filter(passing, two_way),
                sa.func.count().filter(c.q_value.is_(None)),
                sa.func.count().filter(unknown),
            ).where(c.snapshot_date == snap.snapshot_date, involved)
        ).one()
    return LeadLagResult(
        snap,
        symbol,
        rows,
        int(n_leads),
        int(n_lags),
        max_q=max_q,
        n_without_q=int(n_without_q) if max_q is not None else 0,
        two_way_max_q=threshold,
        direction_recorded=recorded,
        one_way=one_way,
        n_two_way=int(n_two_way),
        n_unknown_direction=int(n_unknown) if one_way else 0,
    )


def direction_recorded(conn: sa.Connection, day: dt.date) -> bool:
    """Whether the snapshot of ``day`` recorded its pairs' reverse direction (SPEC §6
    "Direction"): whether any of its pairs has a non-NULL ``reverse_lag``. A snapshot
    published before schema revision 0008 has none (NULL everywhere: unknown); one published
    since has a reverse best lag for almost every pair (a pair's reverse lacks one only where
    the returns are too ragged for any lag to reach ``min_overlap`` that way). A snapshot in
    which no pair at all has one reads as not recorded: its pairs show as of unknown direction,
    never wrongly as one-way."""
    return bool(
        conn.execute(
            sa.select(
                sa.exists().where(
                    t_lead_lag.c.snapshot_date == day, t_lead_lag.c.reverse_lag.is_not(None)
                )
            )
        ).scalar_one()
    )
