"""Snapshot partitions: one partition per session of the configured calendar, keyed by the snapshot
date ``YYYY-MM-DD``.

The partition key is the snapshot date ``D`` of SPEC §2: the window is the last
``lookback_days + 1`` trade dates ``<= D`` present in the price source. Which dates are
partitions is the calendar's business (:mod:`corr_pipeline.sessions`, ``$CORR_PIPELINE_CALENDAR``):

- an exchange calendar (``XNYS``, the default): a ``TimeWindowPartitionsDefinition`` in the
  exchange's time zone whose cron ticks at midnight on the weekdays that have sessions, with
  ``exclusions`` = the days among those that are not sessions (the holidays, computed from
  ``exchange_calendars`` when the code location loads, up to :data:`~corr_pipeline.sessions.HORIZON_DAYS`
  ahead). Holidays therefore have no partition; half days are sessions like any other. The
  definition stays a time-window one, so backfills over a range (UI, ``dagster job backfill
  --from --to``) cover exactly the sessions in it, the UI's partition bar is a time line, and
  Dagster's time-partition tools (freshness checks, the schedule helpers) apply.
- ``weekdays``: today's behaviour, unchanged: cron ``0 0 * * 1-5`` in UTC, no exclusions; a
  weekday holiday is a partition and snapshots the previous session (``as_of_trade_date`` in the
  ``snapshots`` row says which).

The first partition is the first session on or after ``$CORR_PIPELINE_PARTITION_START``
(``YYYY-MM-DD``, default :data:`corr_pipeline.settings.DEFAULT_PARTITION_START`), read once when
the code location loads. Partition windows are the calendar's local days: the partition ``D``
covers ``D 00:00`` to the next session weekday's ``00:00``. The definition has ``end_offset=1``,
so the current session's partition already exists (a snapshot can be built the evening of its
session; during a weekend, Friday's). One known Dagster quirk (dagster-io/dagster#33551, open in
1.13): on an *excluded* day (a holiday) ``end_offset=1`` makes the next session's partition
appear a day early; materializing it then snapshots the last session before it, and the nightly
schedule builds it again after its close. The schedule (:mod:`corr_pipeline.defs.jobs`) only
ever requests sessions that have closed.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.sessions import SessionCalendar, configured_calendar

PARTITION_FMT = "%Y-%m-%d"
WEEKDAY_CRON = "0 0 * * 1-5"
PARTITION_TIMEZONE = "UTC"


def build_partitions_def(
    start: dt.date | None = None, calendar: SessionCalendar | None = None
) -> dg.TimeWindowPartitionsDefinition:
    """The partitions of ``calendar`` (default :func:`corr_pipeline.sessions.configured_calendar`)
    from its first session on or after ``start`` (default
    :func:`corr_pipeline.settings.partition_start`); see the module docstring."""
    start = start or settings.partition_start()
    calendar = calendar or configured_calendar()
    if calendar.is_weekdays:
        return dg.TimeWindowPartitionsDefinition(
            cron_schedule=WEEKDAY_CRON,
            fmt=PARTITION_FMT,
            start=start.strftime(PARTITION_FMT),
            timezone=PARTITION_TIMEZONE,
            end_offset=1,
        )
    first = calendar.sessions(start, calendar.horizon)
    if not first:
        raise ValueError(
            f"{settings.ENV_CALENDAR}={calendar.name}: no session from "
            f"{settings.ENV_PARTITION_START}={start} to {calendar.horizon}"
        )
    cron_days = ",".join(str((d + 1) % 7) for d in calendar.session_weekdays)  # cron: 0 = Sunday
    excluded = calendar.excluded_days(first[0], calendar.horizon)
    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=f"0 0 * * {cron_days}",
        fmt=PARTITION_FMT,
        start=first[0].strftime(PARTITION_FMT),
        timezone=calendar.timezone,
        end_offset=1,
        exclusions=[dt.datetime.combine(day, dt.time()) for day in excluded],
    )


#: The calendar of the code location (``$CORR_PIPELINE_CALENDAR`` when it loads).
snapshot_calendar = configured_calendar()
snapshot_partitions = build_partitions_def(calendar=snapshot_calendar)


def snapshot_date(partition_key: str) -> dt.date:
    """The snapshot date ``D`` a partition key stands for (SPEC §2)."""
    try:
        return dt.datetime.strptime(partition_key, PARTITION_FMT).date()
    except ValueError:
        raise ValueError(
            f"partition key {partition_key!r} is not a snapshot date in YYYY-MM-DD form"
        ) from None


def previous_weekday(day: dt.date) -> dt.date:
    """The last weekday strictly before ``day`` (Friday for a Saturday, Sunday or Monday)."""
    day = day - dt.timedelta(days=1)
    while day.weekday() >= 5:
        day -= dt.timedelta(days=1)
    return day


def weekday_on_or_before(day: dt.date) -> dt.date:
    """``day`` itself if it is a weekday, else the Friday before it."""
    while day.weekday() >= 5:
        day -= dt.timedelta(days=1)
    return day


def partition_key_for(day: dt.date, calendar: SessionCalendar | None = None) -> str:
    """The key of the partition whose snapshot date is the session on or before ``day`` (of
    ``calendar``, default the code location's; under ``weekdays``, the weekday on or before)."""
    calendar = calendar or snapshot_calendar
    if calendar.is_weekdays:
        return weekday_on_or_before(day).strftime(PARTITION_FMT)
    session = calendar.session_on_or_before(day)
    if session is None:
        raise ValueError(f"{day} is before the first session of {calendar.name} ({calendar.first})")
    return session.strftime(PARTITION_FMT)
