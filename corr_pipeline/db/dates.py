"""Date arguments at the database boundary: a date, a datetime or an ISO string."""

from __future__ import annotations

import datetime as dt


def as_iso_date(value: dt.date | str, what: str, error: type[Exception] = ValueError) -> dt.date:
    """``value`` as a date (a datetime's date, a date, or an ISO ``YYYY-MM-DD`` string);
    anything else raises ``error`` naming ``what``."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        raise error(f"{what} {value!r} is not an ISO date (YYYY-MM-DD)") from None
