"""What changed since the previous session (SPEC §10), read from the published change tables.

``changes(engine, date)``          the market-level drift, the largest moves, entered/left
                                   symbols and the counts of every kind of change
``symbol_changes(engine, s, date)`` one symbol's status, cluster move, neighbor turnover,
                                   lead-lag changes and largest correlation moves

``date=None`` (or ``"latest"``) is the latest published snapshot; each answer reads one
database snapshot (:func:`~corr_pipeline.query.published.consistent_read`). The errors are those
of the other queries (no snapshot, a date without one, an unknown symbol with close matches),
plus :class:`ChangesNotRecordedError` for a snapshot whose changes are not recorded. The first
published snapshot has nothing to compare with: that is an answer (``previous_date`` None). A symbol's
largest moves come from one row of each day's correlation matrix in the store (the pinned
versions, SPEC §8): every pair of the symbol, exact, ties by name; when a matrix is gone, from
its rows among the market's top moves (``change_pairs``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.published_reads import change_staleness
from corr_pipeline.db.schema import (
    change_clusters,
    change_lead_lag,
    change_pairs,
    change_summaries,
    change_symbols,
    peer_neighbors,
    snapshots,
)
from corr_pipeline.query.answers import ChangesResult, Snapshot, SymbolChangesResult
from corr_pipeline.query.errors import MatrixUnavailableError, QueryError
from corr_pipeline.query.matrix import (
    CORR_ARRAY,
    CORR_ASSET,
    OVERLAP_ARRAY,
    OVERLAP_ASSET,
    default_store,
)
from corr_pipeline.query.published import consistent_read, require_symbol, resolve_snapshot
from corr_pipeline.store.matrix_store import MatrixStore, MatrixStoreError

__all__ = ["ChangesNotRecordedError", "changes", "symbol_changes"]


class ChangesNotRecordedError(QueryError):
    """The snapshot has an earlier published session but its changes are not recorded
    (``snapshot_changes`` has not run for it)."""

    kind = "changes_not_recorded"


def _summary(conn: sa.Connection, snap: Snapshot) -> dict[str, Any] | None:
    """The date's ``change_summaries`` row; None when no earlier snapshot is published (an
    answer: nothing to compare with); :class:`ChangesNotRecordedError` when there is one but
    the changes are not recorded."""
    row = conn.execute(
        sa.select(change_summaries).where(change_summaries.c.snapshot_date == snap.snapshot_date)
    ).first()
    if row is not None:
        return dict(row._mapping)
    day = snap.snapshot_date
    earlier = conn.execute(
        sa.select(sa.func.max(snapshots.c.snapshot_date)).where(snapshots.c.snapshot_date < day)
    ).scalar_one()
    if earlier is None:
        return None
    raise ChangesNotRecordedError(
        f"the changes of {day} (against {earlier}) are not recorded: materialize "
        f"snapshot_changes for {day.isoformat()}"
    )


def changes(
    engine: sa.Engine, date: dt.date | str | None = None, *, limit: int | None = 20
) -> ChangesResult:
    """The changes of the snapshot of ``date`` (None: the latest): the drift, the ``limit``
    largest moves (None = all recorded), entered/left symbols and counts (SPEC §10)."""
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        summary = _summary(conn, snap)
        if summary is None:
            return ChangesResult(snap, None, None, [], [], [], {})
        stale = change_staleness(conn, summary)
        day = snap.snapshot_date
        moves_query = (
            sa.select(
                change_pairs.c.rank,
                change_pairs.c.symbol_a,
                change_pairs.c.symbol_b,
                change_pairs.c.previous_corr,
                change_pairs.c.corr,
                change_pairs.c.change,
                change_pairs.c.previous_overlap,
                change_pairs.c.overlap,
            )
            .where(change_pairs.c.snapshot_date == day)
            .order_by(change_pairs.c.rank)
        )
        if limit is not None:
            moves_query = moves_query.limit(max(0, int(limit)))
        moves = [dict(r._mapping) for r in conn.execute(moves_query)]
        status = {
            s: list(
                conn.execute(
                    sa.select(change_symbols.c.symbol)
                    .where(change_symbols.c.snapshot_date == day, change_symbols.c.status == s)
                    .order_by(change_symbols.c.symbol)
                ).scalars()
            )
            for s in ("entered", "left")
        }
        moved = conn.execute(
            sa.select(sa.func.count()).where(
                change_symbols.c.snapshot_date == day, change_symbols.c.moved
            )
        ).scalar_one()
        clusters: dict[str, int] = dict(
            conn.execute(
                sa.select(change_clusters.c.status, sa.func.count())
                .where(change_clusters.c.snapshot_date == day)
                .group_by(change_clusters.c.status)
            ).all()
        )
        split, merged = conn.execute(
            sa.select(
                sa.func.count().filter(change_clusters.c.split),
                sa.func.count().filter(change_clusters.c.merged),
            ).where(change_clusters.c.snapshot_date == day)
        ).one()
        lead_lag: dict[str, int] = dict(
            conn.execute(
                sa.select(change_lead_lag.c.change, sa.func.count())
                .where(change_lead_lag.c.snapshot_date == day)
                .group_by(change_lead_lag.c.change)
            ).all()
        )
    counts = {
        "moved_symbols": int(moved),
        "clusters_appeared": int(clusters.get("appeared", 0)),
        "clusters_vanished": int(clusters.get("vanished", 0)),
        "clusters_split": int(split),
        "clusters_merged": int(merged),
        "lead_lag_appeared": int(lead_lag.get("appeared", 0)),
        "lead_lag_vanished": int(lead_lag.get("vanished", 0)),
        "lead_lag_lag_changed": int(lead_lag.get("lag_changed", 0)),
    }
    return ChangesResult(
        snapshot=snap,
        previous_date=summary["previous_date"],
        summary=summary,
        moves=moves,
        entered=status["entered"],
        left=status["left"],
        counts=counts,
        stale=stale,
    )


def _neighbors(conn: sa.Connection, day: dt.date, symbol: str) -> list[str]:
    return list(
        conn.execute(
            sa.select(peer_neighbors.c.neighbor)
            .where(peer_neighbors.c.snapshot_date == day, peer_neighbors.c.symbol == symbol)
            .order_by(peer_neighbors.c.rank)
        ).scalars()
    )


def _pinned(conn: sa.Connection, day: dt.date) -> dict[str, dict[str, str]]:
    versions = conn.execute(
        sa.select(snapshots.c.matrix_versions).where(snapshots.c.snapshot_date == day)
    ).scalar_one_or_none()
    return dict(versions or {})


def _row(store: MatrixStore, day: dt.date, pins: dict, symbol: str):
    """(symbols, corr row, overlap row) of ``symbol`` in the pinned matrices of ``day``."""
    partition = day.isoformat()
    corr = store.load(
        CORR_ASSET, partition, CORR_ARRAY, version=(pins.get(CORR_ASSET) or {}).get(CORR_ARRAY)
    )
    overlap = store.load(
        OVERLAP_ASSET,
        partition,
        OVERLAP_ARRAY,
        version=(pins.get(OVERLAP_ASSET) or {}).get(OVERLAP_ARRAY),
    )
    symbols = list(corr.labels["symbols"])
    i = symbols.index(symbol)  # ValueError when absent
    return symbols, np.asarray(corr.array[i]), np.asarray(overlap.array[i])


def _moves_from_matrices(
    store: MatrixStore,
    symbol: str,
    today: tuple[dt.date, dict],
    previous: tuple[dt.date, dict],
    min_overlap: int,
    limit: int | None,
) -> list[dict[str, Any]]:
    """SPEC §10.2 restricted to the pairs of ``symbol``: every other common symbol with both
    correlations finite and both overlaps >= ``min_overlap``, by |Δ| descending, ties by name."""
    names_t, corr_t, ov_t = _row(store, *today, symbol)
    names_p, corr_p, ov_p = _row(store, *previous, symbol)
    pos_t = {s: i for i, s in enumerate(names_t)}
    pos_p = {s: j for j, s in enumerate(names_p)}
    other = sorted(s for s in names_t if s in pos_p and s != symbol)
    it = np.array([pos_t[s] for s in other], dtype=np.int64)
    ip = np.array([pos_p[s] for s in other], dtype=np.int64)
    ct, cp = corr_t[it].astype(np.float64), corr_p[ip].astype(np.float64)
    ok = np.isfinite(ct) & np.isfinite(cp) & (ov_t[it] >= min_overlap) & (ov_p[ip] >= min_overlap)
    chosen = np.flatnonzero(ok)
    change = ct[chosen] - cp[chosen]
    order = chosen[np.lexsort((chosen, -np.abs(change)))]
    if limit is not None:
        order = order[: max(0, int(limit))]
    return [
        {
            "other": other[x],
            "previous_corr": float(corr_p[ip[x]]),
            "corr": float(corr_t[it[x]]),
            "change": float(ct[x] - cp[x]),
            "previous_overlap": int(ov_p[ip[x]]),
            "overlap": int(ov_t[it[x]]),
        }
        for x in order
    ]


def symbol_changes(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    limit: int | None = 10,
    store: MatrixStore | None = None,
) -> SymbolChangesResult:
    """What changed for ``symbol`` in the snapshot of ``date`` (None: the latest) since the
    previous session (SPEC §10); its ``limit`` largest correlation moves (None = all)."""
    with consistent_read(engine) as conn:
        snap = resolve_snapshot(conn, date)
        summary = _summary(conn, snap)
        if summary is None:  # the first published snapshot: the symbol must be in it
            require_symbol(conn, snap, symbol)
            return SymbolChangesResult(
                snap, None, symbol, "first", None, None, None, None, [], [], None, [], [], ""
            )
        day, previous = snap.snapshot_date, summary["previous_date"]
        stale = change_staleness(conn, summary)
        row = conn.execute(
            sa.select(change_symbols).where(
                change_symbols.c.snapshot_date == day, change_symbols.c.symbol == symbol
            )
        ).first()
        if row is None:
            require_symbol(conn, snap, symbol)  # raises UnknownSymbolError, with suggestions
            raise QueryError(f"no change row for {symbol!r} on {day}: re-materialize the changes")
        info = dict(row._mapping)
        now = None
        if info["previous_cluster_id"] is not None:
            now = conn.execute(
                sa.select(change_clusters.c.cluster_id).where(
                    change_clusters.c.snapshot_date == day,
                    change_clusters.c.previous_cluster_id == info["previous_cluster_id"],
                )
            ).scalar_one_or_none()
        neighbors_today = _neighbors(conn, day, symbol)
        neighbors_before = _neighbors(conn, previous, symbol)
        lead_lag = _lead_lag_rows(conn, day, symbol)
        pins_today, pins_before = _pinned(conn, day), _pinned(conn, previous)
        top_rows = _top_pair_rows(conn, day, symbol)
    moves: list[dict[str, Any]] = []
    source = "matrices"
    if info["status"] == "kept":
        try:
            moves = _moves_from_matrices(
                store or default_store(),
                symbol,
                (day, pins_today),
                (previous, pins_before),
                int((summary["params"] or {}).get("min_overlap", 2)),
                limit,
            )
        except (MatrixStoreError, MatrixUnavailableError, KeyError, ValueError):
            source = "top_moves"  # a matrix is gone: the symbol's rows among the market's top
            moves = _moves_from_top_pairs(top_rows, symbol, limit)
    before = set(neighbors_before)
    today_set = set(neighbors_today)
    return SymbolChangesResult(
        snapshot=snap,
        previous_date=previous,
        symbol=symbol,
        status=info["status"],
        cluster_id=info["cluster_id"],
        previous_cluster_id=info["previous_cluster_id"],
        moved=info["moved"],
        previous_cluster_now=now,
        new_neighbors=[s for s in neighbors_today if s not in before],
        dropped_neighbors=[s for s in neighbors_before if s not in today_set],
        n_neighbors=info["n_neighbors"],
        lead_lag=lead_lag,
        moves=moves,
        moves_source=source,
        stale=stale,
        sessions_between=summary.get("sessions_between"),
    )


def _lead_lag_rows(conn: sa.Connection, day: dt.date, symbol: str) -> list[dict[str, Any]]:
    """The lead-lag changes of ``day`` that involve ``symbol``: appeared, lag changed, vanished
    (in that order), then by leader and lagger."""
    c = change_lead_lag.c
    statement = (
        sa.select(
            c.leader,
            c.lagger,
            c.change,
            c.lag,
            c.previous_lag,
            c.improvement,
            c.previous_improvement,
        )
        .where(c.snapshot_date == day, sa.or_(c.leader == symbol, c.lagger == symbol))
        .order_by(c.change, c.leader, "lagger")  # a-l-v
    )
    return [dict(r._mapping) for r in conn.execute(statement)]


def _top_pair_rows(conn: sa.Connection, day: dt.date, symbol: str) -> list[dict[str, Any]]:
    """The rows of the market's top correlation moves of ``day`` that involve ``symbol``."""
    c = change_pairs.c
    statement = (
        sa.select(change_pairs)
        .where(c.snapshot_date == day, sa.or_(c.symbol_a == symbol, c.symbol_b == symbol))
        .order_by(c.rank)
    )
    return [dict(r._mapping) for r in conn.execute(statement)]


def _moves_from_top_pairs(
    top_rows: list[dict[str, Any]], symbol: str, limit: int | None
) -> list[dict[str, Any]]:
    """The symbol's moves from the market's top pairs (when a matrix is gone), at most
    ``limit``."""
    moves = [
        {
            "other": r["symbol_b"] if r["symbol_a"] == symbol else r["symbol_a"],
            **{k: r[k] for k in ("previous_corr", "corr", "change", "previous_overlap", "overlap")},
        }
        for r in top_rows
    ]
    return moves[: None if limit is None else max(0, int(limit))]
