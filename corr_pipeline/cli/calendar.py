"""``corr-pipeline calendar [--from D] [--to D]``: the sessions (partitions) of the configured
calendar, and when the schedule, the prices sensor's cut-off and the freshness check act on each.

For every session ``s`` in the range, in the exchange's time zone (UTC under ``weekdays``):

- ``close``: its close (a half day closes early; a ``weekdays`` day "closes" at 24:00 UTC);
- ``schedule``: when ``nightly_snapshot_schedule`` requests it: close +
  ``CORR_PIPELINE_SCHEDULE_DELAY_MINUTES``; under ``weekdays`` the next weekday's 06:30 UTC tick;
- ``sensor cut-off``: close + ``CORR_PIPELINE_SENSOR_CUTOFF_MINUTES``, when ``prices_ready_sensor``
  runs it however complete its prices are;
- ``stale after``: close + the schedule delay + ``CORR_PIPELINE_FRESHNESS_HOURS``, when
  ``publication_freshness`` turns red if it is not published.

Weekdays of the range that are not sessions (holidays) are listed as closed. The range starts
no earlier than the first partition. Reads no database.
"""

from __future__ import annotations

import argparse
import datetime as dt
import zoneinfo
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import UsageError, echo, iso_date

__all__ = ["add_calendar_command", "cmd_calendar"]

#: Default range: today and the next two weeks.
DEFAULT_DAYS = 14
#: ``weekdays``: the nightly schedule's tick (``corr_pipeline.defs.jobs.NIGHTLY_CRON``, 06:30 UTC).
WEEKDAYS_TICK = dt.time(6, 30)


def _local(when: dt.datetime, zone: zoneinfo.ZoneInfo, day: dt.date) -> str:
    """``HH:MM`` of ``when`` in ``zone``, with ``+Nd`` when it falls N days after ``day``."""
    local = when.astimezone(zone)
    later = (local.date() - day).days
    return f"{local:%H:%M}" + (f" +{later}d" if later else "")


def cmd_calendar(args: argparse.Namespace) -> int:
    """Print the sessions of ``CORR_PIPELINE_CALENDAR`` from ``args.start`` to ``args.end``
    with the times the module docstring lists."""
    from corr_pipeline.query.render import format_table
    from corr_pipeline.sessions import configured_calendar

    today = dt.datetime.now(dt.UTC).date()
    start = args.start or today
    end = args.end or start + dt.timedelta(days=DEFAULT_DAYS)
    if end < start:
        raise UsageError(f"--to {end} is before --from {start}")
    calendar = configured_calendar(max(today, end))
    if start < calendar.first:  # the calendar starts at the first partition
        echo(
            f"(from {calendar.first}, the first partition: {settings.ENV_PARTITION_START}="
            f"{settings.partition_start()})"
        )
        start = max(start, calendar.first)
    zone = zoneinfo.ZoneInfo(calendar.timezone)
    delay = dt.timedelta(minutes=settings.schedule_delay_minutes())
    cutoff = dt.timedelta(minutes=settings.sensor_cutoff_minutes())
    stale = delay + dt.timedelta(hours=settings.freshness_hours())
    sessions = calendar.sessions(start, end)
    holidays = calendar.excluded_days(start, end)
    rows: list[tuple[str, ...]] = []
    for day in sorted([*sessions, *holidays]):
        if day in holidays:
            rows.append((f"{day}", f"{day:%a}", "closed", "no partition", "", ""))
            continue
        close = calendar.close(day)
        if calendar.is_weekdays:
            tick = day + dt.timedelta(days=1)
            while tick.weekday() >= 5:
                tick += dt.timedelta(days=1)
            scheduled = dt.datetime.combine(tick, WEEKDAYS_TICK, tzinfo=dt.UTC)
        else:
            scheduled = close + delay
        rows.append(
            (
                f"{day}",
                f"{day:%a}",
                _local(close, zone, day),
                _local(scheduled, zone, day),
                _local(close + cutoff, zone, day),
                _local(close + stale, zone, day),
            )
        )
    echo(
        f"calendar {calendar.name}, {start} .. {end}: {len(sessions)} sessions "
        f"(partitions), times in {calendar.timezone}"
    )
    if rows:
        headers = ("session", "day", "close", "schedule", "sensor cut-off", "stale after")
        echo(format_table(headers, rows, "llllll"))
    return 0


def add_calendar_command(commands: Any) -> None:
    """Register ``calendar`` on the sub-command parser ``commands``."""
    calendar = commands.add_parser(
        "calendar",
        help="the sessions (partitions) of CORR_PIPELINE_CALENDAR and when the schedule, the "
        "prices sensor's cut-off and the freshness check act on each",
    )
    calendar.add_argument(
        "--from", dest="start", type=iso_date, default=None, metavar="D", help="default: today"
    )
    calendar.add_argument(
        "--to",
        dest="end",
        type=iso_date,
        default=None,
        metavar="D",
        help=f"default: --from + {DEFAULT_DAYS} days",
    )
    calendar.set_defaults(func=cmd_calendar)
