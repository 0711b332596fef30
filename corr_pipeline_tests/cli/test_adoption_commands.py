"""The commands a team adopting the pipeline uses (user guide §13): ``db psql``, ``prices check``
and ``calendar``, run as real subprocesses against the test database."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.engine import libpq_connection
from corr_pipeline.db.price_reads import session_prices, trade_dates
from corr_pipeline.db.price_source import PriceSource
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline_tests.fixtures.commands import run_cli

LAST = dt.date(2026, 11, 27)  # the synthetic universe's last weekday (Friday after Thanksgiving)

VIEW_DDL = """
DROP SCHEMA IF EXISTS market CASCADE;
CREATE SCHEMA market;
CREATE TABLE market.eod_prices (
    ticker text NOT NULL, dt date NOT NULL, adj_close numeric(18,6), volume bigint,
    PRIMARY KEY (ticker, dt));
INSERT INTO market.eod_prices
    SELECT symbol, trade_date, close, 1000 FROM prices WHERE close > 0 AND close < 1e9;
CREATE VIEW market.corr_closes AS
    SELECT ticker AS sym, dt AS session, adj_close AS px FROM market.eod_prices WHERE volume > 0;
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------------
# db psql
# ------------------------------------------------------------------------------------------------


def test_libpq_connection_keeps_the_password_out_of_the_uri() -> None:
    uri, env = libpq_connection("postgresql://alice:p%40ss@db.example:5433/markets?sslmode=require")
    assert uri == "postgresql://alice@db.example:5433/markets?sslmode=require"
    assert env == {"PGPASSWORD": "p@ss"}
    uri, env = libpq_connection("postgresql+psycopg://postgres@:5432/x?host=%2Ftmp%2Fa%20b")
    assert uri == "postgresql://postgres@:5432/x?host=%2Ftmp%2Fa%20b"  # %20, never "+"
    assert env == {}
    uri, env = libpq_connection("postgresql://bob@h/db?password=zz")
    assert "zz" not in uri and env == {"PGPASSWORD": "zz"}


def test_db_psql_runs_sql_on_the_project_database(clean_db: sa.Engine) -> None:
    with clean_db.begin() as conn:
        conn.execute(sa.text("INSERT INTO prices VALUES ('AAA', '2026-11-27', 1.5)"))
    result = run_cli("db", "psql", "-At", "-c", "SELECT symbol || ' ' || close FROM prices")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "AAA 1.5"


def test_db_psql_stops_a_script_at_its_first_error(clean_db: sa.Engine) -> None:
    script = (
        "CREATE TABLE psql_probe (x int);\nSELECT 1/0;\nCREATE TABLE psql_probe_after (x int);\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", "db", "psql"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert result.returncode == 3, (result.returncode, result.stderr)  # ON_ERROR_STOP
        assert "division by zero" in result.stderr
        with clean_db.connect() as conn:
            names = set(
                conn.execute(
                    sa.text("SELECT tablename FROM pg_tables WHERE tablename LIKE 'psql_probe%'")
                ).scalars()
            )
        assert names == {"psql_probe"}
    finally:
        with clean_db.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS psql_probe, psql_probe_after"))


def test_other_commands_still_refuse_unknown_arguments() -> None:
    result = run_cli("db", "url", "-c", "x")
    assert result.returncode == 2
    assert "unrecognized arguments: -c x" in result.stderr


# ------------------------------------------------------------------------------------------------
# prices check
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def market_view(clean_db: sa.Engine):
    write_synthetic_universe(clean_db, n_symbols=30, n_days=60, seed=5)
    with clean_db.begin() as conn:
        conn.exec_driver_sql(VIEW_DDL)
    try:
        yield clean_db
    finally:
        with clean_db.begin() as conn:
            conn.exec_driver_sql("DROP SCHEMA IF EXISTS market CASCADE")


def test_prices_check_reports_the_source_and_its_fit_to_the_calendar(market_view) -> None:
    env = _env(
        **{
            settings.ENV_PRICES_TABLE: "market.corr_closes",
            settings.ENV_PRICES_COLUMNS: "sym,session,px",
        }
    )
    result = run_cli("prices", "check", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "price source market.corr_closes (sym, session, px): view market.corr_closes" in out
    assert "price       px            numeric(18,6)" in out
    source = PriceSource.parse("market.corr_closes", "sym,session,px")
    day = session_prices(market_view, LAST, source)
    assert (
        f"latest trade date {LAST}: {day.symbols} symbols priced; {day.carried} of the "
        f"{day.previous_symbols} symbols priced on {day.previous}" in out
    )
    first = LAST - dt.timedelta(days=29)
    dates = trade_dates(market_view, first, LAST, source)
    assert dt.date(2026, 11, 26) in dates  # the synthetic universe has every weekday
    assert f"calendar XNYS (America/New_York), {first} .. {LAST}:" in out
    assert "trade dates that are not XNYS sessions: 2026-11-26 (" in out
    # under weekdays, Thanksgiving is a session like any other
    weekdays = run_cli("prices", "check", env={**env, settings.ENV_CALENDAR: "weekdays"})
    assert weekdays.returncode == 0, weekdays.stderr
    assert "not weekdays sessions" not in weekdays.stdout
    assert f"calendar weekdays (UTC), {first} .. {LAST}: {len(dates)} sessions" in weekdays.stdout


def test_prices_check_compares_only_dates_from_the_first_partition(market_view) -> None:
    start = {settings.ENV_PARTITION_START: "2026-11-24"}
    result = run_cli("prices", "check", env=_env(**start))
    assert result.returncode == 0, result.stderr
    assert "calendar XNYS (America/New_York), 2026-11-24 .. 2026-11-27: 3 sessions" in result.stdout
    late = run_cli("prices", "check", env=_env(**{settings.ENV_PARTITION_START: "2026-12-20"}))
    assert late.returncode == 0, late.stderr
    assert "the latest trade date is before the first partition (2026-12-21" in late.stdout
    assert "not XNYS sessions" not in late.stdout


def test_prices_check_names_the_first_session_with_a_full_window(market_view) -> None:
    """The first session whose window (SPEC §2: the last lookback_days + 1 trade dates on or
    before it) the prices cover: its window holds them all, the session before it does not."""
    dates = trade_dates(market_view, dt.date(2000, 1, 1), LAST)
    lookback = 20
    first = dates[lookback]  # the 21st trade date: a weekday, not an XNYS holiday here
    assert first.weekday() < 5 and first.month == 10
    held = [d for d in dates if d <= first]
    before = [d for d in dates if d < first]  # the session before: every weekday is one here
    assert len(held) == lookback + 1 and len(before) == lookback
    result = run_cli("prices", "check", "--lookback-days", str(lookback))
    assert result.returncode == 0, result.stderr
    assert (
        f"first session with a full window (lookback_days {lookback}: {lookback + 1} trade "
        f"dates): {first}; the earlier partitions fail for lack of history: backfill from "
        f"{first}, set {settings.ENV_PARTITION_START}={first} (now 2020-01-01)"
    ) in result.stdout
    later = run_cli(
        "prices",
        "check",
        "--lookback-days",
        str(lookback),
        env=_env(**{settings.ENV_PARTITION_START: "2026-11-24"}),
    )
    assert (
        f"dates): {first}; every partition from {settings.ENV_PARTITION_START}=2026-11-24 has one"
    ) in later.stdout
    # the default window, 252 returns, is longer than these 60 days
    default = run_cli("prices", "check")
    assert default.returncode == 0, default.stderr
    assert (
        "first session with a full window (lookback_days 252: 253 trade dates): none yet "
        f"(prices holds fewer than 253 trade dates up to {LAST}" in default.stdout
    )


def test_prices_check_of_an_unusable_source_is_one_line(market_view) -> None:
    env = _env(
        **{
            settings.ENV_PRICES_TABLE: "market.eod_prices",
            settings.ENV_PRICES_COLUMNS: "ticker,dt,volume2",
        }
    )
    result = run_cli("prices", "check", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "has no column volume2" in lines[0]


# ------------------------------------------------------------------------------------------------
# calendar
# ------------------------------------------------------------------------------------------------


def test_calendar_lists_sessions_holidays_and_when_each_run_starts() -> None:
    result = run_cli("calendar", "--from", "2026-12-23", "--to", "2026-12-28")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert rows == [
        ["2026-12-23", "Wed", "16:00", "17:30", "19:00", "23:30"],
        ["2026-12-24", "Thu", "13:00", "14:30", "16:00", "20:30"],  # half day
        ["2026-12-25", "Fri", "closed", "no", "partition"],  # Christmas
        ["2026-12-28", "Mon", "16:00", "17:30", "19:00", "23:30"],
    ]
    assert "3 sessions (partitions), times in America/New_York" in result.stdout
    later = run_cli(
        "calendar",
        "--from",
        "2026-12-23",
        "--to",
        "2026-12-23",
        env=_env(
            **{
                settings.ENV_SCHEDULE_DELAY: "60",
                settings.ENV_SENSOR_CUTOFF_MINUTES: "480",
                settings.ENV_FRESHNESS_HOURS: "2",
            }
        ),
    )
    assert later.stdout.splitlines()[2].split() == [
        "2026-12-23", "Wed", "16:00", "17:00", "00:00", "+1d", "19:00"
    ]  # fmt: skip


def test_calendar_under_weekdays_runs_friday_on_monday() -> None:
    result = run_cli(
        "calendar",
        "--from",
        "2026-11-26",
        "--to",
        "2026-11-30",
        env=_env(**{settings.ENV_CALENDAR: "weekdays"}),
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [r[:2] for r in rows] == [
        ["2026-11-26", "Thu"],
        ["2026-11-27", "Fri"],
        ["2026-11-30", "Mon"],
    ]
    assert rows[1][4:6] == ["06:30", "+3d"]  # Friday's snapshot: Monday 06:30 UTC
    assert rows[0][4:6] == ["06:30", "+1d"]


def test_calendar_refuses_a_reversed_range() -> None:
    result = run_cli("calendar", "--from", "2026-12-23", "--to", "2026-12-01")
    assert result.returncode == 2
    assert "--to 2026-12-01 is before --from 2026-12-23" in result.stderr
