"""The window load applies the import's symbol rules to prices written by plain SQL (SPEC §1):
an over-long or malformed symbol fails the window in one line, before any matrix exists."""

from __future__ import annotations

import datetime as dt

import pytest

from corr_pipeline.db.window import WindowError, load_returns_window, load_returns_windows
from corr_pipeline_tests.reliability import helpers as h

D = dt.date(2026, 11, 27)


@pytest.mark.parametrize(
    ("symbol", "says"),
    [
        ("X" * 2_000, "a symbol of 2,000 characters (at most 64)"),  # the key's index holds ~2.7 kB
        ("Y" * 65, "a symbol of 65 characters (at most 64)"),
        ("BAD\u200bSYM", "U+200B ZERO WIDTH SPACE"),
        (" PADDED", "leading or trailing whitespace"),
    ],
)
def test_a_symbol_the_import_would_refuse_fails_the_window_in_one_line(clean_db, symbol, says):
    days = h.weekdays(D, 45)
    h.insert_prices(clean_db, h.factor_prices(["AAA", "BBB", "CCC"], days, seed=3))
    h.insert_prices(clean_db, [(symbol, day, 10.0 + i) for i, day in enumerate(days)])
    with pytest.raises(WindowError) as refused:
        load_returns_window(clean_db, D, lookback_days=40, min_history_days=30)
    message = str(refused.value)
    assert says in message and "fix it in the price source" in message
    assert "\n" not in message and len(message) < 400  # the symbol itself is never pasted whole
    with pytest.raises(WindowError, match="fix it in the price source"):
        load_returns_windows(clean_db, [days[-2], D], lookback_days=40, min_history_days=30)
