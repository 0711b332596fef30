"""The typed answers of the query layer and their JSON form.

Each answer is a dataclass produced by :mod:`corr_pipeline.query.published` (rows of the
published tables, SPEC §7) or :mod:`corr_pipeline.query.matrix` (elements of the matrix store,
SPEC §8). ``to_json()`` is its machine-readable form: dates as ``YYYY-MM-DD``, float32 values as
their shortest exact decimal, NaN as ``null``. The text for humans is
:func:`corr_pipeline.query.render.to_text`.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from corr_pipeline.db.schema import DRIFT_COLUMNS
from corr_pipeline.snapshot import direction

__all__ = [
    "Answer",
    "ChangesResult",
    "ClusterResult",
    "CorrResult",
    "LeadLagResult",
    "PeersResult",
    "QualityResult",
    "Snapshot",
    "SnapshotsResult",
    "SymbolChangesResult",
]


def _json_float(value: Any) -> float | None:
    """float32 values (``real`` columns, the matrix) as their shortest exact decimal; NaN → None."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(str(np.float32(value)))


def _json_double(value: Any) -> float | None:
    """float64 values (``double precision`` columns: p- and q-values) as they are; NULL or
    NaN → None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


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
    #: matrix-store versions the snapshot pins, ``{asset: {array: version}}`` (SPEC §8); None
    #: when it recorded none (published without a store, or before versions were recorded)
    matrix_versions: dict[str, dict[str, str]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot_date": self.snapshot_date.isoformat(),
            "as_of_trade_date": self.as_of_trade_date.isoformat(),
            "n_symbols": self.n_symbols,
            "n_dropped": self.n_dropped,
            "lookback_days": self.lookback_days,
        }


@dataclass
class SnapshotsResult:
    """The newest published snapshots, newest first (``snapshots``), of ``total`` published."""

    snapshots: list[Snapshot]
    total: int

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "snapshots",
            "total": self.total,
            "snapshots": [s.to_json() for s in self.snapshots],
        }


@dataclass
class PeersResult:
    """Top-k neighbors of ``symbol`` (SPEC §4), rank 1 first.

    Each peer is a row ``{rank, neighbor, corr, overlap, neighbor_cluster_id}`` of
    ``peer_neighbors`` with the neighbor's cluster id from ``symbol_clusters``; ``cluster_id``
    is the symbol's own cluster (None when the snapshot has no cluster row for it).
    """

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


@dataclass
class ClusterResult:
    """The cluster of ``symbol`` (SPEC §5): its id, size, the number of clusters of the
    snapshot, the first members by symbol (``members``, possibly truncated) and the symbol's
    top-k peers (``{rank, neighbor, corr}``) that share the cluster."""

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


@dataclass
class LeadLagResult:
    """Lead-lag pairs (SPEC §6) in which ``symbol`` is the leader or the lagger, by improvement.

    ``pairs`` are rows of ``lead_lag_pairs`` (``p_value``/``q_value``: the Šidák p-value of the
    best lag and its Benjamini–Hochberg q-value, SPEC §6 "Significance"; None in a snapshot
    published before they were recorded; ``reverse_lag``, ``reverse_lagged_corr``,
    ``reverse_q_value``: the reverse pair ``(lagger, leader)``'s best lag, its lagged
    correlation and q-value, SPEC §6 "Direction", None when it has no best lag or the snapshot
    was published before the direction was recorded). ``max_q``: only pairs with
    ``q_value <= max_q`` are answered (None: all). ``two_way_max_q``: the threshold of the
    direction, ``max_q`` when given, else the snapshot's ``max_q_value``; a pair is two-way when
    its ``reverse_q_value <= two_way_max_q`` (:meth:`two_way`). ``direction_recorded``: whether
    the snapshot recorded the reverse direction (False for one published before schema revision
    0008: its pairs' direction is unknown, never one-way). ``one_way``: only the pairs known to
    be one-way are answered. ``n_leads``/``n_lags`` count all the snapshot's pairs with
    ``leader = symbol``/``lagger = symbol`` that pass ``max_q`` and ``one_way``, listed or not,
    ``n_two_way`` the two-way ones among them; ``n_without_q`` those left out by ``max_q``
    because they have no q-value, ``n_unknown_direction`` those left out by ``one_way`` because
    their direction is unknown.
    """

    snapshot: Snapshot
    symbol: str
    pairs: list[dict[str, Any]]
    n_leads: int
    n_lags: int
    max_q: float | None = None
    n_without_q: int = 0
    two_way_max_q: float = 1.0
    direction_recorded: bool = True
    one_way: bool = False
    n_two_way: int = 0
    n_unknown_direction: int = 0

    @property
    def truncated(self) -> bool:
        """Whether ``pairs`` lists fewer than all the symbol's pairs."""
        return len(self.pairs) < self.n_leads + self.n_lags

    def role(self, pair: dict[str, Any]) -> str:
        """``"leads"`` when ``symbol`` is the pair's leader, else ``"lags"``."""
        return "leads" if pair["leader"] == self.symbol else "lags"

    def two_way(self, pair: dict[str, Any]) -> bool | None:
        """Whether ``pair`` is two-way: its reverse pair has a best lag with
        ``reverse_q_value <= two_way_max_q`` (:func:`corr_pipeline.snapshot.direction.is_two_way`);
        False when the reverse pair has none; None (unknown) when the snapshot did not record the
        reverse direction."""
        if pair["reverse_lag"] is None:
            return False if self.direction_recorded else None
        return bool(
            direction.is_two_way(pair["reverse_lag"], pair["reverse_q_value"], self.two_way_max_q)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "lead-lag",
            **self.snapshot.to_json(),
            "symbol": self.symbol,
            "max_q": self.max_q,
            "two_way_max_q": self.two_way_max_q,
            "one_way": self.one_way,
            "direction_recorded": self.direction_recorded,
            "n_leads": self.n_leads,
            "n_lags": self.n_lags,
            "n_two_way": self.n_two_way,
            "n_without_q": self.n_without_q,
            "n_unknown_direction": self.n_unknown_direction,
            "truncated": self.truncated,
            "pairs": [
                {
                    "role": self.role(p),
                    "leader": p["leader"],
                    "lagger": p["lagger"],
                    "lag": p["lag"],
                    "lagged_corr": _json_float(p["lagged_corr"]),
                    "sync_corr": _json_float(p["sync_corr"]),
                    "improvement": _json_float(p["improvement"]),
                    "overlap": p["overlap"],
                    "p_value": _json_double(p["p_value"]),
                    "q_value": _json_double(p["q_value"]),
                    "reverse_lag": p["reverse_lag"],
                    "reverse_lagged_corr": _json_float(p["reverse_lagged_corr"]),
                    "reverse_q_value": _json_double(p["reverse_q_value"]),
                    "two_way": self.two_way(p),
                }
                for p in self.pairs
            ],
        }


@dataclass
class CorrResult:
    """``corr[a, b]`` and ``overlap[a, b]`` of one snapshot (SPEC §3), read from the matrix
    store (SPEC §8): ``index_a``/``index_b`` are the symbols' positions in the matrix of
    ``n_symbols``, ``path`` its file; ``overlap`` is None when no overlap matrix with the same
    symbols is stored. ``published`` is False for matrices whose snapshot is not published.
    ``versions``: the store versions read, ``{"corr": ..., "overlap": ...}`` (for a published
    snapshot, the ones it pins: SPEC §8)."""

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
    versions: dict[str, str] = field(default_factory=dict)

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
            "versions": dict(self.versions),
        }


def _json_row(row: dict[str, Any], floats: tuple[str, ...]) -> dict[str, Any]:
    return {k: (_json_float(v) if k in floats else v) for k, v in row.items()}


@dataclass
class ChangesResult:
    """What changed in the snapshot of ``snapshot`` since ``previous_date`` (SPEC §10):
    ``summary`` (the ``change_summaries`` row: counts, drift, quantiles, skipped parts),
    ``moves`` (the largest, rows of ``change_pairs``), ``entered`` / ``left`` (symbols, by
    name) and ``counts`` of the other kinds of change. ``previous_date`` and ``summary`` are
    None for the first published snapshot (nothing to compare with). ``stale``: why the
    recorded changes no longer describe the published snapshots (SPEC §10.7; empty: current).
    :attr:`sessions_between`: the calendar's sessions between the two dates (0: overnight)."""

    snapshot: Snapshot
    previous_date: dt.date | None
    summary: dict[str, Any] | None
    moves: list[dict[str, Any]]
    entered: list[str]
    left: list[str]
    counts: dict[str, int]
    stale: list[str] = field(default_factory=list)

    @property
    def sessions_between(self) -> int | None:
        """The sessions of the calendar strictly between ``previous_date`` and the snapshot's
        date, as recorded (``change_summaries.sessions_between``): 0 for overnight changes,
        None when not recorded (or nothing compared)."""
        return None if self.summary is None else self.summary.get("sessions_between")

    def to_json(self) -> dict[str, Any]:
        drift = ("n_pairs", *DRIFT_COLUMNS, "quantiles", "skipped")
        if self.previous_date is None or self.summary is None:
            return {
                "query": "changes",
                **self.snapshot.to_json(),
                "previous_date": None,
                "sessions_between": None,
            }
        return {
            "query": "changes",
            **self.snapshot.to_json(),
            "previous_date": self.previous_date.isoformat(),
            "sessions_between": self.sessions_between,
            "stale": list(self.stale),
            "n_common": self.summary["n_common"],
            "entered": self.entered,
            "left": self.left,
            "drift": {key: self.summary[key] for key in drift},
            "counts": dict(self.counts),
            "largest_moves": [_json_row(m, ("corr", "previous_corr")) for m in self.moves],
        }


@dataclass
class SymbolChangesResult:
    """What changed for ``symbol`` since ``previous_date`` (SPEC §10): its ``status`` (kept,
    entered, left), its clusters (``cluster_id``, ``previous_cluster_id``, ``moved``) and what
    became of its previous cluster (``previous_cluster_now``: today's cluster matched to it, or
    None if it vanished), its new and dropped neighbors (by name), its lead-lag changes, and its
    largest correlation moves (``moves``, from the matrices of both days when they are in the
    store, else its rows among the market's top moves: ``moves_source`` says which).
    ``previous_date`` is None (``status`` ``"first"``) for the first published snapshot.
    ``stale`` and ``sessions_between`` as in :class:`ChangesResult`."""

    snapshot: Snapshot
    previous_date: dt.date | None
    symbol: str
    status: str
    cluster_id: int | None
    previous_cluster_id: int | None
    moved: bool | None
    previous_cluster_now: int | None
    new_neighbors: list[str]
    dropped_neighbors: list[str]
    n_neighbors: int | None
    lead_lag: list[dict[str, Any]]
    moves: list[dict[str, Any]]
    moves_source: str
    stale: list[str] = field(default_factory=list)
    sessions_between: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "changes",
            **self.snapshot.to_json(),
            "previous_date": None if self.previous_date is None else self.previous_date.isoformat(),
            "sessions_between": self.sessions_between,
            "stale": list(self.stale),
            "symbol": self.symbol,
            "status": self.status,
            "cluster_id": self.cluster_id,
            "previous_cluster_id": self.previous_cluster_id,
            "moved": self.moved,
            "previous_cluster_now": self.previous_cluster_now,
            "n_neighbors": self.n_neighbors,
            "new_neighbors": self.new_neighbors,
            "dropped_neighbors": self.dropped_neighbors,
            "lead_lag": [
                _json_row(r, ("improvement", "previous_improvement")) for r in self.lead_lag
            ],
            "moves_source": self.moves_source,
            "largest_moves": [_json_row(m, ("corr", "previous_corr")) for m in self.moves],
        }


@dataclass
class QualityResult:
    """The suspect prices of a snapshot (SPEC §2): the thresholds it screened with, whether it
    dropped the suspect symbols, and each suspect symbol as a row ``{symbol,
    zero_return_share, max_abs_return, reason, dropped}`` of ``suspect_prices``, by symbol."""

    snapshot: Snapshot
    max_zero_return_share: float
    max_abs_return: float
    drop_suspect: bool
    suspects: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "query": "quality",
            **self.snapshot.to_json(),
            "max_zero_return_share": self.max_zero_return_share,
            "max_abs_return": self.max_abs_return,
            "drop_suspect": self.drop_suspect,
            "n_suspect": len(self.suspects),
            "suspects": [
                {
                    "symbol": s["symbol"],
                    "zero_return_share": _json_double(s["zero_return_share"]),
                    "max_abs_return": _json_double(s["max_abs_return"]),
                    "reason": s["reason"],
                    "dropped": bool(s["dropped"]),
                }
                for s in self.suspects
            ],
        }


#: Any answer of the query layer (what ``to_text`` and the command line accept).
Answer: TypeAlias = (
    SnapshotsResult
    | PeersResult
    | ClusterResult
    | LeadLagResult
    | CorrResult
    | ChangesResult
    | SymbolChangesResult
    | QualityResult
)
