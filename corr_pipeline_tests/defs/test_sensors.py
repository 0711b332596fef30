"""``prices_ready_sensor`` against the embedded database, evaluated with Dagster's sensor
testing tools (``dg.build_sensor_context``), the clock turned by hand."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import dagster as dg
import pytest
import sqlalchemy as sa

from corr_pipeline.db.price_reads import session_prices
from corr_pipeline.db.schema import prices
from corr_pipeline.definitions import defs
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource
from corr_pipeline.defs.sensors import (
    COMPLETENESS_TAG,
    FINGERPRINT_TAG,
    RERUN_TAG,
    TRIGGER_TAG,
    PricesSensorSettings,
    build_prices_ready_sensor,
)
from corr_pipeline.sessions import get_calendar

XNYS = get_calendar("XNYS", dt.date(2024, 1, 1), dt.date(2026, 12, 31))
NY = zoneinfo.ZoneInfo("America/New_York")
PREVIOUS, SESSION = dt.date(2025, 6, 9), dt.date(2025, 6, 10)  # Monday, Tuesday
SYMBOLS = [f"S{i:03d}" for i in range(100)]


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2025, 6, 10, 16, 30, tzinfo=NY)  # 30 min after the close

    def __call__(self) -> dt.datetime:
        return self.now


def _insert(engine: sa.Engine, day: dt.date, symbols: list[str], close: float = 100.0) -> None:
    with engine.begin() as conn:
        conn.execute(
            prices.insert(), [{"symbol": s, "trade_date": day, "close": close} for s in symbols]
        )


@pytest.fixture
def sensor_env(clean_db):
    clock = Clock()
    sensor = build_prices_ready_sensor(XNYS, clock=clock)
    resources = {
        "postgres": PostgresResource(),
        "price_source": PriceSourceResource(),
        "prices_sensor_settings": PricesSensorSettings(min_share=0.95, cutoff_minutes=120),
    }
    state = {"cursor": None}

    def evaluate():
        with dg.build_sensor_context(resources=resources, cursor=state["cursor"]) as context:
            result = sensor(context)
        if isinstance(result, dg.SensorResult):
            if result.cursor is not None:
                state["cursor"] = result.cursor
            if result.run_requests:
                return result.run_requests
            result = result.skip_reason
        assert isinstance(result, dg.SkipReason)
        return result.skip_message  # the reason, as text

    _insert(clean_db, PREVIOUS, SYMBOLS)
    return clean_db, clock, evaluate


def test_the_counting_read(sensor_env):
    engine, _, _ = sensor_env
    _insert(engine, SESSION, SYMBOLS[:90] + ["NEW"])
    p = session_prices(engine, SESSION)
    assert (p.previous, p.symbols, p.previous_symbols, p.carried) == (PREVIOUS, 91, 100, 90)
    assert p.completeness == pytest.approx(0.9)
    assert p.fingerprint.startswith("91-")
    empty = session_prices(engine, dt.date(2025, 6, 11))
    assert (empty.symbols, empty.fingerprint, empty.previous) == (0, "0", SESSION)


def test_incomplete_complete_same_corrected(sensor_env):
    engine, clock, evaluate = sensor_env
    _insert(engine, SESSION, SYMBOLS[:90])
    skip = evaluate()
    assert "90.0% complete" in skip and "below 95%" in skip

    _insert(engine, SESSION, SYMBOLS[90:96])  # 96 %
    clock.now += dt.timedelta(minutes=5)
    (request,) = evaluate()
    assert request.partition_key == "2025-06-10"
    assert request.tags[TRIGGER_TAG] == "complete" and request.tags[COMPLETENESS_TAG] == "0.960"
    assert RERUN_TAG not in request.tags
    assert request.run_key == f"2025-06-10:{request.tags[FINGERPRINT_TAG]}"

    clock.now += dt.timedelta(minutes=5)
    again = evaluate()
    assert isinstance(again, str) and "already requested" in again

    with engine.begin() as conn:  # a correction
        conn.execute(
            prices.update()
            .where(prices.c.symbol == "S005", prices.c.trade_date == SESSION)
            .values(close=101.5)
        )
    clock.now += dt.timedelta(minutes=5)
    settling = evaluate()
    assert isinstance(settling, str) and "changed since its run" in settling
    clock.now += dt.timedelta(minutes=5)
    (rerun,) = evaluate()
    assert rerun.tags[RERUN_TAG] == "correction" and rerun.partition_key == "2025-06-10"
    assert rerun.run_key != request.run_key
    assert rerun.run_key == f"2025-06-10:{rerun.tags[FINGERPRINT_TAG]}"
    clock.now += dt.timedelta(minutes=5)
    assert "already requested" in evaluate()


def test_the_cutoff_runs_an_incomplete_day_saying_how_complete(sensor_env):
    engine, clock, evaluate = sensor_env
    _insert(engine, SESSION, SYMBOLS[:80])
    assert "waiting" in evaluate()
    clock.now = dt.datetime(2025, 6, 10, 18, 0, tzinfo=NY)  # close + 120 min
    (request,) = evaluate()
    assert request.tags[TRIGGER_TAG] == "cutoff"
    assert request.tags[COMPLETENESS_TAG] == "0.800"
    assert request.tags["corr_pipeline/symbols"] == "80/100"


def test_no_price_at_all_is_never_run(sensor_env):
    _, clock, evaluate = sensor_env
    clock.now = dt.datetime(2025, 6, 11, 9, 0, tzinfo=NY)
    assert "no price for it at all" in evaluate()


def test_the_sensor_is_registered_stopped_next_to_the_schedule():
    sensor = defs.resolve_sensor_def("prices_ready_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert sensor.job_name == "snapshot_job"
    schedule = defs.resolve_schedule_def("nightly_snapshot_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
