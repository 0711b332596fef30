"""The snapshot job and its nightly schedule.

``snapshot_job`` materializes the whole ``correlation_snapshot`` group (every asset and its
checks) for one partition, or for a range of consecutive sessions (a run of a backfill,
:mod:`corr_pipeline.defs.ranges`), in one process where the run fits
(:mod:`corr_pipeline.defs.executor`). Its run tag carries the operational limit:

- ``dagster/max_runtime``: the run is terminated and marked failed after this many seconds
  (enforced by the daemon's run monitoring, enabled in ``dagster.yaml``). Default
  :data:`corr_pipeline.settings.DEFAULT_MAX_RUNTIME_SECONDS`, override with ``$CORR_PIPELINE_MAX_RUNTIME_SECONDS``.

How many snapshot runs start at once (the ``corr_pipeline_snapshot`` pool, sized by memory) and
one run per partition are limits of the run queue, whatever launched the run:
:mod:`corr_pipeline.defs.concurrency`.

``nightly_snapshot_schedule`` requests each session's partition once its prices should be in,
with ``run_key`` = partition key so a session is never launched twice by the schedule:

- under an exchange calendar (``XNYS``, the default): at the session's close plus
  ``$CORR_PIPELINE_SCHEDULE_DELAY_MINUTES`` (default 90), in the exchange's time zone. A cron
  schedule cannot say "close + delay" when closes differ (half days close early), so the
  schedule carries one cron string per distinct local fire time, each on every weekday
  (``30 17 * * 1-5`` and, for the half days, ``30 14 * * 1-5`` on XNYS, which the UI reads
  as "At 05:30 PM ..., Monday through Friday"; the description says "90 min after each XNYS
  close (17:30 America/New_York; 14:30 on half days)") and each tick requests the session whose close +
  delay is exactly the tick; the other ticks skip, saying why (on a regular day, the
  early-close tick; on a half day, the regular one). Holidays have no session, so no run.
- under ``weekdays``: today's behaviour, unchanged: 06:30 UTC Monday to Friday, requesting the
  previous weekday (Friday's on Monday).

Both are created stopped. :func:`build_nightly_schedule` builds it for any calendar and delay.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.defs.partitions import (
    PARTITION_FMT,
    PARTITION_TIMEZONE,
    previous_weekday,
    snapshot_calendar,
)
from corr_pipeline.defs.step_options import SNAPSHOT_GROUP
from corr_pipeline.sessions import SessionCalendar

NIGHTLY_CRON = "30 6 * * 1-5"


def snapshot_run_tags() -> dict[str, str]:
    """Run tags of every snapshot run: its maximum runtime."""
    return {dg.MAX_RUNTIME_SECONDS_TAG: str(settings.max_runtime_seconds())}


snapshot_job = dg.define_asset_job(
    name="snapshot_job",
    # every asset and check of the group but the freshness check (defs/monitoring.py): it is
    # about the latest session, not the run's partition, and is evaluated by its own sensor
    selection=dg.AssetSelection.groups(SNAPSHOT_GROUP)
    - dg.AssetSelection.checks(
        dg.AssetCheckKey(dg.AssetKey("snapshot_publication"), "publication_freshness")
    ),
    tags=snapshot_run_tags(),
    description="Materialize the correlation snapshot (window, correlation, neighbors, "
    "clusters, lead-lag, publication) and its checks for one snapshot date. Launch backfill on "
    "this page makes one run per session (a job backfill); for a range of history use the asset "
    "graph's Materialize (runs of consecutive sessions) or `corr-pipeline backfill`.",
)


def nightly_partition_key(
    scheduled_time: dt.datetime,
    calendar: SessionCalendar | None = None,
    delay_minutes: int | None = None,
) -> str | None:
    """Partition the nightly tick at ``scheduled_time`` should build, or None.

    ``weekdays``: the weekday before the tick's date (in UTC), None before the first partition.
    An exchange calendar: the session whose close + ``delay_minutes`` (default
    :func:`settings.schedule_delay_minutes`) is the tick, to the minute; None if no session
    closed then or it is before the first partition."""
    calendar = calendar or snapshot_calendar
    when = scheduled_time.astimezone(dt.UTC) if scheduled_time.tzinfo else scheduled_time
    if calendar.is_weekdays:
        day = previous_weekday(when.date())
    else:
        delay = dt.timedelta(minutes=_delay(delay_minutes))
        session = calendar.session_fired_at(when, delay)
        if session is None:
            return None
        day = session
    if day < settings.partition_start():
        return None
    return day.strftime(PARTITION_FMT)


def _delay(delay_minutes: int | None) -> int:
    return settings.schedule_delay_minutes() if delay_minutes is None else int(delay_minutes)


def _skip_reason(
    scheduled: dt.datetime, calendar: SessionCalendar, delay_minutes: int
) -> dg.SkipReason:
    start = settings.partition_start()
    if calendar.is_weekdays:
        return dg.SkipReason(
            f"the previous weekday of {scheduled:%Y-%m-%d} is before the first partition "
            f"({start:%Y-%m-%d})"
        )
    local = scheduled.astimezone(zoneinfo.ZoneInfo(calendar.timezone))
    session = calendar.session_fired_at(scheduled, dt.timedelta(minutes=delay_minutes))
    if session is not None:  # it fired, but for a session before the first partition
        return dg.SkipReason(
            f"session {session} of {calendar.name} is before the first partition ({start})"
        )
    if local.date() < start:
        return dg.SkipReason(f"{local:%Y-%m-%d} is before the first partition ({start:%Y-%m-%d})")
    today = calendar.session_on_or_before(local.date())
    if today == local.date():
        closes = calendar.local_close(today)
        return dg.SkipReason(
            f"no {calendar.name} session closed {delay_minutes} min before {local:%Y-%m-%d %H:%M} "
            f"{calendar.timezone}: session {today} closes at {closes:%H:%M}, its snapshot is "
            "requested at another tick"
        )
    return dg.SkipReason(
        f"{local:%Y-%m-%d} is not a {calendar.name} session (holiday or weekend): no snapshot"
    )


def build_nightly_schedule(
    calendar: SessionCalendar | None = None,
    delay_minutes: int | None = None,
    *,
    today: dt.date | None = None,
) -> dg.ScheduleDefinition:
    """``nightly_snapshot_schedule`` for ``calendar`` (default the code location's) and
    ``delay_minutes`` (default :func:`settings.schedule_delay_minutes`); see the module
    docstring. The cron strings of an exchange calendar cover the fire times of its sessions
    from a week before ``today`` (default: now, UTC) to the calendar's horizon."""
    calendar = calendar or snapshot_calendar
    delay = _delay(delay_minutes)
    if calendar.is_weekdays:
        cron: str | list[str] = NIGHTLY_CRON
        timezone = PARTITION_TIMEZONE
        description = "06:30 UTC Mon-Fri: snapshot of the previous weekday's session."
    else:
        today = today or dt.datetime.now(dt.UTC).date()
        since = max(today - dt.timedelta(days=7), calendar.first)
        cron = calendar.fire_crons(dt.timedelta(minutes=delay), since)
        timezone = calendar.timezone
        description = calendar.fire_description(delay, since)

    @dg.schedule(
        name="nightly_snapshot_schedule",
        cron_schedule=cron,
        execution_timezone=timezone,
        job=snapshot_job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=description,
    )
    def nightly_snapshot_schedule(context: dg.ScheduleEvaluationContext):
        scheduled = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
        key = nightly_partition_key(scheduled, calendar, delay)
        if key is None:
            return _skip_reason(scheduled, calendar, delay)
        return dg.RunRequest(run_key=key, partition_key=key)

    return nightly_snapshot_schedule


nightly_snapshot_schedule = build_nightly_schedule()
