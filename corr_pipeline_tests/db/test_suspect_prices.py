"""Suspect prices (SPEC §2), read from a real PostgreSQL: a symbol whose share of zero returns
exceeds ``max_zero_return_share`` (stale closes) or whose largest |log return| exceeds
``max_abs_return`` (a price error) is listed with both figures, equal to a brute-force reference
computed from the inserted closes; kept by default, dropped with that reason under
``drop_suspect``; a figure exactly at its threshold is not suspect (strict ``>``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from corr_pipeline.compute.suspect import SuspectScreen, suspect_figures
from corr_pipeline.db.window import (
    SUSPECT_PRICES,
    WindowError,
    load_returns_window,
    load_returns_windows,
)
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline_tests.fixtures.suspect_prices import (
    DAYS,
    GOOD,
    HISTORY,
    LOOKBACK,
    D,
    price_error_prices,
    reference_figures,
    stale_prices,
)
from corr_pipeline_tests.reliability import helpers as h


@pytest.fixture
def universe(clean_db):
    rows = h.factor_prices(GOOD, DAYS, seed=11)
    rows += stale_prices("STALE", n_zero=12, seed=1)  # 12 / 40 = 0.30 > 0.25
    rows += price_error_prices("JUMP", seed=2)  # ln 3 = 1.0986 > 0.5
    h.insert_prices(clean_db, rows)
    return clean_db, rows


def test_stale_and_price_error_symbols_are_listed_with_both_figures(universe):
    engine, rows = universe
    window = load_returns_window(engine, D, lookback_days=LOOKBACK, min_history_days=HISTORY)
    ref = reference_figures(rows)
    assert [s.symbol for s in window.suspects] == ["JUMP", "STALE"]
    for suspect in window.suspects:
        share, largest = ref[suspect.symbol]
        assert suspect.zero_return_share == share
        assert suspect.max_abs_return == pytest.approx(largest, rel=1e-7, abs=0)
        assert suspect.dropped is False
    by_name = {s.symbol: s for s in window.suspects}
    assert by_name["STALE"].zero_return_share == 0.3
    assert "stale closes" in by_name["STALE"].reason
    assert "max_zero_return_share=0.25" in by_name["STALE"].reason
    assert "price error" not in by_name["STALE"].reason
    assert abs(by_name["JUMP"].max_abs_return - math.log(3.0)) < 0.05  # ln 3 and a day's move
    jump = by_name["JUMP"].reason
    assert "price error" in jump and "max_abs_return=0.5" in jump
    # the others are not suspect by the reference either, and every symbol is kept
    clean = {s for s, (share, largest) in ref.items() if share <= 0.25 and largest <= 0.5}
    assert clean == set(GOOD)
    assert window.symbols == sorted([*GOOD, "JUMP", "STALE"])
    assert window.dropped == [] and window.drop_counts[SUSPECT_PRICES] == 0
    # the figures of every kept column, vectorised, equal the loop's
    share, largest = suspect_figures(window.returns)
    for j, symbol in enumerate(window.symbols):
        assert share[j] == ref[symbol][0]
        assert largest[j] == pytest.approx(ref[symbol][1], rel=1e-7, abs=0)
    # a range's window reports the same suspects
    batch = load_returns_windows(
        engine, [DAYS[-2], D], lookback_days=LOOKBACK, min_history_days=HISTORY
    )[D]
    assert not isinstance(batch, WindowError)
    assert batch.suspects == window.suspects


def test_drop_suspect_removes_them_with_the_reason(universe):
    engine, rows = universe
    params = SnapshotParameters(
        lookback_days=LOOKBACK, min_history_days=HISTORY, min_overlap=20, drop_suspect=True
    )
    window = load_returns_window(
        engine,
        D,
        lookback_days=LOOKBACK,
        min_history_days=HISTORY,
        suspect_screen=params.suspect_screen,
    )
    assert window.symbols == GOOD
    assert [s.symbol for s in window.suspects] == ["JUMP", "STALE"]
    assert all(s.dropped for s in window.suspects)
    assert [symbol for symbol, _ in window.dropped] == ["JUMP", "STALE"]
    for (_, reason), suspect in zip(window.dropped, window.suspects, strict=True):
        assert reason.startswith("suspect prices (drop_suspect): ")
        assert suspect.reason in reason
    assert window.drop_counts[SUSPECT_PRICES] == 2
    batch = load_returns_windows(
        engine,
        [D],
        lookback_days=LOOKBACK,
        min_history_days=HISTORY,
        suspect_screen=params.suspect_screen,
    )[D]
    assert not isinstance(batch, WindowError)
    assert (batch.symbols, batch.dropped) == (window.symbols, window.dropped)


def test_a_figure_exactly_at_its_threshold_is_not_suspect(clean_db):
    """10 zero returns of 40 is a share of exactly 0.25: not above the default; 11 is. A
    largest |R| equal to max_abs_return is not above it; the next float below makes it
    suspect."""
    rows = h.factor_prices(GOOD, DAYS, seed=5)
    rows += stale_prices("AT", n_zero=10, seed=3) + stale_prices("ABOVE", n_zero=11, seed=4)
    h.insert_prices(clean_db, rows)
    window = load_returns_window(clean_db, D, lookback_days=LOOKBACK, min_history_days=HISTORY)
    ref = reference_figures(rows)
    assert ref["AT"][0] == 0.25 and ref["ABOVE"][0] == 11 / 40
    assert [s.symbol for s in window.suspects] == ["ABOVE"]

    largest = max(ref.values(), key=lambda figures: figures[1])[1]
    j = max(ref, key=lambda s: ref[s][1])
    _, reported = suspect_figures(window.returns)
    at = SuspectScreen(max_zero_return_share=1.0, max_abs_return=float(reported.max()))
    assert float(reported.max()) == pytest.approx(largest, rel=1e-7, abs=0)
    exactly = load_returns_window(
        clean_db, D, lookback_days=LOOKBACK, min_history_days=HISTORY, suspect_screen=at
    )
    assert exactly.suspects == []
    below = SuspectScreen(
        max_zero_return_share=1.0, max_abs_return=float(np.nextafter(reported.max(), 0))
    )
    just_below = load_returns_window(
        clean_db, D, lookback_days=LOOKBACK, min_history_days=HISTORY, suspect_screen=below
    )
    assert [s.symbol for s in just_below.suspects] == [j]
    assert just_below.suspects[0].reason.startswith("price error")


def test_every_symbol_suspect_and_dropped_fails_in_one_line(clean_db):
    rows = stale_prices("S1", n_zero=20, seed=6) + price_error_prices("S2", seed=7)
    h.insert_prices(clean_db, rows)
    with pytest.raises(WindowError) as refused:
        load_returns_window(
            clean_db,
            D,
            lookback_days=LOOKBACK,
            min_history_days=HISTORY,
            suspect_screen=SuspectScreen(drop=True),
        )
    message = str(refused.value)
    assert "2 with suspect prices" in message and "\n" not in message
    assert "0 with zero variance" in message


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_zero_return_share", 0.0, "max_zero_return_share must lie in (0, 1]"),
        ("max_zero_return_share", 1.5, "max_zero_return_share must lie in (0, 1]"),
        ("max_zero_return_share", float("nan"), "max_zero_return_share must lie in (0, 1]"),
        ("max_abs_return", 0.0, "max_abs_return must be a finite number > 0"),
        ("max_abs_return", -1.0, "max_abs_return must be a finite number > 0"),
        ("max_abs_return", float("inf"), "max_abs_return must be a finite number > 0"),
    ],
)
def test_thresholds_out_of_range_are_refused_naming_the_field(field, value, says):
    with pytest.raises(ValueError) as refused:
        SnapshotParameters(**{field: value})
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_thresholds_at_their_bounds_are_accepted_and_recorded():
    params = SnapshotParameters(max_zero_return_share=1.0, max_abs_return=1e-9)
    assert params.as_dict()["max_zero_return_share"] == 1.0
    assert params.as_dict()["max_abs_return"] == 1e-9
    assert params.as_dict()["drop_suspect"] is False
    assert SnapshotParameters(drop_suspect=True).suspect_screen.drop is True
