"""Markdown previews of a snapshot's results (shown by the Dagster UI), one renderer for all.

Every symbol goes through :func:`escape`, so a name holding ``|``, ``*``, a backtick or a line
break shows verbatim in its table cell and can neither break the table nor add markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from corr_pipeline.compute.suspect import SuspectSymbol
from corr_pipeline.snapshot import direction, display

_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_{}[]<>()#+-.!|~"})


def escape(text: Any) -> str:
    """``text`` as it should appear in a table cell: line breaks become spaces and markdown
    punctuation is backslash-escaped."""
    return str(text).replace("\r", " ").replace("\n", " ").translate(_SPECIAL)


def table(headers: Sequence[str], aligns: str, rows: Sequence[Sequence[str]], *, empty: str) -> str:
    """A markdown table: ``headers``, one alignment letter per column in ``aligns`` (``l`` or
    ``r``), and ``rows`` of cells already rendered (escape symbols with :func:`escape`).
    ``empty`` is returned instead of a table without rows."""
    if not rows:
        return empty
    rule = {"l": "---", "r": "---:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(rule[a] for a in aligns) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def strongest_pairs(
    pairs: np.ndarray, symbols: Sequence[str], *, top: int = 15, max_q_value: float = 1.0
) -> str:
    """The first ``top`` lead-lag pairs (already in SPEC §6 order: improvement descending):
    leader, lagger, lag, lagged corr, sync corr (NaN allowed), improvement, overlap, q-value,
    and a column ``⇄ two-way`` marking the pairs whose reverse pair ``(lagger, leader)`` is
    significant at ``max_q_value`` (the snapshot's parameter) with that pair's lag and q-value
    (``⇄ 2d, q 0.0123``; empty for a one-way pair: :mod:`corr_pipeline.snapshot.direction`)."""
    rows = [
        [
            escape(symbols[int(row["leader"])]),
            escape(symbols[int(row["lagger"])]),
            str(int(row["lag"])),
            display.corr_text(row["lagged_corr"]),
            display.corr_text(row["sync_corr"]),
            display.corr_text(row["improvement"], signed=False),
            str(int(row["overlap"])),
            display.probability_text(row["q_value"]),
            direction.two_way_text(row["reverse_lag"], row["reverse_q_value"], max_q_value),
        ]
        for row in pairs[:top]
    ]
    headers = (
        "leader",
        "lagger",
        "lag",
        "lagged corr",
        "sync corr",
        "improvement",
        "overlap",
        "q value",
        f"{direction.TWO_WAY_MARK} two-way",
    )
    return table(headers, "llrrrrrrl", rows, empty="_no lead-lag pairs_")


def largest_clusters(
    labels: np.ndarray, symbols: Sequence[str], *, top: int = 10, members: int = 8
) -> str:
    """The ``top`` largest clusters (ties to the smaller id) with their first ``members``
    symbols in column order."""
    if len(labels) == 0:
        return "_no symbols_"
    sizes = np.bincount(np.asarray(labels, dtype=np.int64))
    order = np.lexsort((np.arange(sizes.size), -sizes))[:top]
    rows = []
    for cluster in order:
        cols = np.flatnonzero(labels == cluster)[:members]
        names = ", ".join(escape(symbols[j]) for j in cols)
        more = " ..." if sizes[cluster] > members else ""
        rows.append([str(int(cluster)), str(int(sizes[cluster])), names + more])
    return table(("cluster", "size", "first members"), "rrl", rows, empty="_no symbols_")


def dropped_symbols(dropped: Sequence[tuple[str, str]], *, limit: int = 25) -> str:
    """The first ``limit`` symbols dropped from the window with their reasons (SPEC §2)."""
    rows = [[escape(symbol), escape(reason)] for symbol, reason in dropped[:limit]]
    if len(dropped) > limit:
        rows.append(["...", f"{len(dropped) - limit} more"])
    return table(("symbol", "reason"), "ll", rows, empty="_no symbol dropped_")


def suspect_symbols(suspects: Sequence[SuspectSymbol], *, limit: int = 25) -> str:
    """The first ``limit`` suspect symbols of the window (SPEC §2): zero-return share, largest
    |log return|, the reason, and whether it was dropped (``drop_suspect``)."""
    rows = [
        [
            escape(s.symbol),
            display.figure_text(s.zero_return_share),
            display.figure_text(s.max_abs_return),
            escape(s.reason),
            "dropped" if s.dropped else "kept",
        ]
        for s in suspects[:limit]
    ]
    if len(suspects) > limit:
        rows.append(["...", "", "", f"{len(suspects) - limit} more", ""])
    headers = ("symbol", "zero-return share", "max abs return", "reason", "universe")
    return table(headers, "lrrll", rows, empty="_no suspect prices_")


def largest_moves(rows: Sequence[Sequence[Any]], *, top: int = 15) -> str:
    """The first ``top`` correlation moves (rows of ``change_pairs``, SPEC §10.2: rank, a, b,
    corr, previous corr, overlap, previous overlap, change)."""
    cells = [
        [
            str(rank),
            escape(a),
            escape(b),
            display.corr_text(previous),
            display.corr_text(corr),
            display.corr_text(change),
        ]
        for rank, a, b, corr, previous, _overlap, _previous_overlap, change in rows[:top]
    ]
    headers = ("rank", "symbol a", "symbol b", "previous", "today", "change")
    return table(headers, "rllrrr", cells, empty="_no pair compared_")


def largest_turnover(
    symbols: Sequence[str], n_new: np.ndarray, n: np.ndarray, *, top: int = 10
) -> str:
    """The ``top`` symbols with the most new neighbors (SPEC §10.3), ties by name."""
    order = np.lexsort((np.arange(len(symbols)), -np.asarray(n_new)))[:top]
    cells = [[escape(symbols[i]), f"{int(n_new[i])} of {int(n[i])}"] for i in order if n_new[i] > 0]
    return table(("symbol", "new neighbors"), "lr", cells, empty="_no neighbor changed_")
