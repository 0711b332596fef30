"""Dates as people type them: ``YYYY-MM-DD``, one parser for every place that reads one (the
command line's options, ``CORR_PIPELINE_PARTITION_START``, the queries' ``--date``, a CSV's
``trade_date``), so that each says the same thing about the same text.

A text of the right form that names no day (``2024-02-30``, ``2024-13-01``) is *not a date*,
with what is wrong (``February 2024 has 29 days``, ``there is no month 13``); any other text is
*not of the form* ``YYYY-MM-DD``.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

__all__ = ["FORM", "DateTextError", "date_problem", "missing_day", "parse_date_text"]

#: The one accepted form, as the messages name it.
FORM = "YYYY-MM-DD"

_SHAPE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", re.ASCII)

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


class DateTextError(ValueError):
    """A text that is not a date: ``what`` (the option or field, may be empty), ``text`` and
    ``problem`` (:func:`date_problem`); its message is ``"{what} {text}: {problem}"``."""

    def __init__(self, what: str, text: str, problem: str) -> None:
        self.what = what
        self.text = text
        self.problem = problem
        super().__init__(f"{what} {text}: {problem}".strip())


def missing_day(text: str) -> str | None:
    """For a text of the form ``YYYY-MM-DD`` that names no day, why (``February 2024 has 29
    days``, ``there is no month 13``, ``there is no day 0``); None for a date and for a text of
    any other form."""
    shape = _SHAPE.fullmatch(text)
    if shape is None:
        return None
    year, month, day = (int(part) for part in shape.groups())
    if year < dt.MINYEAR:
        return "there is no year 0"
    if not 1 <= month <= 12:
        return f"there is no month {month}"
    if day == 0:
        return "there is no day 0"
    days = calendar.monthrange(year, month)[1]
    if day > days:
        return f"{_MONTHS[month - 1]} {year} has {days} days"
    return None


def date_problem(text: str) -> str | None:
    """None when ``text`` is a date ``YYYY-MM-DD``; else what is wrong with it:
    ``not a date (February 2024 has 29 days)`` (:func:`missing_day`) or
    ``expected a date YYYY-MM-DD``."""
    missing = missing_day(text)
    if missing is not None:
        return f"not a date ({missing})"
    if _SHAPE.fullmatch(text) is None:
        return f"expected a date {FORM}"
    return None


def parse_date_text(text: str, what: str = "") -> dt.date:
    """``text`` (``YYYY-MM-DD``) as a date; :class:`DateTextError` naming ``what`` and saying
    what is wrong otherwise (:func:`date_problem`)."""
    problem = date_problem(text)
    if problem is not None:
        raise DateTextError(what, text, problem)
    return dt.date.fromisoformat(text)
