"""``load_returns_windows`` (several sessions in one read) against ``load_returns_window`` run
day by day: every field identical (returns bit for bit), or the same WindowError; one dates scan
and one grouped price query whatever the number of days.

Universes: synthetic (ragged histories, halts, bad prints), hand-made edge cases in ``prices``
(a symbol whose only rows in a window are bad prices, listings and delistings in the middle of
the union, a holiday, windows too short, every symbol dropped, days far apart), and a team's
table with other column names, ``timestamp`` trade dates and NULL prices on given dates.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator, Sequence

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource, PriceSourceError
from corr_pipeline.db.schema import prices
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.db.window import (
    ReturnsWindow,
    WindowError,
    load_returns_window,
    load_returns_windows,
)

Row = tuple[str, dt.date, float | None]


def weekdays(start: dt.date, n: int) -> list[dt.date]:
    out, day = [], start
    while len(out) < n:
        if day.weekday() < 5:
            out.append(day)
        day += dt.timedelta(days=1)
    return out


def insert(engine: sa.Engine, rows: list[Row]) -> None:
    with engine.begin() as conn:
        conn.execute(
            prices.insert(), [{"symbol": s, "trade_date": d, "close": c} for s, d, c in rows]
        )


def trade_dates(engine: sa.Engine) -> list[dt.date]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT DISTINCT trade_date FROM prices ORDER BY 1")).scalars()
        )


def assert_same(batch: ReturnsWindow | WindowError, single: ReturnsWindow | WindowError) -> None:
    """Every field but the timings, returns bit for bit."""
    if isinstance(single, WindowError):
        assert isinstance(batch, WindowError), batch
        assert type(batch) is type(single) and str(batch) == str(single)
        return
    assert isinstance(batch, ReturnsWindow), batch
    assert batch.returns.dtype == single.returns.dtype == np.float32
    assert batch.returns.flags.c_contiguous and single.returns.flags.c_contiguous
    assert batch.returns.shape == single.returns.shape
    assert np.array_equal(batch.returns, single.returns, equal_nan=True)
    assert batch.returns.tobytes() == single.returns.tobytes()  # NaN bits included
    assert batch.symbols == single.symbols
    assert batch.dates == single.dates
    assert all(type(d) is dt.date for d in batch.dates)
    assert batch.as_of_trade_date == single.as_of_trade_date
    assert batch.dropped == single.dropped
    assert batch.drop_counts == single.drop_counts
    assert batch.bad_prices == single.bad_prices
    assert batch.n_price_rows == single.n_price_rows
    assert batch.source == single.source
    assert batch.source_notes == single.source_notes
    assert set(batch.timings) == set(single.timings)
    assert all(v >= 0 for v in batch.timings.values())


def compare(
    engine: sa.Engine,
    days: Sequence[dt.date | str],
    lookback_days: int,
    min_history_days: int,
    source: PriceSource = NATIVE_PRICES,
) -> dict[dt.date, ReturnsWindow | WindowError]:
    """``load_returns_windows`` equals ``load_returns_window`` day by day; returns the batch."""
    batch = load_returns_windows(
        engine,
        days,
        lookback_days=lookback_days,
        min_history_days=min_history_days,
        source=source,
    )
    distinct = sorted({d if isinstance(d, dt.date) else dt.date.fromisoformat(d) for d in days})
    assert list(batch) == distinct  # ascending, duplicates merged
    for day in distinct:
        single: ReturnsWindow | WindowError
        try:
            single = load_returns_window(
                engine,
                day,
                lookback_days=lookback_days,
                min_history_days=min_history_days,
                source=source,
            )
        except WindowError as error:
            single = error
        assert_same(batch[day], single)
    return batch


def windows_of(batch: dict) -> dict[dt.date, ReturnsWindow]:
    return {d: w for d, w in batch.items() if isinstance(w, ReturnsWindow)}


def errors_of(batch: dict) -> dict[dt.date, str]:
    return {d: str(w) for d, w in batch.items() if isinstance(w, WindowError)}


# --------------------------------------------------------------------------------------------
# synthetic universes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_symbols", "n_days", "seed", "lookback", "min_history"),
    [(60, 90, 1, 40, 20), (150, 70, 7, 20, 5), (40, 50, 23, 60, 30)],
)
def test_synthetic_universe_day_by_day(clean_db, n_symbols, n_days, seed, lookback, min_history):
    write_synthetic_universe(clean_db, n_symbols=n_symbols, n_days=n_days, seed=seed)
    dates = trade_dates(clean_db)
    rng = random.Random(seed)
    # the last 25 calendar days (weekends included), the first sessions (too short), a day
    # before any price, a few scattered sessions; shuffled, with duplicates and ISO strings
    tail = [dates[-1] - dt.timedelta(days=i) for i in range(25)]
    days: list[dt.date | str] = [
        *tail,
        *dates[:4],
        dates[0] - dt.timedelta(days=3),
        dates[min_history],
        dates[min_history + 1],
        dates[len(dates) // 2],
        tail[3].isoformat(),
        tail[5],
    ]
    rng.shuffle(days)
    batch = compare(clean_db, days, lookback, min_history)
    windows = windows_of(batch)
    assert len(windows) >= 15
    assert any(w.dropped for w in windows.values())
    assert any(w.bad_prices for w in windows.values())
    errors = errors_of(batch)
    assert errors[dates[0] - dt.timedelta(days=3)].startswith("no prices on or before")
    assert "trade date(s) on or before" in errors[dates[0]]


def test_consecutive_sessions_of_a_backfill(clean_db):
    write_synthetic_universe(clean_db, n_symbols=100, n_days=80, seed=5)
    dates = trade_dates(clean_db)
    batch = compare(clean_db, dates[-30:], 40, 30)
    assert len(windows_of(batch)) == 30
    assert [w.as_of_trade_date for w in windows_of(batch).values()] == dates[-30:]


# --------------------------------------------------------------------------------------------
# hand-made edge cases
# --------------------------------------------------------------------------------------------


def edge_rows() -> tuple[list[Row], list[dt.date]]:
    """40 weekdays from Mon 2024-01-01, one holiday (index 17, no rows at all)."""
    days = weekdays(dt.date(2024, 1, 1), 40)
    rows: list[Row] = []

    def series(symbol: str, closes: dict[int, float]) -> None:
        rows.extend((symbol, days[i], c) for i, c in closes.items() if i != 17)

    series("AAA", {i: 100.0 * 1.01 ** (i % 7) + i for i in range(40)})
    series("CCC", {i: 20.0 + (i * 7 % 5) for i in range(40) if i not in (10, 11, 25)})  # halts
    series("LATE", {i: 50.0 + math.sin(i) for i in range(21, 40)})  # lists mid-union
    series("GONE", {i: 3.0 + (i % 4) for i in range(0, 14)})  # delists mid-union
    series("FLAT", {i: 42.0 for i in range(40)})  # zero variance
    # only bad prices in the windows around 26..28, good ones far before
    bad = [math.nan, 0.0, -2.0]
    series("BADW", {**{i: 9.0 + i for i in range(0, 5)}, **{26 + k: bad[k] for k in range(3)}})
    series("ÉCU", {i: 7.0 + (i % 4) for i in range(40)})  # sorts last by code point
    series("_und", {i: 9.0 + (i % 2) for i in range(40)})
    series("DDD", {i: {30: math.inf, 31: -math.inf}.get(i, 10.0 + i % 3) for i in range(40)})
    series("GAP", {i: 5.0 + i for i in range(15, 19)})  # rows only between two far-apart windows
    return rows, days


def test_edge_cases_day_by_day(clean_db):
    rows, days = edge_rows()
    insert(clean_db, rows)
    holiday, saturday = days[17], days[24] + dt.timedelta(days=1)
    assert saturday.weekday() == 5
    requested: list[dt.date | str] = [
        *days[::-1],  # every session, the holiday included, in reverse order
        saturday,
        saturday + dt.timedelta(days=1),
        days[-1] + dt.timedelta(days=30),  # after the last price: snapshots the last session
        dt.date(2023, 12, 29),  # before any price
        days[3].isoformat(),  # duplicate, as a string
        days[3],
        days[26],
        days[26],
    ]
    batch = compare(clean_db, requested, 6, 3)
    windows, errors = windows_of(batch), errors_of(batch)
    assert windows[holiday].as_of_trade_date == days[16]
    assert windows[saturday].as_of_trade_date == days[24]
    assert errors[dt.date(2023, 12, 29)] == (
        "no prices on or before the snapshot date 2023-12-29 (the earliest trade_date in prices "
        "is 2024-01-01)"
    )
    assert "only 3 trade date(s) on or before 2024-01-03" in errors[days[2]]
    # BADW: in the windows that hold its bad prices only, present and dropped; absent after
    assert "BADW" in dict(windows[days[28]].dropped)
    assert windows[days[28]].bad_prices >= 3
    assert all("BADW" not in dict(w.dropped) for d, w in windows.items() if d >= days[35])
    assert "LATE" not in windows[days[20]].symbols + [s for s, _ in windows[days[20]].dropped]
    assert "LATE" in dict(windows[days[22]].dropped) and "LATE" in windows[days[30]].symbols
    assert "GONE" in windows[days[12]].symbols and "GONE" not in windows[days[30]].symbols


def test_days_far_apart_read_only_their_windows(clean_db):
    """Two windows with a gap between them: the gap's rows (symbol GAP) are in neither."""
    rows, days = edge_rows()
    insert(clean_db, rows)
    saturday = days[9] + dt.timedelta(days=1)
    batch = compare(clean_db, [days[39], days[9], saturday], 5, 3)
    windows = windows_of(batch)
    assert set(windows) == {days[9], saturday, days[39]}
    for window in windows.values():
        assert "GAP" not in window.symbols + [s for s, _ in window.dropped]
    assert windows[saturday].dates == windows[days[9]].dates == days[4:10]


def test_every_symbol_dropped_in_one_window_only(clean_db):
    days = weekdays(dt.date(2024, 3, 4), 10)
    rows: list[Row] = [("FLAT", d, 10.0) for d in days]
    rows += [("MOVE", d, 1.0 + i % 3) for i, d in enumerate(days) if i >= 4]
    insert(clean_db, rows)
    batch = compare(clean_db, days, 3, 2)
    errors = errors_of(batch)
    assert "only 1 trade date(s)" in errors[days[0]] and "only 2 trade date(s)" in errors[days[1]]
    assert "every one of the 1 symbols" in errors[days[3]]  # FLAT only
    assert "every one of the 2 symbols" in errors[days[5]]  # MOVE: 1 return
    assert set(windows_of(batch)) == set(days[6:])


def test_an_empty_table_and_no_usable_window(clean_db):
    batch = compare(clean_db, ["2024-01-05", dt.date(2024, 1, 8)], 5, 2)
    assert all(
        "no prices at all: the prices table is empty" in e for e in errors_of(batch).values()
    )
    insert(clean_db, [("AAA", d, 1.0 + i) for i, d in enumerate(weekdays(dt.date(2024, 1, 1), 3))])
    batch = compare(clean_db, ["2024-01-02", "2024-01-05", "2023-06-01"], 5, 3)
    assert not windows_of(batch)


def test_arguments(clean_db):
    assert load_returns_windows(clean_db, [], lookback_days=5, min_history_days=2) == {}
    with pytest.raises(WindowError, match="lookback_days must be >= 1"):
        load_returns_windows(clean_db, ["2024-01-05"], lookback_days=0, min_history_days=2)
    with pytest.raises(WindowError, match="min_history_days must be >= 2"):
        load_returns_windows(clean_db, ["2024-01-05"], lookback_days=5, min_history_days=1)
    with pytest.raises(WindowError, match="expected a date YYYY-MM-DD"):
        load_returns_windows(clean_db, ["next tuesday"], lookback_days=5, min_history_days=2)
    with pytest.raises(WindowError, match="a sequence of dates"):
        load_returns_windows(clean_db, "2024-01-05", lookback_days=5, min_history_days=2)


# --------------------------------------------------------------------------------------------
# a team's table: other names, timestamp dates, NULL prices
# --------------------------------------------------------------------------------------------


@pytest.fixture
def team_table(clean_db: sa.Engine) -> Iterator[sa.Engine]:
    with clean_db.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA IF EXISTS team CASCADE; CREATE SCHEMA team")
    try:
        yield clean_db
    finally:
        with clean_db.begin() as conn:
            conn.exec_driver_sql("DROP SCHEMA IF EXISTS team CASCADE")


@pytest.mark.parametrize(("kind", "indexed"), [("timestamp", True), ("date", False)])
def test_a_source_with_null_prices_on_given_dates(team_table, kind, indexed):
    engine = team_table
    rows, days = edge_rows()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE team.eod ("Ticker" varchar(12), at {kind}, px numeric(18,6))'
        )
        if indexed:
            conn.exec_driver_sql("CREATE INDEX ON team.eod (at)")
        stamp = "+ time '16:00'" if kind == "timestamp" else ""
        values = [
            {"t": s, "d": d, "p": None if c is not None and math.isinf(c) else c}
            for s, d, c in rows
        ]
        conn.execute(
            sa.text(f"INSERT INTO team.eod VALUES (:t, CAST(:d AS date) {stamp}, :p)"), values
        )
        # NULL prices on given dates; a symbol whose only rows are NULL prices (days 30..33);
        # a row without a symbol
        conn.exec_driver_sql(
            "UPDATE team.eod SET px = NULL WHERE \"Ticker\" = 'AAA' "
            "AND at::date IN ('2024-01-09', '2024-02-06', '2024-02-07')"
        )
        conn.exec_driver_sql(
            f"INSERT INTO team.eod SELECT 'NULLS', d {stamp}, NULL "
            "FROM unnest(ARRAY['2024-02-12', '2024-02-13', '2024-02-14', '2024-02-15']::date[]) d"
        )
        conn.exec_driver_sql(f"INSERT INTO team.eod VALUES (NULL, DATE '2024-02-20' {stamp}, 1)")
    source = PriceSource.parse("team.eod", '"Ticker",at,px')
    batch = compare(engine, [*days, days[-1] + dt.timedelta(days=2), days[0]], 8, 4, source)
    windows = windows_of(batch)
    assert len(windows) > 25
    assert all(w.source == 'table team.eod ("Ticker", at, px)' for w in windows.values())
    assert all(bool(w.source_notes) is not indexed for w in windows.values())
    with_nulls = windows[days[32]]
    assert "NULLS" in dict(with_nulls.dropped)  # present by its NULL rows only
    assert "NULLS" not in dict(windows[days[25]].dropped)  # before it appears
    # a window holding only NULL prices: every symbol dropped, as one day's read says too
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE team.eod SET px = NULL WHERE at::date <= '2024-01-03'")
    batch = compare(engine, days[:6], 2, 2, source)
    assert "every one of the" in errors_of(batch)[days[2]]


def test_duplicates_in_the_union_fail_the_call(team_table):
    engine = team_table
    days = weekdays(dt.date(2024, 1, 1), 10)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE team.loose (ticker text, dt date, px float8)")
        conn.execute(
            sa.text("INSERT INTO team.loose VALUES (:t, :d, :p)"),
            [{"t": s, "d": d, "p": 1.0 + i % 3 + j} for i, d in enumerate(days) for j, s in
             enumerate(["A", "B"])] + [{"t": "B", "d": days[4], "p": 2.5}],
        )  # fmt: skip
    source = PriceSource.parse("team.loose", "ticker,dt,px")
    with pytest.raises(PriceSourceError, match=r"1 duplicate row\(s\).*symbol 'B' on 2024-01-05"):
        load_returns_windows(engine, days[5:], lookback_days=3, min_history_days=2, source=source)
    with pytest.raises(PriceSourceError, match="team.missing"):
        load_returns_windows(
            engine,
            days,
            lookback_days=3,
            min_history_days=2,
            source=PriceSource.parse("team.missing", "ticker,dt,px"),
        )


# --------------------------------------------------------------------------------------------
# the statements: one dates scan, one grouped price query
# --------------------------------------------------------------------------------------------


@pytest.fixture
def statements(monkeypatch) -> list[str]:
    """The text of every statement any psycopg cursor executes (SQLAlchemy's included)."""
    seen: list[str] = []
    execute = psycopg.Cursor.execute

    def recording(self, query, params=None, **kwargs):
        text = query if isinstance(query, str | bytes) else query.as_string(self.connection)
        seen.append(text.decode() if isinstance(text, bytes) else text)
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    return seen


def _price_reads(statements: list[str]) -> tuple[int, int]:
    """(date scans, grouped price queries) among ``statements``."""
    scans = sum("WITH RECURSIVE" in s for s in statements)
    grouped = sum("string_agg(" in s and "GROUP BY" in s for s in statements)
    return scans, grouped


@pytest.mark.parametrize("far_apart", [False, True])
def test_one_dates_scan_and_one_grouped_query(clean_db, statements, far_apart):
    write_synthetic_universe(clean_db, n_symbols=50, n_days=120, seed=3)
    dates = trade_dates(clean_db)
    days = [dates[20], dates[60], *dates[-15:]] if far_apart else dates[-20:]
    statements.clear()
    batch = load_returns_windows(clean_db, days, lookback_days=30, min_history_days=10)
    assert len(windows_of(batch)) == len(set(days))
    assert _price_reads(statements) == (1, 1)
    union = [s for s in statements if "string_agg(" in s][0]
    assert union.count(" OR ") == (2 if far_apart else 0)  # three runs of dates, or one
    # the counter does count: one day at a time reads once per day
    statements.clear()
    for day in days[:5]:
        load_returns_window(clean_db, day, lookback_days=30, min_history_days=10)
    assert _price_reads(statements) == (5, 5)
