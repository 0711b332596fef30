"""How the session a change set compares with is named wherever the changes are shown (SPEC §7
"Ranges", §10): the session just before, or an older one across a gap in the published history,
never the one passed off as the other.

``sessions_between`` is the count recorded with the changes (``change_summaries``): 0 for
consecutive sessions (overnight changes); ``n > 0`` when the ``n`` sessions of the calendar
between the two dates were not published; None when it is not recorded (change sets recorded
before schema revision 0009, or a range the calendar cannot cover).
"""

from __future__ import annotations

import datetime as dt

__all__ = ["compared_with", "is_overnight", "title_note"]


def is_overnight(sessions_between: int | None) -> bool:
    """Whether the changes are overnight: the two dates are consecutive sessions."""
    return sessions_between == 0


def _sessions(n: int) -> str:
    return f"{n:,} session" + ("" if n == 1 else "s")


def compared_with(previous_date: dt.date, sessions_between: int | None) -> str:
    """One line naming the session compared with: ``previous session: 2020-03-13`` (overnight);
    ``previous published session: 2014-07-18, 1,423 sessions between the two — NOT overnight
    changes``; ``previous published session: 2014-07-18 (the sessions between the two are not
    recorded)``."""
    day = previous_date.isoformat()
    if is_overnight(sessions_between):
        return f"previous session: {day}"
    if sessions_between is None:
        return f"previous published session: {day} (the sessions between the two are not recorded)"
    return (
        f"previous published session: {day}, {_sessions(sessions_between)} between the two — "
        "NOT overnight changes"
    )


def title_note(sessions_between: int | None) -> str:
    """What the title of a picture of the changes adds after its dates: nothing (overnight),
    `` (1,423 sessions between: NOT overnight)``, or `` (sessions between not recorded)``."""
    if is_overnight(sessions_between):
        return ""
    if sessions_between is None:
        return " (sessions between not recorded)"
    return f" ({_sessions(sessions_between)} between: NOT overnight)"
