"""Date arguments at the database boundary: a date, a datetime or an ISO string."""

from __future__ import annotations

import datetime as dt

from corr_pipeline.dates import DateTextError, parse_date_text


def as_iso_date(value: dt.date | str, what: str, error: type[Exception] = ValueError) -> dt.date:
    """``value`` as a date (a datetime's date, a date, or an ISO ``YYYY-MM-DD`` string);
    anything else raises ``error`` naming ``what`` and saying what is wrong
    (:func:`corr_pipeline.dates.date_problem`)."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return parse_date_text(str(value), what)
    except DateTextError as exc:
        raise error(f"{what} {value!r}: {exc.problem}") from None
