"""Trading sessions: which dates are snapshot dates, and when each session closes.

One calendar drives the partitions and the schedule (:mod:`corr_pipeline.defs.partitions`,
:mod:`corr_pipeline.defs.jobs`) and is what a sensor or a freshness check asks "which session
is the latest closed one?":

- an exchange calendar of the ``exchange_calendars`` package (``XNYS``, the default, ``XLON``,
  ``XTKS``, ...): its sessions — holidays are not sessions, half days are (with their early
  close) — in the exchange's time zone;
- ``weekdays``: every Monday to Friday, in UTC, for universes that span exchanges (no holiday is
  skipped; a weekday "closes" at the end of its UTC day).

The calendar is built for a bounded range (the first partition to :data:`HORIZON_DAYS` after
today, when the code location loads); :meth:`SessionCalendar.sessions` and friends answer within
it. Nothing here knows Dagster or the database.

The returns of a symbol are computed from the dates present in the price source (SPEC §2), not
from this calendar: a symbol listed on another exchange that was closed on one of our sessions
has no price that day, so its returns into and out of that day are both NaN (SPEC §2), exactly
as for any missing day: no return spans the gap.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import zoneinfo
from dataclasses import dataclass

import numpy as np

from corr_pipeline import settings

__all__ = [
    "HORIZON_DAYS",
    "SessionCalendar",
    "calendar_names",
    "configured_calendar",
    "get_calendar",
]

#: How far past today the calendar (and so the holiday exclusions) is built.
HORIZON_DAYS = 2 * 366

_DAY = np.timedelta64(1, "D")


def calendar_names() -> list[str]:
    """The accepted calendar names: ``weekdays`` and the codes of ``exchange_calendars``."""
    import exchange_calendars as xcals

    return [settings.WEEKDAYS_CALENDAR, *sorted(xcals.get_calendar_names(include_aliases=True))]


@dataclass(frozen=True, eq=False)
class SessionCalendar:
    """The sessions of one calendar between ``first`` and ``horizon`` (inclusive).

    ``sessions``: ascending ``datetime64[D]`` session dates; ``closes``: their closing instants
    (``datetime64[s]``, UTC); ``timezone``: the exchange's IANA zone (``UTC`` for weekdays).
    """

    name: str
    timezone: str
    sessions_array: np.ndarray
    closes_array: np.ndarray
    horizon: dt.date

    @property
    def is_weekdays(self) -> bool:
        return self.name == settings.WEEKDAYS_CALENDAR

    @property
    def first(self) -> dt.date:
        """The first session of the calendar's range."""
        return _date(self.sessions_array[0])

    @property
    def session_weekdays(self) -> tuple[int, ...]:
        """The weekdays (Monday = 0) on which sessions occur in the range."""
        days = (
            self.sessions_array.astype("datetime64[D]").view("int64") + 3
        ) % 7  # 1970-01-01 = Thu
        return tuple(int(d) for d in np.unique(days))

    def _index(self, day: dt.date) -> int:
        return int(np.searchsorted(self.sessions_array, np.datetime64(day, "D")))

    def is_session(self, day: dt.date) -> bool:
        i = self._index(day)
        return i < self.sessions_array.size and _date(self.sessions_array[i]) == day

    def sessions(self, start: dt.date, end: dt.date) -> list[dt.date]:
        """The sessions ``start <= s <= end``, ascending."""
        lo, hi = self._index(start), self._index(end + dt.timedelta(days=1))
        return [_date(s) for s in self.sessions_array[lo:hi]]

    def session_on_or_before(self, day: dt.date) -> dt.date | None:
        """The last session ``<= day`` (None before the first one)."""
        i = self._index(day + dt.timedelta(days=1))
        return _date(self.sessions_array[i - 1]) if i > 0 else None

    def previous_session(self, day: dt.date) -> dt.date | None:
        """The last session strictly before ``day``."""
        i = self._index(day)
        return _date(self.sessions_array[i - 1]) if i > 0 else None

    def sessions_between(self, earlier: dt.date, later: dt.date) -> int:
        """How many sessions ``s`` have ``earlier < s < later``: 0 for consecutive sessions.

        Counted in this calendar's range when it holds both dates (``first <= earlier`` and
        ``later <= horizon``); otherwise with the same calendar built for ``earlier..later``
        (:func:`get_calendar`), so a date before the first partition (a history published
        before the partitions' start) is counted the same way. ValueError when ``later`` is not
        after ``earlier``, or when the calendar cannot cover that range (``get_calendar``)."""
        if not earlier < later:
            raise ValueError(f"sessions between {earlier} and {later}: {later} is not after it")
        covered = self.first <= earlier and later <= self.horizon
        calendar = self if covered else get_calendar(self.name, earlier, later)
        one = dt.timedelta(days=1)
        return len(calendar.sessions(earlier + one, later - one))

    def close(self, session: dt.date) -> dt.datetime:
        """The closing instant (aware, UTC) of ``session``; KeyError if it is not one."""
        i = self._index(session)
        if i >= self.sessions_array.size or _date(self.sessions_array[i]) != session:
            raise KeyError(f"{session} is not a session of {self.name}")
        return _utc(self.closes_array[i])

    def local_close(self, session: dt.date) -> dt.datetime:
        """:meth:`close` in the exchange's time zone."""
        return self.close(session).astimezone(zoneinfo.ZoneInfo(self.timezone))

    def excluded_days(self, start: dt.date, end: dt.date) -> list[dt.date]:
        """Days in ``[start, end]`` that fall on a session weekday but are not sessions (the
        holidays the partitions must skip)."""
        weekdays = set(self.session_weekdays)
        out, day = [], start
        sessions = set(self.sessions(start, end))
        while day <= end:
            if day.weekday() in weekdays and day not in sessions:
                out.append(day)
            day += dt.timedelta(days=1)
        return out

    def last_closed_session(
        self, now: dt.datetime, delay: dt.timedelta = dt.timedelta(0)
    ) -> dt.date | None:
        """The latest session whose close + ``delay`` is ``<= now`` (for a sensor or a freshness
        check: "the session that should have a snapshot by now")."""
        ready = self.closes_array + np.timedelta64(int(delay.total_seconds()), "s")
        i = int(np.searchsorted(ready, _np_utc(now), side="right"))
        return _date(self.sessions_array[i - 1]) if i > 0 else None

    def session_fired_at(self, tick: dt.datetime, delay: dt.timedelta) -> dt.date | None:
        """The session whose close + ``delay`` is ``tick`` (to the minute), or None."""
        ready = self.closes_array + np.timedelta64(int(delay.total_seconds()), "s")
        minute = _np_utc(tick).astype("datetime64[m]")
        i = int(np.searchsorted(ready.astype("datetime64[m]"), minute))
        if i < ready.size and ready[i].astype("datetime64[m]") == minute:
            return _date(self.sessions_array[i])
        return None

    def fire_times(self, delay: dt.timedelta, start: dt.date) -> dict[tuple[int, int], int]:
        """``{(hour, minute): sessions}``: the local (:attr:`timezone`) times close + ``delay``
        of the sessions from ``start`` on, with how many sessions fire at each."""
        zone = zoneinfo.ZoneInfo(self.timezone)
        counts: dict[tuple[int, int], int] = {}
        for close in self.closes_array[self._index(start) :]:
            fire = (_utc(close) + delay).astimezone(zone)
            counts[(fire.hour, fire.minute)] = counts.get((fire.hour, fire.minute), 0) + 1
        return counts

    def fire_crons(self, delay: dt.timedelta, start: dt.date) -> list[str]:
        """Cron strings (in :attr:`timezone`) that tick at close + ``delay`` of every session
        from ``start`` on: one per distinct local fire time (:meth:`fire_times`), each on the
        weekdays that have sessions (``1-5`` for an exchange closed at weekends), so that the
        UI reads them as "at 05:30 PM, Monday through Friday"."""
        days = sorted(
            {(_date(s).weekday() + 1) % 7 for s in self.sessions_array[self._index(start) :]}
        )
        spelled = "1-5" if days == [1, 2, 3, 4, 5] else ",".join(str(d) for d in days)
        return [
            f"{minute} {hour} * * {spelled}"
            for hour, minute in sorted(self.fire_times(delay, start))
        ]

    def fire_description(self, delay_minutes: int, start: dt.date) -> str:
        """What the nightly schedule does, in words: ``"90 min after each XNYS close (17:30
        America/New_York; 14:30 on half days): that session's snapshot"``."""
        counts = self.fire_times(dt.timedelta(minutes=delay_minutes), start)
        regular = max(counts, key=lambda time: (counts[time], time))
        early = sorted(time for time in counts if time != regular)
        times = f"{regular[0]:02d}:{regular[1]:02d} {self.timezone}"
        if early:
            times += "; " + ", ".join(f"{h:02d}:{m:02d}" for h, m in early) + " on half days"
        return (
            f"{delay_minutes} min after each {self.name} close ({times}): that session's "
            "snapshot. Ticks on days without a session, or at the other close time, skip."
        )


def _date(value: np.datetime64) -> dt.date:
    return dt.date.fromisoformat(str(value.astype("datetime64[D]")))


def _utc(value: np.datetime64) -> dt.datetime:
    seconds = int(value.astype("datetime64[s]").view("int64"))
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _np_utc(when: dt.datetime) -> np.datetime64:
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return np.datetime64(int(when.timestamp()), "s")


def _weekdays_calendar(start: dt.date, end: dt.date) -> SessionCalendar:
    days = np.arange(np.datetime64(start, "D"), np.datetime64(end, "D") + _DAY)
    sessions = days[np.is_busday(days)]
    closes = (sessions + _DAY).astype("datetime64[s]")  # the end of the UTC day
    return SessionCalendar(settings.WEEKDAYS_CALENDAR, "UTC", sessions, closes, end)


@functools.lru_cache(maxsize=8)
def get_calendar(name: str, start: dt.date, end: dt.date) -> SessionCalendar:
    """The calendar ``name`` (``weekdays`` or an ``exchange_calendars`` code, case as given by
    that package; aliases accepted) from ``start`` to ``end``. ValueError naming
    ``CORR_PIPELINE_CALENDAR`` for an unknown name or a range the calendar does not cover."""
    if name == settings.WEEKDAYS_CALENDAR:
        return _weekdays_calendar(start, end)
    import exchange_calendars as xcals

    known = calendar_names()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5) or ["XNYS", "weekdays"]
        raise ValueError(
            f"{settings.ENV_CALENDAR}={name!r} is not a known calendar (did you mean "
            f"{' or '.join(close)}? the exchange_calendars codes, or weekdays)"
        )
    try:
        calendar = xcals.get_calendar(name, start=start.isoformat(), end=end.isoformat())
    except ValueError as exc:
        raise ValueError(
            f"{settings.ENV_CALENDAR}={name!r} cannot cover {start}..{end}: "
            f"{' '.join(str(exc).split())[:200]}"
        ) from None
    sessions = calendar.sessions.values.astype("datetime64[D]")
    closes = calendar.closes.dt.tz_convert(None).to_numpy().astype("datetime64[s]")  # UTC
    return SessionCalendar(name, str(calendar.tz), sessions, closes, end)


def configured_calendar(today: dt.date | None = None) -> SessionCalendar:
    """The calendar of :func:`settings.calendar_name` from :func:`settings.partition_start` to
    ``today`` (default: the current UTC date) + :data:`HORIZON_DAYS`."""
    today = today or dt.datetime.now(dt.UTC).date()
    return get_calendar(
        settings.calendar_name(),
        settings.partition_start(),
        today + dt.timedelta(days=HORIZON_DAYS),
    )
