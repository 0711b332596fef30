"""Why a query cannot be answered as asked (SPEC §7, §8).

Every error is a :class:`QueryError`: ``exit_code`` 2 on the command line, ``kind`` and
:meth:`QueryError.to_json` for the JSON form ``{"error": {...}}``. The message says what to do:
an unknown symbol lists close matches (a symbol that has prices but was dropped from the window,
SPEC §2, is told apart), a date with no snapshot lists the latest available dates and the
nearest earlier one.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corr_pipeline.query.answers import Snapshot

__all__ = [
    "MatricesPrunedError",
    "MatrixUnavailableError",
    "NoSnapshotError",
    "QueryError",
    "SnapshotNotFoundError",
    "UnknownSymbolError",
    "quote",
]


def quote(text: str) -> str:
    """A symbol in a message: double-quoted, inner quotes/control characters escaped, non-ASCII
    kept."""
    return json.dumps(text, ensure_ascii=False)


def _iso(day: dt.date | None) -> str | None:
    return None if day is None else day.isoformat()


class QueryError(Exception):
    """A question the snapshot cannot answer as asked; ``exit_code`` 2, ``kind`` for JSON."""

    exit_code = 2
    kind = "query_error"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "message": str(self)}


class NoSnapshotError(QueryError):
    """Nothing has been published yet (or, reading the matrix store alone, nothing stored)."""

    kind = "no_snapshot"


class SnapshotNotFoundError(QueryError):
    """No snapshot for the requested date; ``latest`` lists the newest available dates (of
    ``total``), ``nearest_earlier`` the newest one before the requested date."""

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
    tells a dropped symbol (prices exist, SPEC §2 dropped it) from an unknown one.

    ``where`` names the place searched when it is not the published snapshot itself (the
    correlation matrix of a date in the matrix store).
    """

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
                f"symbol {quote(symbol)} is not in {place}: it has prices but was dropped from "
                f"the window (fewer than min_history_days={min_history} finite returns, or zero "
                "variance; see the dropped_symbols metadata of returns_matrix)"
            )
        else:
            text = f"unknown symbol {quote(symbol)}: not in {place}"
        if self.suggestions:
            text += "; did you mean " + ", ".join(quote(s) for s in self.suggestions) + "?"
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
    """The snapshot's correlation matrix cannot be read from the matrix store (SPEC §8)."""

    kind = "matrix_unavailable"


class MatricesPrunedError(MatrixUnavailableError):
    """Retention removed the matrices of a published date (SPEC §8); ``available`` lists the
    newest dates that still have theirs. The published rows (peers, cluster, lead-lag) stay."""

    kind = "matrices_pruned"

    def __init__(self, day: dt.date, available: Sequence[dt.date], total: int) -> None:
        self.day = day
        self.available = list(available)
        self.total = total
        if self.available:
            more = (
                f" (newest {len(self.available)} of {total:,})"
                if total > len(self.available)
                else ""
            )
            still = (
                "dates that still have them"
                + more
                + ": "
                + ", ".join(d.isoformat() for d in self.available)
            )
        else:
            still = "no date has matrices in the store any more"
        super().__init__(
            f"the matrices of {day} were pruned by retention (CORR_PIPELINE_KEEP_MATRICES); "
            f"{still}; query peers/cluster/lead-lag still answer for {day}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "snapshot_date": self.day.isoformat(),
            "available": [d.isoformat() for d in self.available],
        }
