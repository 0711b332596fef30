"""Why a window cannot be built (SPEC §2): the errors and the checks that raise them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import numpy as np

from corr_pipeline.db.price_source import PriceSource


class WindowError(ValueError):
    """The window cannot be built (no data, too short, everything dropped, bad arguments)."""


class StaleSessionError(WindowError):
    """A session's window was asked for before any price dated that session exists: its
    snapshot would be an earlier session's under a later date (SPEC §2). ``session`` and
    ``latest`` (the latest trade date on or before it) say which."""

    def __init__(self, session: dt.date, latest: dt.date, what: str) -> None:
        super().__init__(
            f"no price dated {session} in {what} yet (the latest trade date on or before it is "
            f"{latest}): session {session} cannot be snapshotted before its prices are in; "
            "nothing is published"
        )
        self.session = session
        self.latest = latest


def stale_error(
    d: dt.date, dates: Sequence[dt.date], session: bool, source: PriceSource
) -> StaleSessionError | None:
    """The error of a session ``d`` (``session``) whose window ``dates`` does not end on it."""
    if session and dates and dates[-1] != d:
        return StaleSessionError(d, dates[-1], source_name(source))
    return None


def check_arguments(lookback_days: int, min_history_days: int) -> None:
    if isinstance(lookback_days, bool) or not isinstance(lookback_days, int | np.integer):
        raise WindowError(f"lookback_days must be an integer, got {lookback_days!r}")
    if isinstance(min_history_days, bool) or not isinstance(min_history_days, int | np.integer):
        raise WindowError(f"min_history_days must be an integer, got {min_history_days!r}")
    if lookback_days < 1:
        raise WindowError(f"lookback_days must be >= 1, got {lookback_days}")
    if min_history_days < 2:
        raise WindowError(
            f"min_history_days must be >= 2 (a variance needs two returns), got {min_history_days}"
        )


def source_name(source: PriceSource) -> str:
    return "prices" if source.is_native else f"the price source {source.relation_name}"


def no_dates_error(d: dt.date, earliest: dt.date | None, source: PriceSource) -> WindowError:
    """No trade date ``<= d``: the source is empty (``earliest`` None) or starts after ``d``."""
    if earliest is None:
        table = "the prices table" if source.is_native else source_name(source)
        return WindowError(f"no prices at all: {table} is empty (snapshot date {d})")
    return WindowError(
        f"no prices on or before the snapshot date {d} "
        f"(the earliest trade_date in {source_name(source)} is {earliest})"
    )


def too_few_dates_error(
    d: dt.date, dates: list[dt.date], min_history_days: int
) -> WindowError | None:
    n_returns = len(dates) - 1
    if n_returns >= min_history_days:
        return None
    return WindowError(
        f"only {len(dates)} trade date(s) on or before {d} ({dates[0]}..{dates[-1]}), "
        f"i.e. {n_returns} returns; min_history_days={min_history_days} needs at "
        f"least {min_history_days + 1} trade dates"
    )
