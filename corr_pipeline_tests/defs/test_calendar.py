"""Exchange calendars (issue 14, item 2): partitions are the sessions of CORR_PIPELINE_CALENDAR
(XNYS by default), the schedule fires after each session's close (early on half days), and
backfill ranges cover exactly the sessions; ``weekdays`` keeps the previous behaviour (its
schedule tests are in test_config_and_schedule.py)."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import dagster as dg
import pytest
from dagster._utils.schedules import schedule_execution_time_iterator

from corr_pipeline import settings
from corr_pipeline.definitions import defs
from corr_pipeline.defs import partitions
from corr_pipeline.defs.jobs import build_nightly_schedule, nightly_partition_key
from corr_pipeline.sessions import configured_calendar, get_calendar

NY = zoneinfo.ZoneInfo("America/New_York")
START, END = dt.date(2020, 1, 1), dt.date(2027, 12, 31)
XNYS = get_calendar("XNYS", START, END)
WEEKDAYS = get_calendar("weekdays", START, END)
xnys_partitions = partitions.build_partitions_def(calendar=XNYS)
#: the schedule as the code location would build it on Monday 2025-11-24
xnys_schedule = build_nightly_schedule(XNYS, 90, today=dt.date(2025, 11, 24))
NOW = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
snapshot_job = defs.resolve_job_def("snapshot_job")


def ny(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=NY)


def keys(part: dg.TimeWindowPartitionsDefinition, first: str, last: str) -> list[str]:
    return list(part.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))


def test_the_default_calendar_is_xnys_and_the_code_location_uses_it():
    assert settings.calendar_name() == "XNYS"
    assert partitions.snapshot_calendar.name == "XNYS"
    assert partitions.snapshot_partitions.timezone == "America/New_York"
    assert snapshot_job.partitions_def == partitions.snapshot_partitions


@pytest.mark.parametrize(
    "holiday",
    ["2025-12-25", "2025-04-18", "2025-11-27", "2025-01-01", "2025-01-20", "2025-01-09"],
)  # Christmas, Good Friday, Thanksgiving, New Year, MLK day, the national day of mourning
def test_holidays_have_no_partition(holiday):
    all_keys = xnys_partitions.get_partition_keys(current_time=NOW)
    assert holiday not in all_keys
    assert not XNYS.is_session(dt.date.fromisoformat(holiday))
    # under weekdays they are partitions, as before
    assert holiday in partitions.build_partitions_def(calendar=WEEKDAYS).get_partition_keys(
        current_time=NOW
    )


def test_half_days_are_sessions_and_close_early():
    all_keys = set(xnys_partitions.get_partition_keys(current_time=NOW))
    for half_day in ("2025-11-28", "2025-12-24", "2025-07-03"):
        assert half_day in all_keys
        assert XNYS.local_close(dt.date.fromisoformat(half_day)).time() == dt.time(13, 0)
    assert XNYS.local_close(dt.date(2025, 11, 26)).time() == dt.time(16, 0)
    # partition windows are New York days
    window = xnys_partitions.time_window_for_partition_key("2025-11-26")
    assert (window.start, window.end) == (ny(2025, 11, 26), ny(2025, 11, 27))


def test_a_backfill_range_covers_exactly_its_sessions():
    expected = [d.isoformat() for d in XNYS.sessions(dt.date(2025, 11, 20), dt.date(2026, 1, 5))]
    assert keys(xnys_partitions, "2025-11-20", "2026-01-05") == expected
    assert "2025-11-27" not in expected and "2025-12-25" not in expected
    assert "2026-01-01" not in expected and "2025-11-28" in expected
    assert len(expected) == 30  # 33 weekdays minus three holidays
    # a whole year: exactly the 250 sessions of 2025
    year = keys(xnys_partitions, "2025-01-02", "2025-12-31")
    assert year == [
        d.isoformat() for d in XNYS.sessions(dt.date(2025, 1, 1), dt.date(2025, 12, 31))
    ]
    assert len(year) == 250
    # the job's partitions are these, so `dagster job backfill --from --to` launches these runs
    assert snapshot_job.partitions_def.get_partition_keys_in_range(
        dg.PartitionKeyRange("2025-12-23", "2025-12-29")
    ) == ["2025-12-23", "2025-12-24", "2025-12-26", "2025-12-29"]


def test_the_first_partition_is_the_first_session_on_or_after_the_start(monkeypatch):
    assert xnys_partitions.get_first_partition_key() == "2020-01-02"  # 2020-01-01 is a holiday
    monkeypatch.setenv(settings.ENV_PARTITION_START, "2025-12-25")
    part = partitions.build_partitions_def(calendar=XNYS)
    assert part.get_first_partition_key() == "2025-12-26"
    assert part.get_partition_keys(current_time=ny(2025, 12, 30, 12))[:3] == [
        "2025-12-26", "2025-12-29", "2025-12-30"]  # fmt: skip


def test_the_current_session_partition_exists_from_its_morning():
    at = partitions.build_partitions_def(calendar=XNYS).get_partition_keys
    assert at(current_time=ny(2025, 11, 26, 9))[-1] == "2025-11-26"
    assert at(current_time=ny(2025, 11, 29, 12))[-1] == "2025-11-28"  # Saturday: Friday's
    assert at(current_time=ny(2025, 11, 25, 23, 59))[-1] == "2025-11-25"


def test_the_schedule_fires_after_each_close_early_on_half_days():
    assert sorted(xnys_schedule.cron_schedule) == ["30 14 * * 1-5", "30 17 * * 1-5"]
    assert xnys_schedule.description.startswith(
        "90 min after each XNYS close (17:30 America/New_York; 14:30 on half days): "
        "that session's snapshot."
    )
    assert xnys_schedule.execution_timezone == "America/New_York"
    assert xnys_schedule.default_status == dg.DefaultScheduleStatus.STOPPED

    def run(tick: dt.datetime):
        return xnys_schedule(dg.build_schedule_context(scheduled_execution_time=tick))

    half_day = run(ny(2025, 11, 28, 14, 30))  # 13:00 early close + 90 min
    assert isinstance(half_day, dg.RunRequest)
    assert (half_day.partition_key, half_day.run_key) == ("2025-11-28", "2025-11-28")
    later = run(ny(2025, 11, 28, 17, 30))
    assert isinstance(later, dg.SkipReason) and "closes at 13:00" in later.skip_message
    regular = run(ny(2025, 11, 26, 17, 30))
    assert isinstance(regular, dg.RunRequest) and regular.partition_key == "2025-11-26"
    early_tick = run(ny(2025, 11, 26, 14, 30))
    assert isinstance(early_tick, dg.SkipReason) and "closes at 16:00" in early_tick.skip_message
    holiday = run(ny(2025, 11, 27, 17, 30))
    assert isinstance(holiday, dg.SkipReason)
    assert "2025-11-27 is not a XNYS session" in holiday.skip_message
    # a UTC tick is the same instant: 22:30 UTC is 17:30 New York in November
    assert nightly_partition_key(dt.datetime(2025, 11, 26, 22, 30, tzinfo=dt.UTC), XNYS, 90) == (
        "2025-11-26")  # fmt: skip


def test_every_tick_of_two_months_requests_each_session_once_after_its_close():
    """Walk the schedule's own cron ticks (Dagster's iterator, DST change included) from the
    day it was built: the requested partitions are exactly the sessions, in order, each at its
    close + 90 min."""
    start, end = ny(2025, 11, 24), ny(2026, 1, 24)
    requested: list[tuple[str, dt.datetime]] = []
    for tick in schedule_execution_time_iterator(
        start.timestamp(), xnys_schedule.cron_schedule, xnys_schedule.execution_timezone
    ):
        if tick >= end:
            break
        result = xnys_schedule(dg.build_schedule_context(scheduled_execution_time=tick))
        if isinstance(result, dg.RunRequest):
            requested.append((result.partition_key, tick))
    sessions = XNYS.sessions(start.date(), end.date() - dt.timedelta(days=1))
    assert [key for key, _ in requested] == [s.isoformat() for s in sessions]
    for key, tick in requested:
        close = XNYS.close(dt.date.fromisoformat(key))
        assert tick == close + dt.timedelta(minutes=90)


def test_the_delay_is_configurable(monkeypatch):
    monkeypatch.setenv(settings.ENV_SCHEDULE_DELAY, "30")
    schedule = build_nightly_schedule(XNYS, today=dt.date(2025, 11, 24))
    assert sorted(schedule.cron_schedule) == ["30 13 * * 1-5", "30 16 * * 1-5"]
    assert schedule.description.startswith("30 min after each XNYS close (16:30 America/")
    request = schedule(dg.build_schedule_context(scheduled_execution_time=ny(2025, 11, 28, 13, 30)))
    assert isinstance(request, dg.RunRequest) and request.partition_key == "2025-11-28"
    monkeypatch.setenv(settings.ENV_SCHEDULE_DELAY, "-5")
    with pytest.raises(ValueError, match="CORR_PIPELINE_SCHEDULE_DELAY_MINUTES='-5'"):
        settings.schedule_delay_minutes()


def test_weekdays_keeps_the_previous_partitions(monkeypatch):
    monkeypatch.setenv(settings.ENV_CALENDAR, "weekdays")
    calendar = configured_calendar(today=dt.date(2026, 1, 31))
    assert calendar.is_weekdays and calendar.timezone == "UTC"
    part = partitions.build_partitions_def(calendar=calendar)
    assert part.cron_schedule == "0 0 * * 1-5" and part.timezone == "UTC" and not part.exclusions
    assert "2025-12-25" in keys(part, "2025-12-22", "2025-12-26")
    assert partitions.partition_key_for(dt.date(2025, 12, 27), calendar) == "2025-12-26"


def test_other_calendars_and_unknown_names(monkeypatch):
    xlon = get_calendar("XLON", dt.date(2025, 1, 1), dt.date(2026, 12, 31))
    assert xlon.timezone == "Europe/London"
    assert not xlon.is_session(dt.date(2025, 12, 26))  # Boxing Day
    assert xlon.is_session(dt.date(2025, 11, 27))  # Thanksgiving is a London session
    part = partitions.build_partitions_def(dt.date(2025, 1, 1), calendar=xlon)
    assert part.timezone == "Europe/London"
    assert keys(part, "2025-12-23", "2025-12-30") == [
        "2025-12-23",
        "2025-12-24",
        "2025-12-29",
        "2025-12-30",
    ]
    monkeypatch.setenv(settings.ENV_CALENDAR, "XNSY")
    with pytest.raises(
        ValueError,
        match=r"CORR_PIPELINE_CALENDAR='XNSY' is not a known calendar \(did you mean XNYS",
    ):
        configured_calendar()


def test_session_helpers_for_sensors_and_freshness_checks():
    assert XNYS.session_on_or_before(dt.date(2025, 11, 27)) == dt.date(2025, 11, 26)
    assert XNYS.previous_session(dt.date(2025, 12, 1)) == dt.date(2025, 11, 28)
    delay = dt.timedelta(minutes=90)
    assert XNYS.last_closed_session(ny(2025, 11, 28, 14, 29), delay) == dt.date(2025, 11, 26)
    assert XNYS.last_closed_session(ny(2025, 11, 28, 14, 30), delay) == dt.date(2025, 11, 28)
    assert partitions.partition_key_for(dt.date(2025, 11, 27), XNYS) == "2025-11-26"
    assert partitions.partition_key_for(dt.date(2024, 3, 9), XNYS) == "2024-03-08"


def _brute_sessions_between(calendar, earlier: dt.date, later: dt.date) -> int:
    """Every day strictly between the two dates asked one by one whether it is a session."""
    days = (earlier + dt.timedelta(days=i) for i in range(1, (later - earlier).days))
    return sum(calendar.is_session(day) for day in days)


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        (dt.date(2020, 3, 13), dt.date(2020, 3, 16)),  # Friday -> Monday: consecutive
        (dt.date(2025, 11, 26), dt.date(2025, 11, 28)),  # over Thanksgiving: consecutive
        (dt.date(2025, 11, 26), dt.date(2025, 12, 3)),  # three sessions unpublished
        (dt.date(2020, 3, 14), dt.date(2020, 3, 16)),  # a Saturday before a Monday
        (dt.date(2014, 7, 18), dt.date(2020, 3, 16)),  # before the calendar's first session
        (dt.date(2027, 12, 30), dt.date(2028, 1, 5)),  # past its horizon
    ],
)
def test_sessions_between_counts_every_session_strictly_between(earlier, later):
    """SessionCalendar.sessions_between (the gap a change set records, SPEC §10) is the count of
    the calendar's sessions strictly between the two dates, also outside the calendar's range
    (counted with the same calendar built for that range)."""
    wide = {
        name: get_calendar(name, dt.date(2014, 1, 1), dt.date(2028, 12, 31))
        for name in ("XNYS", "weekdays")
    }
    for calendar in (XNYS, WEEKDAYS):
        expected = _brute_sessions_between(wide[calendar.name], earlier, later)
        assert calendar.sessions_between(earlier, later) == expected, calendar.name
    assert XNYS.sessions_between(dt.date(2014, 7, 18), dt.date(2020, 3, 16)) == 1423
    with pytest.raises(ValueError, match="is not after"):
        XNYS.sessions_between(later, earlier)
