"""The two universes of a change set matched by name (SPEC §10)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SymbolMatch:
    """The two universes matched by name.

    common : the common symbols, ascending (code points).
    today_index, previous_index : int64, their positions in today's / the previous universe.
    entered : int64 positions in today's universe of the symbols not in the previous one.
    left : int64 positions in the previous universe of the symbols not in today's.
    previous_to_today : int64 (N_previous,), today's position of each previous symbol, −1 if it left.
    """

    common: list[str]
    today_index: np.ndarray
    previous_index: np.ndarray
    entered: np.ndarray
    left: np.ndarray
    previous_to_today: np.ndarray


def match_symbols(today: Sequence[str], previous: Sequence[str]) -> SymbolMatch:
    """Match two symbol lists by name (duplicates in either list raise ``ValueError``)."""
    pos_today = {s: i for i, s in enumerate(today)}
    pos_prev = {s: i for i, s in enumerate(previous)}
    if len(pos_today) != len(today) or len(pos_prev) != len(previous):
        raise ValueError("symbol lists must not contain duplicates")
    common = sorted(pos_today.keys() & pos_prev.keys())
    prev_to_today = np.array([pos_today.get(s, -1) for s in previous], dtype=np.int64)
    return SymbolMatch(
        common=common,
        today_index=np.array([pos_today[s] for s in common], dtype=np.int64),
        previous_index=np.array([pos_prev[s] for s in common], dtype=np.int64),
        entered=np.array(
            sorted((i for s, i in pos_today.items() if s not in pos_prev), key=today.__getitem__),
            dtype=np.int64,
        ),
        left=np.flatnonzero(prev_to_today < 0).astype(np.int64),
        previous_to_today=prev_to_today,
    )
