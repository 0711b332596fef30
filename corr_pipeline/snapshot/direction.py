"""Which lead-lag pairs are significant and which are two-way (SPEC §6 "Significance",
"Direction"): one rule for every reader of a snapshot's pairs (the asset's metadata, its
markdown preview, the network picture).

A published pair ``(leader, lagger)`` carries its own q-value and its *reverse direction*, the
ordered pair the other way, ``(lagger, leader)``: ``reverse_lag`` (its best lag; 0 when it has
none), ``reverse_lagged_corr`` and ``reverse_q_value`` (NaN when it has none). At a threshold
``max_q_value`` (the snapshot's parameter, ``snapshots.params["max_q_value"]``; 1 when a
snapshot did not record one):

* the pair is **significant** when ``q_value <= max_q_value``;
* the pair is **two-way** when the reverse pair has a best lag and ``reverse_q_value <=
  max_q_value``: the lag shows in both directions, which says nothing about which symbol leads;
  otherwise it is **one-way**.

A NaN (or None) q-value passes no threshold. With ``max_q_value = 1`` every pair whose reverse
has a best lag is two-way: at that setting only the direction's existence is asked for.

The published tables hold NULL for a missing reverse direction, both where the reverse pair has
no best lag and in snapshots published before the direction was recorded (schema revision
0008); telling the two apart is the query layer's (:mod:`corr_pipeline.query.published`), which
shows the latter as unknown. Here the arrays come from the scan, where a missing direction is
always "no best lag".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from corr_pipeline.snapshot import display

__all__ = [
    "TWO_WAY_MARK",
    "count_significant",
    "count_two_way",
    "is_significant",
    "is_two_way",
    "snapshot_max_q_value",
    "two_way_text",
]

TWO_WAY_MARK = "⇄"
"""The mark of a two-way pair in tables and pictures."""


def is_significant(q_value: Any, max_q_value: float) -> np.ndarray:
    """``q_value <= max_q_value`` elementwise (a scalar gives a 0-d array); NaN or None is not
    significant."""
    q = np.asarray(q_value, dtype=np.float64)
    return np.asarray(q <= max_q_value)


def is_two_way(reverse_lag: Any, reverse_q_value: Any, max_q_value: float) -> np.ndarray:
    """Two-way pairs elementwise: the reverse pair has a best lag (``reverse_lag >= 1``) and
    ``reverse_q_value <= max_q_value``. A ``reverse_lag`` of 0, None or NaN, or a NaN/None
    ``reverse_q_value``, is one-way (an array zero-filled by ``np.zeros`` has no reverse
    direction, whatever its ``reverse_q_value`` of 0 says)."""
    lag = np.asarray(reverse_lag, dtype=np.float64)
    q = np.asarray(reverse_q_value, dtype=np.float64)
    return np.asarray((lag >= 1) & (q <= max_q_value))


def count_significant(pairs: np.ndarray, max_q_value: float) -> int:
    """How many of ``pairs`` (``LEAD_LAG_DTYPE``) are significant at ``max_q_value``."""
    return int(np.count_nonzero(is_significant(pairs["q_value"], max_q_value)))


def count_two_way(pairs: np.ndarray, max_q_value: float) -> int:
    """How many of ``pairs`` (``LEAD_LAG_DTYPE``) are two-way at ``max_q_value``."""
    return int(
        np.count_nonzero(is_two_way(pairs["reverse_lag"], pairs["reverse_q_value"], max_q_value))
    )


def snapshot_max_q_value(params: Mapping[str, Any] | None) -> float:
    """The ``max_q_value`` a published snapshot was computed with (its ``snapshots.params``);
    1 (every q-value passes) when it recorded none or none in ``(0, 1]``, as snapshots published
    before the parameter existed."""
    value = (params or {}).get("max_q_value", 1.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) and 0.0 < value <= 1.0 else 1.0


def two_way_text(reverse_lag: Any, reverse_q_value: Any, max_q_value: float) -> str:
    """A two-way pair's mark with its reverse lag and q-value (``⇄ 2d, q 0.0123``); empty for a
    one-way pair."""
    if not bool(is_two_way(reverse_lag, reverse_q_value, max_q_value)):
        return ""
    q = display.probability_text(reverse_q_value)
    return f"{TWO_WAY_MARK} {int(reverse_lag)}d, q {q}"
