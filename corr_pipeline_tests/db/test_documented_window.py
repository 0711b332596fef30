"""What README.md and the user guide say about the window holds (SPEC §2): a symbol without a
price on one day (the documented Boxing Day example: a London symbol in an XNYS universe) loses
the return into that day and the return out of it; no return spans the gap; a symbol missing
one day in three keeps a third of its returns and is dropped when that is too few."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.schema import prices
from corr_pipeline.db.window import load_returns_window

ROOT = Path(__file__).resolve().parents[2]
BOXING_DAY = dt.date(2025, 12, 26)  # an XNYS session, a London holiday


def _weekdays(last: dt.date, n: int) -> list[dt.date]:
    days, day = [], last
    while len(days) < n:
        if day.weekday() < 5 and day != dt.date(2025, 12, 25):
            days.append(day)
        day -= dt.timedelta(days=1)
    return days[::-1]


def test_the_documents_say_what_the_window_does():
    readme = " ".join((ROOT / "README.md").read_text().split())
    guide = " ".join((ROOT / "docs" / "user_guide.md").read_text().split())
    for text in (readme, guide):
        assert "over the gap" not in text  # no return spans a missing day
    assert "has no return into that day nor out of it (both are NaN" in readme
    assert "the return into that day and the return out of it are both NaN" in guide
    assert "a symbol missing one day in three keeps about a third of its returns" in guide


def test_the_documented_example_holds(clean_db: sa.Engine):
    days = _weekdays(dt.date(2026, 1, 9), 30)
    rng = np.random.default_rng(4)
    rows = []
    for symbol in ("LON", "NYA", "THIRD"):
        close = 100.0
        for i, day in enumerate(days):
            close *= math.exp(float(rng.normal(0, 0.01)))
            if symbol == "LON" and day == BOXING_DAY:
                continue  # London closed
            if symbol == "THIRD" and i % 3 == 2:
                continue  # missing one day in three
            rows.append({"symbol": symbol, "trade_date": day, "close": close})
    with clean_db.begin() as conn:
        conn.execute(prices.insert(), rows)
    window = load_returns_window(clean_db, days[-1], lookback_days=29, min_history_days=15)
    assert window.dates == days
    R = window.returns
    lon, nya = window.symbols.index("LON"), window.symbols.index("NYA")
    gap = days.index(BOXING_DAY)  # R[t] is the return from dates[t] to dates[t + 1]
    assert np.isnan(R[gap - 1, lon]) and np.isnan(R[gap, lon])  # into and out of the day
    assert np.isfinite(np.delete(R[:, lon], [gap - 1, gap])).all()
    assert np.isfinite(R[:, nya]).all()
    assert np.isfinite(R[:, lon]).sum() == R.shape[0] - 2  # two returns lost, none spans it
    # THIRD: one finite return per three days (present, present, missing): dropped, too few
    assert "THIRD" not in window.symbols
    (reason,) = [r for s, r in window.dropped if s == "THIRD"]
    assert reason.startswith("too few finite returns (10 < min_history_days=15)"), reason
