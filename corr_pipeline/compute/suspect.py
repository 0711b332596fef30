"""Suspect prices (SPEC §2): per symbol, the share of its finite returns that are exactly 0 (a
stale or forward-filled close) and its largest ``|R[t, j]|`` (a price error, an unadjusted
split); a symbol is suspect when the share *exceeds* ``max_zero_return_share`` or the largest
``|R|`` *exceeds* ``max_abs_return`` (strictly: a figure equal to its threshold is not suspect).

Both figures are read from the float32 returns the correlation uses, so the ``|R|`` compared is
the one the snapshot holds; the comparison is made in float64 (``float(value) > threshold``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_MAX_ABS_RETURN",
    "DEFAULT_MAX_ZERO_RETURN_SHARE",
    "DEFAULT_SCREEN",
    "SuspectScreen",
    "SuspectSymbol",
    "find_suspects",
    "suspect_figures",
    "suspect_reason",
]

#: The thresholds' defaults (SPEC §2): a quarter of the returns exactly 0; a log return of 0.5
#: (+65 % / −39 % in a day).
DEFAULT_MAX_ZERO_RETURN_SHARE = 0.25
DEFAULT_MAX_ABS_RETURN = 0.5


@dataclass(frozen=True)
class SuspectScreen:
    """The thresholds of the screen and whether suspect symbols are ``drop``-ped from the
    universe (default: reported and kept)."""

    max_zero_return_share: float = DEFAULT_MAX_ZERO_RETURN_SHARE
    max_abs_return: float = DEFAULT_MAX_ABS_RETURN
    drop: bool = False


#: The default thresholds, suspect symbols kept.
DEFAULT_SCREEN = SuspectScreen()


@dataclass(frozen=True)
class SuspectSymbol:
    """One suspect symbol: its share of zero returns among its finite returns, its largest
    ``|log return|``, why it is suspect (in words, naming the threshold passed) and whether it
    was dropped from the universe."""

    symbol: str
    zero_return_share: float
    max_abs_return: float
    reason: str
    dropped: bool

    def as_list(self) -> list:
        """``[symbol, zero_return_share, max_abs_return, reason, dropped]`` (JSON)."""
        return [
            self.symbol,
            self.zero_return_share,
            self.max_abs_return,
            self.reason,
            self.dropped,
        ]

    @classmethod
    def from_list(cls, row: Sequence) -> SuspectSymbol:
        """The inverse of :meth:`as_list`."""
        symbol, share, largest, reason, dropped = row
        return cls(str(symbol), float(share), float(largest), str(reason), bool(dropped))


def suspect_figures(returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``returns`` (``T × N``, NaN = missing): the share of its finite values
    that are exactly 0 and its largest finite ``|value|`` (float64; NaN for a column without a
    finite value)."""
    finite = np.isfinite(returns).sum(axis=0)
    zeros = (returns == 0).sum(axis=0)  # NaN == 0 is False
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(finite > 0, zeros / np.maximum(finite, 1), np.nan)
    largest = np.fmax.reduce(np.abs(returns), axis=0, initial=-np.inf).astype(np.float64)
    largest[finite == 0] = np.nan
    return share.astype(np.float64), largest


def suspect_reason(share: float, largest: float, screen: SuspectScreen) -> str | None:
    """Why a symbol with these figures is suspect under ``screen``, or None if it is not."""
    reasons = []
    if share > screen.max_zero_return_share:
        reasons.append(
            f"stale closes: {share:.1%} of its finite returns are 0 "
            f"(> max_zero_return_share={screen.max_zero_return_share:g})"
        )
    if largest > screen.max_abs_return:
        reasons.append(
            f"price error: largest |log return| {largest:.4g} "
            f"(> max_abs_return={screen.max_abs_return:g})"
        )
    return "; ".join(reasons) if reasons else None


def find_suspects(
    returns: np.ndarray, symbols: Sequence[str], screen: SuspectScreen
) -> tuple[np.ndarray, list[SuspectSymbol]]:
    """The suspect columns of ``returns`` (a boolean mask over its columns) and, in column
    order, each suspect symbol with its figures (``dropped`` = ``screen.drop``)."""
    share, largest = suspect_figures(returns)
    with np.errstate(invalid="ignore"):
        mask = (share > screen.max_zero_return_share) | (largest > screen.max_abs_return)
    found = []
    for j in np.flatnonzero(mask):
        s, m = float(share[j]), float(largest[j])
        reason = suspect_reason(s, m, screen)
        assert reason is not None  # the mask and the reason compare the same figures
        found.append(SuspectSymbol(symbols[int(j)], s, m, reason, screen.drop))
    return mask, found
