"""Lead-lag p- and q-values against a float64 brute force over every ordered pair (SPEC §6)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erfc

from corr_pipeline.compute.lead_lag import find_lead_lag_pairs
from corr_pipeline.compute.lead_lag.significance import pair_significance
from corr_pipeline.compute.lead_lag.sweep import Sweep, sweep_inputs
from corr_pipeline.compute.standardize import standardize
from corr_pipeline.compute.workers import worker_pool
from corr_pipeline.synth import generate_universe


def _ragged_returns(seed: int, n_rows: int, n_cols: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    R[: n_rows // 8, 1 % n_cols] = np.nan  # listed late
    R[-n_rows // 5 :, 2 % n_cols] = np.nan  # delisted
    R[n_rows // 3 : n_rows // 3 + 4, 3 % n_cols] = np.nan  # halted
    R[:, 4 % n_cols] = np.nan  # almost never traded: no best lag
    R[:3, 4 % n_cols] = 1.0
    R[:, 5 % n_cols] = 0.25  # constant: zero variance
    R[1:, 6 % n_cols] = 0.7 * R[:-1, 7 % n_cols] + 0.3 * R[1:, 6 % n_cols]  # 7 leads 6
    return R


def _brute_force(R: np.ndarray, max_lag: int, min_overlap: int):
    """Every ordered pair with a best lag, its Šidák p-value and its q-value over all of them,
    from plain float64 loops (SPEC §6): the best lag by float32 |Pearson r| (ties to the
    smaller lag), the robust statistic of the columns less their own means there."""
    X = R.astype(np.float64)
    n_rows, n_cols = X.shape
    finite = np.isfinite(X)
    means = np.array(
        [X[finite[:, j], j].mean() if finite[:, j].any() else 0.0 for j in range(n_cols)]
    )
    pairs, p_values = [], []
    for i in range(n_cols):
        for j in range(n_cols):
            if i == j:
                continue
            best, best_t = np.float32(-1), 0.0
            for lag in range(1, max_lag + 1):
                x, y = X[: n_rows - lag, i], X[lag:, j]
                ok = np.isfinite(x) & np.isfinite(y)
                n = int(ok.sum())
                if n < min_overlap:
                    continue
                a, b = x[ok] - x[ok].mean(), y[ok] - y[ok].mean()
                denominator = np.sqrt((a * a).sum() * (b * b).sum())
                if denominator == 0:
                    continue
                r = float((a * b).sum() / denominator)
                if np.float32(abs(r)) > best:
                    a, b = x[ok] - means[i], y[ok] - means[j]
                    squares = float(((a * b) ** 2).sum())
                    best = np.float32(abs(r))
                    best_t = float((a * b).sum()) / np.sqrt(squares) if squares > 0 else 0.0
            if best >= 0:
                p = erfc(abs(best_t) / np.sqrt(2.0))
                p_values.append(-np.expm1(max_lag * np.log1p(-p)))
                pairs.append((i, j))
    p = np.array(p_values)
    order = np.argsort(p, kind="stable")
    m = p.size
    ranked = p[order] * m / np.arange(1, m + 1)
    q = np.empty(m)
    q[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    return np.array(pairs).reshape(-1, 2), p, q


def _assert_q_values(got: np.ndarray, expected: np.ndarray) -> None:
    """SPEC §6: within a relative 1e-3, or 1e-5 absolute, whichever is larger."""
    error = np.abs(got - expected)
    worst = int(np.argmax(error - np.maximum(1e-3 * expected, 1e-5)))
    assert np.all(error <= np.maximum(1e-3 * expected, 1e-5)), (got[worst], expected[worst])


@pytest.mark.parametrize(
    ("seed", "n_rows", "n_cols", "max_lag", "min_overlap"),
    [(0, 60, 9, 1, 10), (1, 80, 25, 3, 10), (2, 120, 40, 5, 60), (3, 40, 12, 2, 35)],
)
def test_every_pair_matches_the_float64_brute_force(seed, n_rows, n_cols, max_lag, min_overlap):
    R = _ragged_returns(seed, n_rows, n_cols)
    pairs, p, q = _brute_force(R, max_lag, min_overlap)
    got = pair_significance(R, pairs[:, 0], pairs[:, 1], max_lag=max_lag, min_overlap=min_overlap)
    assert got.m == p.size
    np.testing.assert_allclose(got.p_value, p, rtol=0, atol=1e-5)
    _assert_q_values(got.q_value, q)
    subset = np.random.default_rng(seed).permutation(p.size)[: p.size // 3]
    part = pair_significance(
        R, pairs[subset, 0], pairs[subset, 1], max_lag=max_lag, min_overlap=min_overlap
    )
    np.testing.assert_array_equal(part.q_value, got.q_value[subset])


def test_blocks_do_not_change_the_values():
    R = _ragged_returns(4, 90, 30)
    pairs, _, _ = _brute_force(R, 3, 20)
    runs = [
        pair_significance(R, pairs[:, 0], pairs[:, 1], max_lag=3, min_overlap=20, block_rows=b)
        for b in (1, 7, None)
    ]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.p_value, runs[0].p_value)
        np.testing.assert_array_equal(other.q_value, runs[0].q_value)


def test_noise_is_not_significant_and_injected_pairs_are():
    rng = np.random.default_rng(5)
    R = rng.standard_normal((250, 120)).astype(np.float32)
    leaders, laggers = np.arange(0, 20, 2), np.arange(1, 20, 2)
    R[1:, laggers] = 0.6 * R[:-1, leaders] + 0.8 * R[1:, laggers]
    everyone = np.array([(i, j) for i in range(120) for j in range(120) if i != j])
    got = pair_significance(R, everyone[:, 0], everyone[:, 1], max_lag=5, min_overlap=50)
    significant = {tuple(pair) for pair in everyone[got.q_value <= 0.05]}
    injected = set(zip(leaders.tolist(), laggers.tolist(), strict=True))
    assert injected <= significant
    assert len(significant - injected) <= 2  # BH at 0.05: few false discoveries among 14,270


@pytest.mark.parametrize(
    ("leaders", "laggers", "message"),
    [([0], [0], "with itself"), ([0], [9], "outside"), ([4], [0], "no best lag")],
)
def test_bad_pairs_are_refused(leaders, laggers, message):
    R = _ragged_returns(6, 50, 9)
    with pytest.raises(ValueError, match=message):
        pair_significance(R, np.array(leaders), np.array(laggers), max_lag=2, min_overlap=10)


def test_the_scan_reports_the_injected_pairs_as_significant_and_noise_as_not():
    """Through ``find_lead_lag_pairs``: on the synthetic universe of the demo (factor model,
    ragged histories, halts, bad prints, injected pure lead-lag pairs) every injected pair is
    reported with q <= 0.05; on white noise of the same shape nearly nothing is, though the
    scan still reports each symbol's best pairs."""
    universe = generate_universe(600, 253, seed=3)
    R = universe.log_returns().astype(np.float32)
    params = dict(max_lag=5, k_leaders=10, k_laggers=10, min_overlap=60)
    pairs = find_lead_lag_pairs(R, **params)
    by_pair = {(int(a), int(b)): q for a, b, q in pairs[["leader", "lagger", "q_value"]]}
    for truth in universe.truth:
        q = by_pair.get((int(truth["leader"]), int(truth["lagger"])))
        assert q is not None and q <= 0.05, (truth, q)
    significant = int(np.count_nonzero(pairs["q_value"] <= 0.05))
    assert significant < 4 * len(universe.truth), significant

    noise = np.random.default_rng(9).standard_normal(R.shape).astype(np.float32)
    noise_pairs = find_lead_lag_pairs(noise, **params)
    assert noise_pairs.size > 5_000
    assert np.count_nonzero(noise_pairs["q_value"] <= 0.05) <= 2
    only = find_lead_lag_pairs(noise, **params, max_q_value=0.05)
    assert only.size <= 2


def _ragged_universe() -> tuple[np.ndarray, int, int]:
    """Leaders and laggers listed late, delisted, halted, both at once, a column never traded."""
    rng = np.random.default_rng(11)
    n_rows, n_cols = 70, 150
    R = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    first = rng.integers(0, n_rows // 2, n_cols) * (rng.random(n_cols) < 0.4)
    last = n_rows - rng.integers(0, n_rows // 2, n_cols) * (rng.random(n_cols) < 0.4)
    for j in range(n_cols):
        R[: first[j], j] = np.nan
        R[last[j] :, j] = np.nan
    R[rng.random(R.shape) < 0.06] = np.nan
    R[:, 9] = np.nan  # never traded
    return R, 4, 12


def _repeated_universe() -> tuple[np.ndarray, int, int]:
    """Three series, each in 50 identical columns (two leader tiles): the 2,500 (or 2,450)
    pairs of two groups share one bin, so its byte count wraps several times."""
    rng = np.random.default_rng(12)
    base = rng.standard_normal((60, 3)).astype(np.float32)
    return np.repeat(base, 50, axis=1), 3, 20


@pytest.mark.parametrize("universe", [_ragged_universe, _repeated_universe])
def test_the_count_holds_every_pair_once(universe):
    """The sweep's histogram counts every ordered pair with a best lag once, at the bin it
    recorded for it or, deferred, at its exact bin, over more than one leader tile; the count
    of a bin is exact however many pairs it holds (byte counts that wrap, spilled from both
    threads)."""
    R, max_lag, min_overlap = universe()
    n_cols = R.shape[1]
    record = np.full((n_cols, n_cols), -2, dtype=np.int64)
    with worker_pool() as pool:
        window = standardize(R, pool, layout="lead-lag")
        sweep = Sweep(sweep_inputs(window, max_lag, min_overlap))
        sweep.run(np.arange(n_cols), pool, record=record)
        deferred = np.argwhere(record == -1)
        exact = sweep.exact_bins(np.column_stack([deferred, np.zeros(len(deferred), int)]), pool)
        counts = sweep.counts(pool)
    bins = np.concatenate([record[record >= 0], exact[exact >= 0]])
    expected_bins, expected_counts = np.unique(bins, return_counts=True)
    _, _, q = _brute_force(R, max_lag, min_overlap)
    assert counts.m == q.size == bins.size
    np.testing.assert_array_equal(counts.bins, expected_bins)
    np.testing.assert_array_equal(counts.counts, expected_counts)
    if universe is _repeated_universe:
        assert expected_counts.max() >= 9 * 256
