"""The price window and returns matrix (SPEC §2) against a plain-Python reference."""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db.schema import prices
from corr_pipeline.db.window import WindowError, load_returns_window


def weekdays(start: dt.date, n: int) -> list[dt.date]:
    out, day = [], start
    while len(out) < n:
        if day.weekday() < 5:
            out.append(day)
        day += dt.timedelta(days=1)
    return out


def insert(engine: sa.Engine, rows: list[tuple[str, dt.date, float]]) -> None:
    with engine.begin() as conn:
        conn.execute(
            prices.insert(), [{"symbol": s, "trade_date": d, "close": c} for s, d, c in rows]
        )


def is_good(close: float) -> bool:
    return math.isfinite(close) and close > 0


def reference_window(rows, snapshot_date, lookback_days, min_history_days):
    """Plain-Python SPEC §2, written independently of the implementation."""
    all_dates = sorted({d for _, d, _ in rows if d <= snapshot_date})
    dates = all_dates[-(lookback_days + 1) :]
    first, last = dates[0], dates[-1]
    in_window = [(s, d, c) for s, d, c in rows if first <= d <= last]
    table: dict[str, dict[dt.date, float]] = {}
    for s, d, c in in_window:
        table.setdefault(s, {})[d] = c
    bad_prices = sum(1 for _, _, c in in_window if not is_good(c))
    kept, dropped, columns = [], [], []
    for s in sorted(table):  # Python str order = code-point order
        col = []
        for t in range(len(dates) - 1):
            c0, c1 = table[s].get(dates[t]), table[s].get(dates[t + 1])
            if c0 is not None and c1 is not None and is_good(c0) and is_good(c1):
                col.append(float(np.float32(math.log(c1 / c0))))
            else:
                col.append(math.nan)
        finite = [x for x in col if not math.isnan(x)]
        if len(finite) < min_history_days:
            dropped.append((s, "few"))
        elif max(finite) == min(finite):
            dropped.append((s, "zero"))
        else:
            kept.append(s)
            columns.append(col)
    R = np.array(columns, dtype=np.float32).T.reshape(len(dates) - 1, len(kept))
    return R, kept, dates, dropped, bad_prices


def assert_matches_reference(window, rows, snapshot_date, lookback_days, min_history_days):
    R, kept, dates, dropped, bad = reference_window(
        rows, snapshot_date, lookback_days, min_history_days
    )
    assert window.symbols == kept
    assert window.dates == dates
    assert window.as_of_trade_date == dates[-1]
    assert window.returns.dtype == np.float32 and window.returns.flags.c_contiguous
    assert window.returns.shape == R.shape
    np.testing.assert_array_equal(np.isnan(window.returns), np.isnan(R))
    finite = ~np.isnan(R)
    # float64 log then float32 cast on both sides: at most 1 ulp apart (libm differences)
    np.testing.assert_array_max_ulp(window.returns[finite], R[finite], maxulp=1)
    assert [s for s, _ in window.dropped] == [s for s, _ in dropped]
    for (_, reason), (_, kind) in zip(window.dropped, dropped, strict=True):
        assert ("too few finite returns" in reason) == (kind == "few")
        assert ("zero variance" in reason) == (kind == "zero")
    assert window.bad_prices == bad
    assert window.n_price_rows == sum(1 for _, d, _ in rows if dates[0] <= d <= dates[-1])


def hand_made_rows() -> tuple[list[tuple[str, dt.date, float]], list[dt.date]]:
    days = weekdays(dt.date(2024, 1, 1), 16)  # Mon 2024-01-01 .. Mon 2024-01-22
    rows: list[tuple[str, dt.date, float]] = []

    def series(symbol, closes_by_index):
        for i, c in closes_by_index.items():
            rows.append((symbol, days[i], c))

    series("AAA", {i: 100.0 * (1.01 ** (i % 5)) + i for i in range(16)})
    series("BBB", {i: 50.0 + math.sin(i) for i in range(9, 16)})  # starts late (ragged)
    series("CCC", {i: 20.0 + (i * 7 % 5) for i in range(16) if i not in (10, 11)})  # halt
    bad = {12: 0.0, 13: -3.0, 9: math.nan, 14: math.inf}
    series("DDD", {i: bad.get(i, 10.0 + (i % 3)) for i in range(16)})  # bad prints
    series("EEE", {i: 42.0 for i in range(16)})  # constant -> zero variance
    series("FFF", {14: 5.0, 15: 6.0})  # too short
    series("OLD", {i: 1.0 + i for i in range(4)})  # delisted before the window
    series("a_low", {i: 3.0 + (i % 3) for i in range(16)})  # lowercase after uppercase
    series("ÉCU", {i: 7.0 + (i % 4) for i in range(16)})  # non-ASCII sorts last
    series("BRK.B", {i: 300.0 + i * i for i in range(16)})
    series("_und", {i: 9.0 + (i % 2) for i in range(16)})  # '_' between upper and lower
    return rows, days


def test_hand_made_window_matches_reference(clean_db):
    rows, days = hand_made_rows()
    insert(clean_db, rows)
    friday = days[14]
    assert friday == dt.date(2024, 1, 19) and friday.weekday() == 4
    saturday = friday + dt.timedelta(days=1)
    window = load_returns_window(clean_db, saturday, lookback_days=8, min_history_days=3)
    assert window.as_of_trade_date == friday  # weekend D -> previous session
    assert len(window.dates) == 9 and window.returns.shape[0] == 8
    assert days[15] not in window.dates  # Monday after D is excluded
    assert_matches_reference(window, rows, saturday, 8, 3)
    assert window.symbols == ["AAA", "BBB", "BRK.B", "CCC", "DDD", "_und", "a_low", "ÉCU"]
    assert dict(window.dropped).keys() == {"EEE", "FFF"}
    assert "zero variance" in dict(window.dropped)["EEE"]
    assert "too few finite returns (0 < min_history_days=3)" in dict(window.dropped)["FFF"]
    assert "OLD" not in window.symbols and "OLD" not in dict(window.dropped)
    # DDD: bad prints at indexes 9, 12, 13, 14 are inside the window -> 4 bad prices
    assert window.bad_prices == 4
    ddd = window.returns[:, window.symbols.index("DDD")]
    assert np.isnan(ddd).sum() == 5  # every return touching a bad print (9, 12, 13, 14)
    # CCC: the halt (two missing days) makes 3 returns NaN, no forward fill
    ccc = window.returns[:, window.symbols.index("CCC")]
    assert np.isnan(ccc).sum() == 3


def test_trading_day_d_and_string_date(clean_db):
    rows, days = hand_made_rows()
    insert(clean_db, rows)
    window = load_returns_window(
        clean_db, days[12].isoformat(), lookback_days=5, min_history_days=2
    )
    assert window.as_of_trade_date == days[12]
    assert window.dates == days[7:13]
    assert_matches_reference(window, rows, days[12], 5, 2)


def test_fewer_dates_than_lookback_uses_all(clean_db):
    rows, days = hand_made_rows()
    insert(clean_db, rows)
    window = load_returns_window(clean_db, days[-1], lookback_days=252, min_history_days=3)
    assert window.dates == days
    assert window.returns.shape[0] == len(days) - 1
    assert_matches_reference(window, rows, days[-1], 252, 3)
    assert "OLD" in window.symbols  # inside the whole-history window: 3 returns, enough
    assert np.isfinite(window.returns[:, window.symbols.index("OLD")]).sum() == 3


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_ragged_table_matches_reference(clean_db, seed):
    rng = random.Random(seed)
    days = weekdays(dt.date(2023, 6, 1), 40)
    rows = []
    for k in range(30):
        symbol = "".join(rng.choice("ABCxyz.é_") for _ in range(rng.randint(1, 4))) + str(k)
        start, stop = rng.randint(0, 20), rng.randint(20, 40)
        price = rng.uniform(5, 500)
        for d in days[start:stop]:
            if rng.random() < 0.1:
                continue  # missing day
            price *= math.exp(rng.gauss(0, 0.02))
            close = price
            if rng.random() < 0.03:
                close = rng.choice([0.0, -price, math.nan, math.inf, -math.inf])
            rows.append((symbol, d, close))
    insert(clean_db, rows)
    snapshot = days[33] + dt.timedelta(days=1)
    window = load_returns_window(clean_db, snapshot, lookback_days=20, min_history_days=5)
    assert_matches_reference(window, rows, snapshot, 20, 5)


def test_errors_are_clear(clean_db):
    with pytest.raises(WindowError, match="prices table is empty"):
        load_returns_window(clean_db, "2024-01-05", lookback_days=5, min_history_days=2)
    rows, days = hand_made_rows()
    insert(clean_db, rows)
    with pytest.raises(
        WindowError, match=r"no prices on or before the snapshot date 2023-12-29.*2024-01-01"
    ):
        load_returns_window(clean_db, dt.date(2023, 12, 29), lookback_days=5, min_history_days=2)
    with pytest.raises(
        WindowError, match=r"only 3 trade date\(s\) on or before 2024-01-03.*2 returns"
    ):
        load_returns_window(clean_db, days[2], lookback_days=10, min_history_days=3)
    with pytest.raises(WindowError, match="min_history_days must be >= 2"):
        load_returns_window(clean_db, days[-1], lookback_days=10, min_history_days=1)
    with pytest.raises(WindowError, match="lookback_days must be >= 1"):
        load_returns_window(clean_db, days[-1], lookback_days=0, min_history_days=2)
    with pytest.raises(WindowError, match="expected a date YYYY-MM-DD"):
        load_returns_window(clean_db, "next tuesday", lookback_days=10, min_history_days=2)


def test_every_symbol_dropped_is_an_error(clean_db):
    days = weekdays(dt.date(2024, 1, 1), 6)
    insert(
        clean_db,
        [("FLAT", d, 10.0) for d in days] + [("SHORT", d, 1.0 + i) for i, d in enumerate(days[:2])],
    )
    with pytest.raises(
        WindowError, match=r"every one of the 2 symbols.*1 with fewer than.*1 with zero variance"
    ):
        load_returns_window(clean_db, days[-1], lookback_days=5, min_history_days=3)


def test_a_session_without_its_prices_is_refused_naming_the_latest_trade_date(clean_db):
    """SPEC §2: a session D with no price dated D fails in one line naming D and the latest
    trade date, in the single and the range read alike; a non-session D (a weekend) still
    snapshots the previous session, and a session with its prices is unchanged."""
    from corr_pipeline.db.window import StaleSessionError, load_returns_windows

    rows, days = hand_made_rows()
    insert(clean_db, rows)
    last = days[-1]
    later = last + dt.timedelta(days=3 if last.weekday() == 4 else 1)  # the next weekday
    with pytest.raises(StaleSessionError) as caught:
        load_returns_window(clean_db, later, lookback_days=5, min_history_days=2, session=True)
    message = str(caught.value)
    assert f"no price dated {later}" in message and "latest trade date" in message
    assert str(last) in message and "\n" not in message
    assert (caught.value.session, caught.value.latest) == (later, last)
    as_before = load_returns_window(clean_db, later, lookback_days=5, min_history_days=2)
    assert as_before.as_of_trade_date == last  # not a session: the previous one's window
    on_time = load_returns_window(clean_db, last, lookback_days=5, min_history_days=2, session=True)
    assert on_time.as_of_trade_date == last
    got = load_returns_windows(
        clean_db, [last, later], lookback_days=5, min_history_days=2, session=True
    )
    assert isinstance(got[later], StaleSessionError) and str(got[later]) == message
    assert np.array_equal(got[last].returns, on_time.returns, equal_nan=True)
