"""Synthetic universe model (pure numpy): the generator's promised properties.

Every property is checked against an independent computation on the generated arrays (plain
numpy over the closes, the way the pipeline would see them), not against the generator's own
bookkeeping alone. The database load is tested in ``corr_pipeline_tests/db/test_synth.py``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from corr_pipeline.synth import (
    BAD_PRINT_KINDS,
    DEFAULT_END_DATE,
    MAX_LAG,
    REALISTIC_TICKERS,
    generate_universe,
)

N_SMALL, T_SMALL = 400, 150


@pytest.fixture(scope="module")
def universe():
    return generate_universe(N_SMALL, T_SMALL, seed=11)


def _bits(a: np.ndarray) -> np.ndarray:
    """float64 array as raw uint64 bits: bit-for-bit comparison, NaN payloads included."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def _pairwise_corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation over rows where both are finite (SPEC §3 pairwise-complete)."""
    both = np.isfinite(x) & np.isfinite(y)
    return float(np.corrcoef(x[both], y[both])[0, 1])


def _spec_returns(close: np.ndarray, present: np.ndarray) -> np.ndarray:
    """SPEC §2 returns by a plain loop (independent of SyntheticUniverse.log_returns)."""
    n_days, n_symbols = close.shape
    out = np.full((n_days - 1, n_symbols), np.nan)
    for j in range(n_symbols):
        for t in range(n_days - 1):
            a, b = close[t, j], close[t + 1, j]
            if present[t, j] and present[t + 1, j] and np.isfinite(a) and np.isfinite(b):
                if a > 0 and b > 0:
                    out[t, j] = np.log(b / a)
    return out


def test_same_seed_gives_bit_identical_universe(universe):
    again = generate_universe(N_SMALL, T_SMALL, seed=11)
    assert np.array_equal(_bits(universe.close), _bits(again.close))
    assert np.array_equal(universe.present, again.present)
    assert np.array_equal(universe.symbols, again.symbols)
    assert np.array_equal(universe.dates, again.dates)
    for name in ("truth", "halts", "bad_prints", "first_row", "end_row", "sector"):
        assert np.array_equal(getattr(universe, name), getattr(again, name)), name


def test_different_seed_gives_different_universe(universe):
    other = generate_universe(N_SMALL, T_SMALL, seed=12)
    assert np.array_equal(universe.symbols, other.symbols)  # names depend on N only
    finite = np.isfinite(universe.close) & np.isfinite(other.close)
    assert not np.allclose(universe.close[finite], other.close[finite])
    assert universe.truth_symbols() != other.truth_symbols()
    assert not np.array_equal(universe.present, other.present)


def test_dates_are_weekdays_ending_at_end_date():
    default = generate_universe(20, 30, seed=0)
    assert default.dates.dtype == np.dtype("datetime64[D]")
    assert default.dates.shape == (30,)
    assert default.dates[-1] == np.datetime64(DEFAULT_END_DATE)
    assert np.all(np.diff(default.dates).astype(int) > 0)
    assert np.is_busday(default.dates).all()
    # every weekday between first and last is present (no gaps in the calendar)
    assert np.busday_count(default.dates[0], default.dates[-1]) == 29
    # a Sunday rolls back to the Friday before; ISO strings are accepted
    sunday = generate_universe(20, 30, seed=0, end_date="2024-03-10")
    assert sunday.dates[-1] == np.datetime64("2024-03-08")
    assert dt.date(2024, 3, 10).weekday() == 6


def test_symbols_unique_sorted_ascii(universe):
    names = [str(s) for s in universe.symbols]
    assert len(set(names)) == len(names) == N_SMALL
    assert names == sorted(names)  # code-point order
    assert all(name.isascii() and name for name in names)
    assert set(REALISTIC_TICKERS) <= set(names)
    small = generate_universe(20, 30, seed=0)
    assert all(str(s).startswith("S") for s in small.symbols)


def test_ragged_histories(universe):
    n_days = universe.n_days
    present = universe.present
    has_row = present.any(axis=0)
    assert has_row.all()
    # first and last existing row per symbol, measured on the mask
    first = present.argmax(axis=0)
    last = n_days - 1 - present[::-1].argmax(axis=0)
    listed_late = first > 0
    delisted_early = last < n_days - 1
    assert 0.10 <= listed_late.mean() <= 0.15
    assert 0.05 <= delisted_early.mean() <= 0.10
    assert np.array_equal(listed_late, universe.listed_late)
    assert np.array_equal(delisted_early, universe.delisted_early)
    # no row outside the history, close NaN where no row exists
    rows = np.arange(n_days)[:, None]
    assert not present[(rows < universe.first_row) | (rows >= universe.end_row)].any()
    assert np.isnan(universe.close[~present]).all()
    assert universe.n_rows == int(present.sum())


def test_single_day_halts(universe):
    present = universe.present
    assert universe.halts.shape[0] > 0
    # find halts independently: a missing row with existing rows before and after it
    missing_inside = []
    for j in range(universe.n_symbols):
        rows = np.flatnonzero(present[:, j])
        gaps = np.flatnonzero(np.diff(rows) > 1)
        for g in gaps:
            assert rows[g + 1] - rows[g] == 2, "a halt lasts exactly one weekday"
            missing_inside.append((j, rows[g] + 1))
    recorded = sorted((int(h["symbol"]), int(h["row"])) for h in universe.halts)
    assert sorted(missing_inside) == recorded
    # the halt day is a weekday inside the calendar (dates have no gaps)
    for _symbol, t in recorded:
        assert np.is_busday(universe.dates[t])


def test_bad_prints_of_every_kind(universe):
    close, present = universe.close, universe.present
    bad = present & ~(np.isfinite(close) & (close > 0))
    found = {(int(j), int(t)) for t, j in zip(*np.nonzero(bad), strict=True)}
    recorded = {(int(b["symbol"]), int(b["row"])) for b in universe.bad_prints}
    assert found == recorded
    values = close[universe.bad_prints["row"], universe.bad_prints["symbol"]]
    kinds = universe.bad_prints["kind"]
    assert set(kinds) == set(BAD_PRINT_KINDS)
    assert (values[kinds == "zero"] == 0).all()
    assert (values[kinds == "negative"] < 0).all()
    assert np.isnan(values[kinds == "nan"]).all()
    assert np.isposinf(values[kinds == "inf"]).all()
    assert universe.bad_print_counts() == {k: int((kinds == k).sum()) for k in BAD_PRINT_KINDS}


def test_log_returns_follow_spec_rule():
    small = generate_universe(40, 25, seed=3)
    expected = _spec_returns(small.close, small.present)
    got = small.log_returns()
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], rtol=1e-12)
    # every bad print and halt makes the returns touching it NaN
    for b in small.bad_prints:
        t, j = int(b["row"]), int(b["symbol"])
        if t > 0:
            assert np.isnan(got[t - 1, j])
        if t < small.n_days - 1:
            assert np.isnan(got[t, j])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_injected_pairs_are_pure_lead_lag(seed):
    u = generate_universe(N_SMALL, T_SMALL, seed=seed)
    returns = u.log_returns()
    truth = u.truth
    assert truth.shape[0] == max(5, N_SMALL // 200)
    members = np.concatenate([truth["leader"], truth["lagger"]])
    assert np.unique(members).shape[0] == members.shape[0], "leaders and laggers all distinct"
    assert set(truth["lag"].tolist()) <= set(range(1, MAX_LAG + 1))
    for pair in truth:
        leader, lagger, lag = int(pair["leader"]), int(pair["lagger"]), int(pair["lag"])
        x, y = returns[:, leader], returns[:, lagger]
        lagged = {ell: _pairwise_corr(x[:-ell], y[ell:]) for ell in range(1, MAX_LAG + 1)}
        sync = _pairwise_corr(x, y)
        assert lagged[lag] > 0.5, (seed, pair)
        assert abs(sync) < 0.15, (seed, pair)
        # the recorded lag is the best one, and the reverse direction carries nothing
        assert max(lagged, key=lambda ell: abs(lagged[ell])) == lag
        assert abs(_pairwise_corr(y[:-lag], x[lag:])) < 0.3
        # the leader's own lagged returns are not correlated with its current ones
        assert abs(_pairwise_corr(x[:-lag], x[lag:])) < 0.3
        # pair symbols have complete, clean histories
        assert np.isfinite(x).all() and np.isfinite(y).all()


def test_factor_structure_and_fat_tails(universe):
    returns = universe.log_returns()
    clean = np.isfinite(returns).all(axis=0) & (universe.sector >= 0)
    cols = np.flatnonzero(clean)[:250]
    corr = np.corrcoef(returns[:, cols].T)
    sector = universe.sector[cols]
    same = sector[:, None] == sector[None, :]
    off_diag = ~np.eye(cols.shape[0], dtype=bool)
    within = corr[same & off_diag].mean()
    across = corr[~same].mean()
    assert within > across + 0.1
    assert across > 0.05  # the market factor
    standardized = (returns[:, cols] - returns[:, cols].mean(axis=0)) / returns[:, cols].std(axis=0)
    excess_kurtosis = (standardized**4).mean() - 3.0
    assert excess_kurtosis > 0.5
    vol = np.nanstd(returns, axis=0)
    assert np.percentile(vol, 90) / np.percentile(vol, 10) > 2.0


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="n_symbols must be >= 10"):
        generate_universe(5, 100, seed=0)
    with pytest.raises(ValueError, match="n_days must be >= 10"):
        generate_universe(100, 3, seed=0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        generate_universe(100, 30, seed=-1)
    with pytest.raises(TypeError, match="n_symbols must be an integer"):
        generate_universe(100.0, 30, seed=0)
    with pytest.raises(ValueError, match="end_date must be YYYY-MM-DD"):
        generate_universe(100, 30, seed=0, end_date="27/11/2026")
