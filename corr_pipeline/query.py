"""Answers for one symbol from the published snapshot (SPEC §7) and the matrix store (SPEC §8).

Functions (each returns a small result object with ``.to_json()`` and ``.render()``):

``snapshots(engine)``                  the published snapshots, newest first
``peers(engine, symbol, date)``        its top-k neighbors (``peer_neighbors``, SPEC §4)
``cluster(engine, symbol, date)``      its cluster id, the cluster's size and some members
                                       (``symbol_clusters``, SPEC §5)
``lead_lag(engine, symbol, date)``     the lead-lag pairs where it leads or lags
                                       (``lead_lag_pairs``, SPEC §6)
``corr(engine_or_store, a, b, date)``  ``corr[a, b]`` and ``overlap[a, b]`` (SPEC §3) read from the
                                       memory-mapped matrices of the snapshot in the matrix store:
                                       one element each, nothing recomputed

``date=None`` means the latest published snapshot. Every statement uses bound parameters
(SQLAlchemy Core), so symbols are passed and returned verbatim whatever they contain (quotes,
semicolons, spaces, non-ASCII). Lookups go through the primary keys
``(snapshot_date, symbol[, rank])`` / ``(snapshot_date, leader, lagger)``.

Errors are :class:`QueryError` subclasses (exit status 2 on the command line) with a message
that says what to do: an unknown symbol lists close matches (``difflib``; a symbol that has
prices but was dropped from the window is told apart), a date with no snapshot lists the latest
available ones and the nearest earlier one.

The ``corr-pipeline query ...`` subcommands are registered by :func:`add_query_commands`; they
print fixed-width tables, or JSON with ``--json`` (NaN becomes ``null``; on error a JSON object
``{"error": {...}}`` is printed and the exit status is 2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import heapq
import json
import math
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corr_pipeline.db.schema import (
    lead_lag_pairs as t_lead_lag,
)
from corr_pipeline.db.schema import (
    peer_neighbors as t_peers,
)
from corr_pipeline.db.schema import (
    prices as t_prices,
)
from corr_pipeline.db.schema import (
    snapshots as t_snapshots,
)
from corr_pipeline.db.schema import (
    symbol_clusters as t_clusters,
)

__all__ = [
    "CORR_ARRAY",
    "CORR_ASSET",
    "OVERLAP_ARRAY",
    "OVERLAP_ASSET",
    "ClusterResult",
    "CorrResult",
    "LeadLagResult",
    "MatrixUnavailableError",
    "NoSnapshotError",
    "PeersResult",
    "QueryError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotsResult",
    "UnknownSymbolError",
    "add_query_commands",
    "close_matches",
    "cluster",
    "corr",
    "format_table",
    "lead_lag",
    "parse_date",
    "peers",
    "snapshots",
]

#: Where the snapshot's matrices live in the matrix store (``corr_pipeline.defs.assets``):
#: ``<store>/<asset>/<snapshot date>/<array>.npy`` with the symbols in the sidecar labels.
CORR_ASSET, CORR_ARRAY = "correlation_matrix", "corr"
OVERLAP_ASSET, OVERLAP_ARRAY = "overlap_matrix", "overlap"

LATEST_SHOWN = 5  # dates listed when a requested date has no snapshot


def _consistent_read(engine: sa.Engine) -> sa.Connection:
    """A connection whose statements all read ONE snapshot of the database (REPEATABLE READ:
    PostgreSQL takes the snapshot at the first statement and keeps it until the block ends).

    A query answers with several statements (resolve the snapshot date, check the symbol, read
    its rows); under the default READ COMMITTED a publication or a withdrawal committing between
    them would pair the old ``snapshots`` row with the new rows, or report a symbol of a
    snapshot that was just replaced as missing from it. SPEC §7: readers never see a mix.
    """
    return engine.connect().execution_options(isolation_level="REPEATABLE READ")


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------


class QueryError(Exception):
    """A question the snapshot cannot answer as asked; ``exit_code`` 2, ``kind`` for JSON."""

    exit_code = 2
    kind = "query_error"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "message": str(self)}


class NoSnapshotError(QueryError):
    """Nothing has been published yet."""

    kind = "no_snapshot"


class SnapshotNotFoundError(QueryError):
    """No snapshot for the requested date; ``latest`` lists the newest available dates."""

    kind = "snapshot_not_found"

    def __init__(
        self,
        requested: dt.date,
        latest: Sequence[dt.date],
        nearest_earlier: dt.date | None,
        total: int,
    ) -> None:
        self.requested = requested
        self.latest = list(latest)
        self.nearest_earlier = nearest_earlier
        self.total = total
        if not total:
            text = f"no snapshot for {requested}: nothing has been published yet"
        else:
            shown = ", ".join(d.isoformat() for d in self.latest)
            more = f" (of {total:,})" if total > len(self.latest) else ""
            text = f"no snapshot for {requested}; latest snapshots{more}: {shown}"
            if nearest_earlier is not None and nearest_earlier not in self.latest[:1]:
                text += f"; nearest earlier: {nearest_earlier}"
            elif nearest_earlier is None:
                text += f"; none is earlier than {requested}"
        super().__init__(text)

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "requested": self.requested.isoformat(),
            "latest": [d.isoformat() for d in self.latest],
            "nearest_earlier": _iso(self.nearest_earlier),
            "available": self.total,
        }


class UnknownSymbolError(QueryError):
    """The symbol is not in the snapshot; ``suggestions`` are close matches, ``has_prices``
    tells a dropped symbol (prices exist, SPEC §2 dropped it) from an unknown one."""

    kind = "unknown_symbol"

    def __init__(
        self,
        symbol: str,
        snapshot: Snapshot | None,
        suggestions: Sequence[str],
        *,
        has_prices: bool = False,
        where: str | None = None,
    ) -> None:
        self.symbol = symbol
        self.snapshot_date = snapshot.snapshot_date if snapshot else None
        self.suggestions = list(suggestions)
        self.has_prices = has_prices
        place = where or (
            f"the snapshot of {snapshot.snapshot_date} ({snapshot.n_symbols:,} symbols)"
            if snapshot
            else "the snapshot"
        )
        if has_prices:
            min_history = (snapshot.params.get("min_history_days") if snapshot else None) or "?"
            text = (
                f"symbol {_quote(symbol)} is not in {place}: it has prices but was dropped from "
                f"the window (fewer than min_history_days={min_history} finite returns, or zero "
                "variance; see the dropped_symbols metadata of returns_matrix)"
            )
        else:
            text = f"unknown symbol {_quote(symbol)}: not in {place}"
        if self.suggestions:
            text += "; did you mean " + ", ".join(_quote(s) for s in self.suggestions) + "?"
        super().__init__(text)

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "symbol": self.symbol,
            "snapshot_date": _iso(self.snapshot_date),
            "suggestions": self.suggestions,
            "has_prices": self.has_prices,
        }


class MatrixUnavailableError(QueryError):
    """The snapshot's correlation matrix is not in the matrix store."""

    kind = "matrix_unavailable"


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    """A symbol in a message: double-quoted, inner quotes/control characters escaped, non-ASCII
    kept."""
    return json.dumps(text, ensure_ascii=False)


def _iso(day: dt.date | None) -> str | None:
    return None if day is None else day.isoformat()


def parse_date(value: dt.date | str | None) -> dt.date | None:
    """``None``/``"latest"`` → None (latest snapshot); a ``date`` or ``YYYY-MM-DD`` string → date."""
    if value is None or isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.datetime):
        return value.date()
    text = str(value).strip()
    if text.lower() in ("", "latest"):
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise QueryError(
            f"--date: expected a date YYYY-MM-DD (or 'latest'), got {_quote(text)}"
        ) from None


def _json_float(value: Any) -> float | None:
    """float32 values (``real`` columns, the matrix) as their shortest exact decimal; NaN → None."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    import numpy as np

    return float(str(np.float32(value)))


def _fmt(value: Any, spec: str = "+.4f") -> str:
    if value is None:
        return "NaN"
    value = float(value)
    return "NaN" if math.isnan(value) else format(value, spec)


def _display_width(text: str) -> int:
    """Terminal columns of ``text`` (East Asian wide/full-width characters count 2)."""
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _printable(text: str) -> str:
    """Control characters (newline, tab, ...) shown escaped so a table stays one line per row."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str) -> str:
    """Fixed-width table: ``align`` has one ``l``/``r`` per column; two spaces between columns.

    Cells are ``str()``-ed and shown verbatim (control characters escaped); widths count
    wide characters as two columns.
    """
    cells = [[_printable(str(c)) for c in row] for row in rows]
    widths = [_display_width(h) for h in headers]
    for row in cells:
        for k, c in enumerate(row):
            widths[k] = max(widths[k], _display_width(c))

    def line(values: Sequence[str]) -> str:
        parts = []
        for k, v in enumerate(values):
            pad = " " * (widths[k] - _display_width(v))
            parts.append(pad + v if align[k] == "r" else v + pad)
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


# --------------------------------------------------------------------------------------------
# snapshots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One row of ``snapshots`` (SPEC §7)."""

    snapshot_date: dt.date
    as_of_trade_date: dt.date
    n_symbols: int
    n_dropped: int
    lookback_days: int
    params: dict[str, Any]
    created_at: dt.datetime | None = None

    def describe(self) -> str:
        return (
            f"snapshot {self.snapshot_date} (as of {self.as_of_trade_date}, "
            f"{self.n_symbols:,} symbols, {self.lookback_days}-day window)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot_date": self.snapshot_date.isoformat(),
            "as_of_trade_date": self.as_of_trade_date.isoformat(),
            "n_symbols": self.n_symbols,
            "n_dropped": self.n_dropped,
            "lookback_days": self.lookback_days,
        }


_SNAPSHOT_COLUMNS = (
    t_snapshots.c.snapshot_date,
    t_snapshots.c.as_of_trade_date,
    t_snapshots.c.n_symbols,
    t_snapshots.c.n_dropped,
    t_snapshots.c.lookback_days,
    t_snapshots.c.params,
    t_snapshots.c.created_at,
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
    )


def _latest_dates(conn: sa.Connection, limit: int = LATEST_SHOWN) -> list[dt.date]:
    rows = conn.execute(
        sa.select(t_snapshots.c.snapshot_date)
        .order_by(t_snapshots.c.snapshot_date.desc())
        .limit(limit)
    )
    return [r[0] for r in rows]


def _resolve_snapshot(conn: sa.Connection, date: dt.date | str | None) -> Snapshot:
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


@dataclass
class SnapshotsResult:
    """The newest published snapshots (``limit`` of ``total``)."""

    snapshots: list[Snapshot]
    total: int

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "snapshots",
            "total": self.total,
            "snapshots": [s.to_json() for s in self.snapshots],
        }

    def render(self) -> str:
        if not self.snapshots:
            return "no snapshot has been published yet"
        head = f"{self.total:,} snapshot(s) published" + (
            f", newest {len(self.snapshots)} shown" if self.total > len(self.snapshots) else ""
        )
        table = format_table(
            ["snapshot_date", "as_of_trade_date", "symbols", "dropped", "lookback", "created_at"],
            [
                [
                    s.snapshot_date,
                    s.as_of_trade_date,
                    f"{s.n_symbols:,}",
                    f"{s.n_dropped:,}",
                    s.lookback_days,
                    s.created_at.strftime("%Y-%m-%d %H:%M") if s.created_at else "",
                ]
                for s in self.snapshots
            ],
            "llrrrl",
        )
        return head + "\n" + table


def snapshots(engine: sa.Engine, *, limit: int | None = 10) -> SnapshotsResult:
    """The ``limit`` newest published snapshots (None = all) and how many exist."""
    with _consistent_read(engine) as conn:
        query = sa.select(*_SNAPSHOT_COLUMNS).order_by(t_snapshots.c.snapshot_date.desc())
        if limit is not None:
            query = query.limit(max(1, int(limit)))
        rows = conn.execute(query)
        found = [_snapshot_from_row(r) for r in rows]
        total = conn.execute(sa.select(sa.func.count()).select_from(t_snapshots)).scalar_one()
    return SnapshotsResult(found, int(total))


# --------------------------------------------------------------------------------------------
# symbol checks and suggestions
# --------------------------------------------------------------------------------------------


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def close_matches(
    word: str, candidates: Sequence[str], n: int = 5, cutoff: float = 0.6
) -> list[str]:
    """The ``n`` candidates with the highest ``difflib.SequenceMatcher`` ratio to ``word``
    (``>= cutoff``), ties broken by the longer common prefix, then by name.

    Same scores as ``difflib.get_close_matches``, computed with an exact bound: candidates are
    visited by decreasing ``quick_ratio()`` (an upper bound of ``ratio()``) and the scan stops
    once that bound falls below the n-th best ratio, so the quadratic ``ratio()`` runs on a
    handful of names instead of all of them (24,000 symbols: ~0.3 s instead of ~0.9 s worst case).
    """
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(word)
    bounded: list[tuple[float, str]] = []
    for cand in candidates:
        matcher.set_seq1(cand)
        if matcher.real_quick_ratio() >= cutoff:
            upper = matcher.quick_ratio()
            if upper >= cutoff:
                bounded.append((upper, cand))
    bounded.sort(key=lambda item: -item[0])
    scored: list[tuple[float, str]] = []
    best: list[float] = []  # min-heap of the n best ratios so far
    for upper, cand in bounded:
        if len(best) >= n and upper < best[0]:
            break
        matcher.set_seq1(cand)
        ratio = matcher.ratio()
        if ratio >= cutoff:
            scored.append((ratio, cand))
            if len(best) < n:
                heapq.heappush(best, ratio)
            elif ratio > best[0]:
                heapq.heapreplace(best, ratio)
    scored.sort(key=lambda item: (-item[0], -_common_prefix(word, item[1]), item[1]))
    return [cand for _, cand in scored[:n]]


def suggest_symbols(symbol: str, candidates: Sequence[str], n: int = 5) -> list[str]:
    """Close matches of ``symbol`` among ``candidates``: the same text ignoring case first,
    then :func:`close_matches` of the text as typed and, if different, upper-cased."""
    folded = symbol.casefold()
    out = [c for c in candidates if c.casefold() == folded and c != symbol]
    probes = [symbol] if symbol == symbol.upper() else [symbol, symbol.upper()]
    for probe in probes:
        for match in close_matches(probe, candidates, n=n):
            if match not in out and match != symbol:
                out.append(match)
    return out[:n]


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


def _require_symbol(conn: sa.Connection, snap: Snapshot, symbol: str) -> None:
    """Raise :class:`UnknownSymbolError` unless ``symbol`` is in the snapshot (PK lookups)."""
    day = snap.snapshot_date
    in_clusters = sa.exists().where(
        t_clusters.c.snapshot_date == day, t_clusters.c.symbol == symbol
    )
    in_peers = sa.exists().where(t_peers.c.snapshot_date == day, t_peers.c.symbol == symbol)
    if conn.execute(sa.select(sa.or_(in_clusters, in_peers))).scalar_one():
        return
    has_prices = conn.execute(
        sa.select(sa.exists().where(t_prices.c.symbol == symbol))
    ).scalar_one()
    candidates = _snapshot_symbols(conn, day)
    raise UnknownSymbolError(
        symbol, snap, suggest_symbols(symbol, candidates), has_prices=bool(has_prices)
    )


# --------------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------------


@dataclass
class PeersResult:
    """Top-k neighbors of ``symbol`` (SPEC §4), rank 1 first."""

    snapshot: Snapshot
    symbol: str
    cluster_id: int | None
    peers: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "peers",
            **self.snapshot.to_json(),
            "symbol": self.symbol,
            "cluster_id": self.cluster_id,
            "peers": [
                {
                    "rank": p["rank"],
                    "neighbor": p["neighbor"],
                    "corr": _json_float(p["corr"]),
                    "overlap": p["overlap"],
                    "neighbor_cluster_id": p["neighbor_cluster_id"],
                }
                for p in self.peers
            ],
        }

    def render(self) -> str:
        head = f"peers of {_printable(self.symbol)} in {self.snapshot.describe()}"
        if not self.peers:
            return head + "\n(no neighbor with a defined correlation)"
        rows = [
            [
                p["rank"],
                p["neighbor"],
                _fmt(p["corr"]),
                p["overlap"],
                "yes"
                if self.cluster_id is not None and p["neighbor_cluster_id"] == self.cluster_id
                else "",
            ]
            for p in self.peers
        ]
        return (
            head
            + "\n"
            + format_table(["rank", "neighbor", "corr", "overlap", "same cluster"], rows, "rlrrl")
        )


def peers(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    limit: int | None = None,
) -> PeersResult:
    """Neighbors of ``symbol`` by ``|corr|`` (``peer_neighbors``, SPEC §4), rank ascending.

    Each peer: rank, neighbor, corr (signed), overlap, and the neighbor's cluster id.
    """
    with _consistent_read(engine) as conn:
        snap = _resolve_snapshot(conn, date)
        _require_symbol(conn, snap, symbol)
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


# --------------------------------------------------------------------------------------------
# cluster
# --------------------------------------------------------------------------------------------


@dataclass
class ClusterResult:
    """The cluster of ``symbol`` (SPEC §5)."""

    snapshot: Snapshot
    symbol: str
    cluster_id: int
    size: int
    n_clusters: int
    members: list[str]
    peers_in_cluster: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "cluster",
            **self.snapshot.to_json(),
            "symbol": self.symbol,
            "cluster_id": self.cluster_id,
            "size": self.size,
            "n_clusters": self.n_clusters,
            "members": self.members,
            "members_truncated": len(self.members) < self.size,
            "peers_in_cluster": [
                {"rank": p["rank"], "neighbor": p["neighbor"], "corr": _json_float(p["corr"])}
                for p in self.peers_in_cluster
            ],
        }

    def render(self) -> str:
        lines = [
            f"cluster of {_printable(self.symbol)} in {self.snapshot.describe()}",
            f"cluster id {self.cluster_id} of {self.n_clusters:,}: {self.size:,} member(s)",
        ]
        if self.peers_in_cluster:
            lines.append("its nearest peers in the same cluster:")
            lines.append(
                format_table(
                    ["rank", "neighbor", "corr"],
                    [[p["rank"], p["neighbor"], _fmt(p["corr"])] for p in self.peers_in_cluster],
                    "rlr",
                )
            )
        shown = len(self.members)
        label = "members" if shown == self.size else f"members (first {shown:,}, by symbol)"
        lines.append(f"{label}:")
        lines.extend(f"  {_printable(m)}" for m in self.members)
        return "\n".join(lines)


def cluster(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    members: int | None = 20,
) -> ClusterResult:
    """Cluster id of ``symbol``, the cluster's size, the number of clusters, its first
    ``members`` members by symbol (None = all) and its top-k peers that share the cluster."""
    with _consistent_read(engine) as conn:
        snap = _resolve_snapshot(conn, date)
        _require_symbol(conn, snap, symbol)
        day = snap.snapshot_date
        cluster_id = conn.execute(
            sa.select(t_clusters.c.cluster_id).where(
                t_clusters.c.snapshot_date == day, t_clusters.c.symbol == symbol
            )
        ).scalar_one_or_none()
        if cluster_id is None:
            raise QueryError(
                f"{_quote(symbol)} has no cluster in the snapshot of {day} "
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


# --------------------------------------------------------------------------------------------
# lead-lag
# --------------------------------------------------------------------------------------------


@dataclass
class LeadLagResult:
    """Lead-lag pairs (SPEC §6) in which ``symbol`` is the leader or the lagger, by improvement."""

    snapshot: Snapshot
    symbol: str
    pairs: list[dict[str, Any]]
    n_leads: int  # pairs of the snapshot with leader = symbol (all, not only those listed)
    n_lags: int  # pairs with lagger = symbol

    @property
    def truncated(self) -> bool:
        return len(self.pairs) < self.n_leads + self.n_lags

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "lead-lag",
            **self.snapshot.to_json(),
            "symbol": self.symbol,
            "n_leads": self.n_leads,
            "n_lags": self.n_lags,
            "truncated": self.truncated,
            "pairs": [
                {
                    "role": "leads" if p["leader"] == self.symbol else "lags",
                    "leader": p["leader"],
                    "lagger": p["lagger"],
                    "lag": p["lag"],
                    "lagged_corr": _json_float(p["lagged_corr"]),
                    "sync_corr": _json_float(p["sync_corr"]),
                    "improvement": _json_float(p["improvement"]),
                    "overlap": p["overlap"],
                }
                for p in self.pairs
            ],
        }

    def render(self) -> str:
        head = (
            f"lead-lag pairs of {_printable(self.symbol)} in {self.snapshot.describe()}: "
            f"leads {self.n_leads}, lags {self.n_lags}"
        )
        if not self.pairs:
            return head + "\n(no lead-lag pair involves this symbol)"
        rows = [
            [
                "leads" if p["leader"] == self.symbol else "lags",
                p["leader"],
                p["lagger"],
                p["lag"],
                _fmt(p["lagged_corr"]),
                _fmt(p["sync_corr"]),
                _fmt(p["improvement"], ".4f"),
                p["overlap"],
            ]
            for p in self.pairs
        ]
        return (
            head
            + "\n"
            + format_table(
                [
                    "role",
                    "leader",
                    "lagger",
                    "lag",
                    "lagged_corr",
                    "sync_corr",
                    "improvement",
                    "overlap",
                ],
                rows,
                "lllrrrrr",
            )
            + "\n(leader's return on day t vs lagger's on day t + lag)"
            + (
                f"\nshowing the {len(self.pairs)} strongest of {self.n_leads + self.n_lags} "
                "pairs; --limit 0 lists all"
                if self.truncated
                else ""
            )
        )


def lead_lag(
    engine: sa.Engine,
    symbol: str,
    date: dt.date | str | None = None,
    *,
    limit: int | None = None,
) -> LeadLagResult:
    """Pairs with ``leader = symbol`` or ``lagger = symbol``, by improvement descending (then
    leader, lagger), at most ``limit``."""
    with _consistent_read(engine) as conn:
        snap = _resolve_snapshot(conn, date)
        _require_symbol(conn, snap, symbol)
        query = (
            sa.select(
                t_lead_lag.c.leader,
                t_lead_lag.c.lagger,
                t_lead_lag.c.lag,
                t_lead_lag.c.lagged_corr,
                t_lead_lag.c.sync_corr,
                t_lead_lag.c.improvement,
                t_lead_lag.c.overlap,
            )
            .where(
                t_lead_lag.c.snapshot_date == snap.snapshot_date,
                sa.or_(t_lead_lag.c.leader == symbol, t_lead_lag.c.lagger == symbol),
            )
            .order_by(t_lead_lag.c.improvement.desc(), t_lead_lag.c.leader, t_lead_lag.c.lagger)
        )
        if limit is not None:
            query = query.limit(max(0, int(limit)))
        rows = [dict(r._mapping) for r in conn.execute(query)]
        n_leads, n_lags = conn.execute(
            sa.select(
                sa.func.count().filter(t_lead_lag.c.leader == symbol),
                sa.func.count().filter(t_lead_lag.c.lagger == symbol),
            ).where(
                t_lead_lag.c.snapshot_date == snap.snapshot_date,
                sa.or_(t_lead_lag.c.leader == symbol, t_lead_lag.c.lagger == symbol),
            )
        ).one()
    return LeadLagResult(snap, symbol, rows, int(n_leads), int(n_lags))


# --------------------------------------------------------------------------------------------
# corr (matrix store)
# --------------------------------------------------------------------------------------------


@dataclass
class CorrResult:
    """``corr[a, b]`` and ``overlap[a, b]`` of one snapshot, read from the matrix store."""

    snapshot_date: dt.date
    a: str
    b: str
    corr: float
    overlap: int | None
    min_overlap: int | None
    index_a: int
    index_b: int
    n_symbols: int
    published: bool
    path: Path

    @property
    def reason(self) -> str | None:
        """Why the correlation is undefined (SPEC §3), or None when it is a number."""
        if math.isfinite(self.corr):
            return None
        if self.overlap is not None and self.min_overlap is not None:
            if self.overlap < self.min_overlap:
                return (
                    f"only {self.overlap} common returns, fewer than min_overlap={self.min_overlap}"
                )
            return "zero variance of one of the two series over their common returns"
        return "undefined (NaN)"

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "corr",
            "snapshot_date": self.snapshot_date.isoformat(),
            "a": self.a,
            "b": self.b,
            "corr": _json_float(self.corr),
            "overlap": self.overlap,
            "min_overlap": self.min_overlap,
            "undefined_reason": self.reason,
            "published": self.published,
        }

    def render(self) -> str:
        value = _fmt(self.corr, "+.6f")
        lines = [
            f"corr({_printable(self.a)}, {_printable(self.b)}) = {value} on "
            f"{self.overlap if self.overlap is not None else '?'} common returns "
            f"(snapshot {self.snapshot_date}, {self.n_symbols:,} symbols)"
        ]
        if self.reason:
            lines.append(f"undefined: {self.reason}")
        if not self.published:
            lines.append(
                "note: this snapshot's matrices exist in the store but the snapshot is not "
                "published in the database (its later steps did not complete)"
            )
        return "\n".join(lines)


def _symbol_index(symbols: Sequence[str], symbol: str) -> int | None:
    """Position of ``symbol`` in the sidecar's symbol list: bisect (the list is sorted by code
    point, SPEC §2), with a linear scan as the fallback should a list not be sorted."""
    import bisect

    i = bisect.bisect_left(symbols, symbol)
    if i < len(symbols) and symbols[i] == symbol:
        return i
    try:
        return list(symbols).index(symbol)
    except ValueError:
        return None


def _store_partitions(store: Any) -> list[str]:
    return [p for p in store.partitions(CORR_ASSET) if store.exists(CORR_ASSET, p, CORR_ARRAY)]


def corr(
    source: Any,
    a: str,
    b: str,
    date: dt.date | str | None = None,
    *,
    store: Any = None,
) -> CorrResult:
    """``corr[a, b]`` and ``overlap[a, b]`` of a snapshot (SPEC §3), read from the store.

    ``source`` is a SQLAlchemy engine (the snapshot date is resolved among the published
    snapshots; a date whose matrices are in the store but that was never published is still
    answered, flagged ``published=False``) or a :class:`~corr_pipeline.store.MatrixStore`
    (dates from the store only). ``store`` defaults to the project's store
    (``$CORR_PIPELINE_STORE_DIR`` or ``$CORR_PIPELINE_HOME/store``).

    Cost: one sidecar read (the symbol list) per matrix and one element read from each
    memory-mapped ``.npy`` — nothing is recomputed and no row is loaded.
    """
    from corr_pipeline import settings
    from corr_pipeline.store.matrix_store import (
        MatrixNotFoundError,
        MatrixStore,
        MatrixStoreError,
    )

    engine = None
    if isinstance(source, MatrixStore):
        store = source
    elif isinstance(source, sa.Engine):
        engine = source
    elif source is not None:
        raise TypeError(f"source must be an Engine or a MatrixStore, got {type(source).__name__}")
    if store is None:
        base = settings.store_dir()
        if not base.is_dir():
            raise MatrixUnavailableError(
                f"the matrix store {base} does not exist: no correlation matrix has been "
                "computed with this CORR_PIPELINE_HOME / CORR_PIPELINE_STORE_DIR"
            )
        store = MatrixStore(base, create=False)

    day = parse_date(date)
    published = False
    snap: Snapshot | None = None
    if engine is not None:
        with _consistent_read(engine) as conn:
            try:
                snap = _resolve_snapshot(conn, day)
                published = True
            except (NoSnapshotError, SnapshotNotFoundError) as exc:
                # matrices computed but not (yet) published are still answerable
                keys = _store_partitions(store)
                key = day.isoformat() if day else (keys[-1] if keys else None)
                if key is None or key not in keys:
                    raise exc from None
                day = dt.date.fromisoformat(key)
    if snap is not None:
        day = snap.snapshot_date
    if day is None:
        keys = _store_partitions(store)
        if not keys:
            raise NoSnapshotError(
                f"no correlation matrix in the matrix store {store.base_dir}: materialize "
                "correlation_matrix first (see docs/user_guide.md)"
            )
        day = dt.date.fromisoformat(keys[-1])
    partition = day.isoformat()
    try:
        stored = store.load(CORR_ASSET, partition, CORR_ARRAY)
    except MatrixNotFoundError:
        if engine is None:
            keys = _store_partitions(store)
            latest = [dt.date.fromisoformat(k) for k in reversed(keys)][:LATEST_SHOWN]
            earlier = max((d for d in latest if d < day), default=None)
            raise SnapshotNotFoundError(day, latest, earlier, len(keys)) from None
        raise MatrixUnavailableError(
            f"the snapshot of {day} is published but its correlation matrix is not in the "
            f"matrix store {store.base_dir} ({CORR_ASSET}/{partition}/{CORR_ARRAY}.npy): was "
            "the store cleaned up, or does CORR_PIPELINE_STORE_DIR point elsewhere? "
            f"Re-materialize {CORR_ASSET} for {partition}"
        ) from None
    except MatrixStoreError as exc:
        raise MatrixUnavailableError(f"cannot read the correlation matrix: {exc}") from None
    symbols = stored.labels.get("symbols")
    if not isinstance(symbols, list) or len(symbols) != stored.array.shape[0]:
        raise MatrixUnavailableError(
            f"{stored.path}: its sidecar has no symbol list matching the matrix shape "
            f"{stored.array.shape}"
        )
    index = {}
    for name in (a, b):
        i = _symbol_index(symbols, name)
        if i is None:
            raise UnknownSymbolError(
                name,
                snap,
                suggest_symbols(name, symbols),
                where=f"the correlation matrix of {day} ({len(symbols):,} symbols)",
            )
        index[name] = i
    ia, ib = index[a], index[b]
    value = float(stored.array[ia, ib])
    overlap_value: int | None = None
    try:
        stored_overlap = store.load(OVERLAP_ASSET, partition, OVERLAP_ARRAY)
    except MatrixStoreError:
        stored_overlap = None
    if stored_overlap is not None and stored_overlap.labels.get("symbols") == symbols:
        overlap_value = int(stored_overlap.array[ia, ib])
    min_overlap = stored.params.get("min_overlap")
    if min_overlap is None and snap is not None:
        min_overlap = snap.params.get("min_overlap")
    return CorrResult(
        snapshot_date=day,
        a=a,
        b=b,
        corr=value,
        overlap=overlap_value,
        min_overlap=None if min_overlap is None else int(min_overlap),
        index_a=ia,
        index_b=ib,
        n_symbols=len(symbols),
        published=published,
        path=stored.path,
    )


# --------------------------------------------------------------------------------------------
# command line: corr-pipeline query ...
# --------------------------------------------------------------------------------------------


def _limit(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return None if value == 0 else value


def _emit(result: Any, as_json: bool, out: Any) -> None:
    if as_json:
        out.write(json.dumps(result.to_json(), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(result.render() + "\n")
    out.flush()


def run_query(
    args: argparse.Namespace,
    *,
    engine_factory: Callable[[], sa.Engine] | None = None,
    out: Any = None,
    err: Any = None,
) -> int:
    """Run one ``query`` subcommand; prints the result (table or JSON) and returns the exit
    status (0, or 2 for a :class:`QueryError`, whose message goes to stderr — and, with
    ``--json``, also to stdout as ``{"error": {...}}``)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if engine_factory is None:
        from corr_pipeline.db.engine import get_engine
        from corr_pipeline.db.schema import init_schema

        def engine_factory() -> sa.Engine:
            engine = get_engine()
            init_schema(engine)  # idempotent; a fresh database answers "nothing published"
            return engine

    try:
        engine = engine_factory()
        what = args.query_command
        if what == "snapshots":
            result: Any = snapshots(engine, limit=args.limit)
        elif what == "peers":
            result = peers(engine, args.symbol, args.date, limit=args.limit)
        elif what == "cluster":
            result = cluster(engine, args.symbol, args.date, members=args.members)
        elif what == "lead-lag":
            result = lead_lag(engine, args.symbol, args.date, limit=args.limit)
        elif what == "corr":
            result = corr(engine, args.a, args.b, args.date)
        else:  # pragma: no cover - argparse restricts the choices
            raise QueryError(f"unknown query {what!r}")
    except QueryError as exc:
        if getattr(args, "json", False):
            out.write(json.dumps({"error": exc.to_json()}, ensure_ascii=False, indent=2) + "\n")
            out.flush()
        err.write(f"corr-pipeline query: {exc}\n")
        err.flush()
        return exc.exit_code
    _emit(result, getattr(args, "json", False), out)
    return 0


def add_query_commands(
    commands: Any, *, engine_factory: Callable[[], sa.Engine] | None = None
) -> None:
    """Register ``query snapshots|peers|cluster|lead-lag|corr`` on the ``corr-pipeline``
    sub-command parser ``commands`` (each sets ``func`` to a handler returning the exit code)."""

    def handler(args: argparse.Namespace) -> int:
        return run_query(args, engine_factory=engine_factory)

    query = commands.add_parser(
        "query",
        help="answers for one symbol from the published snapshot (peers, cluster, lead-lag, corr)",
        description="Query the published correlation snapshot. Tables for humans, --json for "
        "scripts. Exit status 2 for an unknown symbol or a date without a snapshot.",
    )
    sub = query.add_subparsers(dest="query_command", metavar="QUERY", required=True)

    def common(p: argparse.ArgumentParser, *, date: bool = True) -> argparse.ArgumentParser:
        if date:
            p.add_argument(
                "--date",
                default=None,
                metavar="D",
                help="snapshot date YYYY-MM-DD (default: the latest snapshot)",
            )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(func=handler)
        return p

    p = common(sub.add_parser("snapshots", help="list the newest published snapshots"), date=False)
    p.add_argument(
        "--limit", type=_limit, default=10, metavar="N", help="how many (default 10, 0 = all)"
    )

    p = common(sub.add_parser("peers", help="a symbol's strongest |corr| neighbors"))
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument("--limit", type=_limit, default=None, metavar="N", help="at most N (0 = all)")

    p = common(sub.add_parser("cluster", help="a symbol's cluster: id, size, members"))
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument(
        "--members",
        type=_limit,
        default=20,
        metavar="N",
        help="list the first N members by symbol (default 20, 0 = all)",
    )

    p = common(sub.add_parser("lead-lag", help="pairs where a symbol leads or lags"))
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="the N strongest by improvement (default 20, 0 = all)",
    )

    p = common(
        sub.add_parser(
            "corr",
            help="corr and overlap of two symbols, read from the stored matrix (not recomputed)",
        )
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
