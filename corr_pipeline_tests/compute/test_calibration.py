"""Calibration of the lead-lag significance on market-like returns (SPEC §6), measured.

Under the null of :func:`corr_pipeline.synth.market_like_returns` (a market factor with a lag-1
reversal, a common GARCH volatility, Student-t(4) tails, sectors, ragged listings; no lead-lag),
over ``WINDOWS`` independent windows of ``T × N``, two different things are measured:

* **the test itself: the lag p-values.** For every ordered pair ``i != j`` and EVERY lag
  ``ℓ = 1 .. MAX_LAG`` with a defined ``r``: the per-lag ``p = erfc(|t_ℓ| / √2)`` of the robust
  statistic on the market residuals (the **new** definition, the package) or the white-noise
  ``p = erfc(atanh(|r_ℓ|) · sqrt(n − 3) / √2)`` on the raw returns (the **old** one, removed from
  the package and written here). Under the null each is uniform if the test is calibrated: the
  issue's ±20 % targets apply to these shares. They are computed here in float64 from SPEC §6's
  formula (:func:`lag_tests`) and tied to the package: Šidák of the robust lag p-value at the
  best lag equals :func:`pair_significance`'s ``p_value`` within 1e-5 (at most one near-tie pair
  per window).
* **what a reader of the table sees:** the published ``p_value`` (Šidák over the lags of the lag
  p-value at the best lag, chosen by ``|r|``) and the Benjamini–Hochberg ``q_value``.

The new definition passes every band below, including the lag-1 p-values alone (the residuals
leave no reversal); the old one fails all four (both lag-p-value shares, the published share,
the windows with a discovery), and its lag-1 share is more than twice its later lags' (the
market's reversal is in every raw pair's lag-1 correlation). Injected pure lead-lag pairs are
found at ``q <= 0.05`` with their true lag (:data:`MIN_RECOVERED_SHARE`), and hardly any other.

**Measured** over 10 blocks of ``WINDOWS`` seeds (``FIRST_SEED + 40·b``, ``b = 0 .. 9``; a block
holds ~174 000 lag p-values, 40 windows × 870 pairs × 5 lags; the test runs block 0):

=============================  ===============================  ==============================
share over the null windows    new (residuals + robust)         old (raw + white noise)
=============================  ===============================  ==============================
lag p < 0.05, all lags          0.0453–0.0467 (0.91–0.93 ×)      0.118–0.152
lag p < 0.05, lag 1 / 2..5      0.044–0.047 / ~0.046             0.25–0.31 / ~0.10
lag p < 0.01, all lags          0.0066–0.0075 (0.66–0.75 ×)      0.042–0.067
published p_value < 0.05        0.032–0.036                      0.19–0.28
windows with any q <= 0.05      0 of 40 in every block           30–38 of 40
=============================  ===============================  ==============================

**Bands.** :data:`LAG_SHARE_BELOW` at 0.05: ±20 % of nominal, the issue's target (the blocks
sit 7–9 % below). At 0.01: up to +20 % above nominal but down to −45 % below (0.0055): the
robust test is conservative in the tail under Student-t(4) innovations, a property of the
statistic, not of the residuals or of this universe. A self-normalised sum of symmetric
heavy-tailed terms has lighter tails than N(0, 1) (Efron, JASA 1969): with i.i.d. Student-t(4)
``a`` and ``b``, ``n = 250``, no market and no GARCH, the share is 0.94 × nominal at 0.05,
0.75 × at 0.01 and 0.53 × at 0.002 (0.99 ×, 0.95 ×, 0.85 × with normal ``a``, ``b``; 200 000
draws each); the common GARCH variance adds a little (the benchmark's Gaussian-innovation null:
0.89 × at 0.01). A conservative p-value costs power, not false discoveries, hence the wider
band below.

The published share is lower still, and :data:`PUBLISHED_SHARE_BELOW_005` accepts it: Šidák
gives ``p_value < 0.05`` exactly when the best lag's ``p < 1 − 0.95^(1/5) = 0.0102``, so the
published share at 0.05 reflects the lag p-values at ~0.01 (about 5 lags × 0.0071 ≈ 0.035), not
at 0.05; choosing the lag by ``|r|`` rather than by the smallest p adds a small part (the
benchmark's diagnostic rows). Its upper end (+20 %) is what bounds false discoveries. Runtime:
~6 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import erfc

from corr_pipeline.compute import (
    find_lead_lag_pairs,
    market_residuals,
    pair_significance,
    pairwise_correlation,
)
from corr_pipeline.synth import MarketLikeReturns, market_like_returns
from corr_pipeline.synth.market_like import MARKET_AUTOCORRELATION

N_RETURNS, N_SYMBOLS, N_SECTORS = 252, 30, 5
WINDOWS = 40
FIRST_SEED = 1000
MAX_LAG, MIN_OVERLAP = 5, 60
Q_LEVEL = 0.05
LAG_SHARE_BELOW = {0.05: (0.040, 0.060), 0.01: (0.0055, 0.012)}
"""Accepted share of the null lag p-values below each level (module docstring)."""
PUBLISHED_SHARE_BELOW_005 = (0.028, 0.060)
"""Accepted share of the null pairs' published ``p_value`` below 0.05 (module docstring)."""
MAX_WINDOWS_WITH_DISCOVERY = 4
"""Of ``WINDOWS``: 2 expected if BH held the family-wise rate at 0.05 exactly."""
PUBLISHED_AGREEMENT = 1e-5
"""The package's ``p_value`` against Šidák of this file's float64 lag p-value at the best lag."""
FIRST_INJECTED_SEED, INJECTED_WINDOWS = 2000, 12
MIN_RECOVERED_SHARE = 0.85
"""Measured 0.92 over these 12 windows, 0.93 over 30: the misses are windows whose common
variance spikes (a crisis), where the robust statistic of a pure-lag pair is about
``ρ · sqrt(n_eff / (1 + 2ρ²))`` with ``n_eff = (Σ h)² / Σ h²`` down to ~60 of 252 days."""


def _draw(seed: int, n_pairs: int = 0) -> MarketLikeReturns:
    return market_like_returns(
        N_RETURNS, N_SYMBOLS, seed=seed, n_sectors=N_SECTORS, n_pairs=n_pairs
    )


def _triples(records: np.ndarray) -> set[tuple[int, int, int]]:
    """``(leader, lagger, lag)`` of truth or lead-lag records."""
    columns = (records[name].tolist() for name in ("leader", "lagger", "lag"))
    return set(zip(*columns, strict=True))


def _residuals(R: np.ndarray) -> np.ndarray:
    corr = pairwise_correlation(R, min_overlap=MIN_OVERLAP).corr
    return market_residuals(R, corr=corr, m=1)


def _sidak(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return -np.expm1(MAX_LAG * np.log1p(-p))


def _bh_q_values(p: np.ndarray) -> np.ndarray:
    """``q_(k) = min over l >= k of p_(l) · M / l``, capped at 1."""
    order = np.argsort(p, kind="stable")
    ranked = p[order] * p.size / np.arange(1, p.size + 1)
    q = np.empty(p.size)
    q[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    return q


def lag_tests(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every lag ``ℓ = 1 .. MAX_LAG`` (axis 0) and ordered pair ``(i, j)``, in float64: the
    pairwise-complete Pearson ``r`` of ``(X[t, i], X[t + ℓ, j])`` (NaN below ``MIN_OVERLAP``,
    on a zero variance and on the diagonal), the white-noise lag p-value
    ``erfc(atanh(|r|) · sqrt(n − 3) / √2)`` and the robust one ``erfc(|t| / √2)``,
    ``t = Σ a·b / sqrt(Σ a²·b²)`` with ``a``, ``b`` the columns less their mean over their own
    finite rows (SPEC §6); both p-values NaN where ``r`` is."""
    n_rows, n_cols = X.shape
    finite = np.isfinite(X)
    centred = np.where(finite, X - np.nanmean(X, axis=0), 0.0)
    mask = finite.astype(np.float64)
    shape = (MAX_LAG, n_cols, n_cols)
    r, white_noise, robust = np.empty(shape), np.empty(shape), np.empty(shape)
    for k, lag in enumerate(range(1, MAX_LAG + 1)):
        x, y = centred[: n_rows - lag], centred[lag:]
        fx, fy = mask[: n_rows - lag], mask[lag:]
        n = fx.T @ fy
        sxy, sx, sy = x.T @ y, x.T @ fy, fx.T @ y
        squares = (x * x).T @ (y * y)
        with np.errstate(invalid="ignore", divide="ignore"):
            var_x = (x * x).T @ fy - sx * sx / n
            var_y = fx.T @ (y * y) - sy * sy / n
            r[k] = np.clip((sxy - sx * sy / n) / np.sqrt(var_x * var_y), -1.0, 1.0)
            z = np.arctanh(np.minimum(np.abs(r[k]), 1.0)) * np.sqrt(n - 3.0)
            t = np.where(squares > 0, sxy / np.sqrt(squares), 0.0)
        r[k][(n < MIN_OVERLAP) | ~(var_x > 0) | ~(var_y > 0)] = np.nan
        white_noise[k] = erfc(z / np.sqrt(2.0))
        robust[k] = erfc(np.abs(t) / np.sqrt(2.0))
    for values in (r, white_noise, robust):
        values[:, np.arange(n_cols), np.arange(n_cols)] = np.nan
        values[np.isnan(r)] = np.nan
    return r, white_noise, robust


def _best(r: np.ndarray, lag_p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ordered pairs with a best lag (leaders, laggers) and the lag p-value at it: the lag
    of the largest finite ``|r|``, ties to the smaller lag."""
    defined = np.isfinite(r)
    leaders, laggers = np.nonzero(defined.any(axis=0))
    best = np.argmax(np.where(defined, np.abs(r), -1.0), axis=0)[leaders, laggers]
    return leaders, laggers, lag_p[best, leaders, laggers]


@dataclass(frozen=True)
class Window:
    """One window under one definition: its null lag p-values (``MAX_LAG × pairs``, NaN where
    the lag has no ``r``), the published p-values and the q-values of the pairs with a best lag."""

    lag_p: np.ndarray
    p_value: np.ndarray
    q_value: np.ndarray


def old_definition(R: np.ndarray) -> Window:
    """Raw returns, the white-noise test at the best lag, Šidák, Benjamini–Hochberg (the
    removed definition, written here)."""
    r, white_noise, _ = lag_tests(R.astype(np.float64))
    _, _, p_best = _best(r, white_noise)
    p_value = _sidak(p_best)
    return Window(white_noise, p_value, _bh_q_values(p_value))


def new_definition(R: np.ndarray) -> Window:
    """Market residuals (``m = 1``), the robust test: the lag p-values from :func:`lag_tests`,
    the published ``p_value`` and ``q_value`` from the package, checked against Šidák of the lag
    p-value at the best lag."""
    E = _residuals(R)
    r, _, robust = lag_tests(E.astype(np.float64))
    leaders, laggers, p_best = _best(r, robust)
    significance = pair_significance(E, leaders, laggers, max_lag=MAX_LAG, min_overlap=MIN_OVERLAP)
    assert significance.m == leaders.size  # the same pairs have a best lag
    off = np.abs(significance.p_value - _sidak(p_best))
    assert np.count_nonzero(off > PUBLISHED_AGREEMENT) <= 1, np.sort(off)[-3:]  # a near tie
    return Window(robust, significance.p_value, significance.q_value)


@dataclass(frozen=True)
class Calibration:
    """Pooled over the null windows: the shares of the lag p-values below each level (all lags,
    and lag 1 alone), of the published p-values below 0.05, and the windows with a discovery."""

    lag_share: dict[float, float]
    lag_1_share_005: float
    later_lags_share_005: float
    published_share_005: float
    windows_with_discovery: int

    def failures(self) -> list[str]:
        """What is outside :data:`LAG_SHARE_BELOW`, :data:`PUBLISHED_SHARE_BELOW_005` and
        :data:`MAX_WINDOWS_WITH_DISCOVERY`."""
        failures = [
            f"lag p-values' share below {level:g} is {self.lag_share[level]:.4f}, outside {band}"
            for level, band in LAG_SHARE_BELOW.items()
            if not band[0] <= self.lag_share[level] <= band[1]
        ]
        low, high = PUBLISHED_SHARE_BELOW_005
        if not low <= self.published_share_005 <= high:
            failures.append(
                f"published p_value share below 0.05 is {self.published_share_005:.4f},"
                f" outside {PUBLISHED_SHARE_BELOW_005}"
            )
        if self.windows_with_discovery > MAX_WINDOWS_WITH_DISCOVERY:
            failures.append(
                f"{self.windows_with_discovery} of {WINDOWS} null windows have a pair at"
                f" q <= {Q_LEVEL}"
            )
        return failures


def calibration(definition, first_seed: int = FIRST_SEED) -> Calibration:
    """:class:`Calibration` of ``definition`` (:func:`old_definition` or
    :func:`new_definition`) over the ``WINDOWS`` null windows from ``first_seed``."""
    lag_p, lag_1, later, p_values, windows_with_discovery = [], [], [], [], 0
    for w in range(WINDOWS):
        window = definition(_draw(first_seed + w).returns)
        tests = window.lag_p[np.isfinite(window.lag_p)]
        lag_p.append(tests)
        lag_1.append(window.lag_p[0][np.isfinite(window.lag_p[0])])
        later.append(window.lag_p[1:][np.isfinite(window.lag_p[1:])])
        p_values.append(window.p_value)
        windows_with_discovery += bool(np.any(window.q_value <= Q_LEVEL))
    pooled = np.concatenate(lag_p)
    return Calibration(
        lag_share={level: float(np.mean(pooled < level)) for level in LAG_SHARE_BELOW},
        lag_1_share_005=float(np.mean(np.concatenate(lag_1) < 0.05)),
        later_lags_share_005=float(np.mean(np.concatenate(later) < 0.05)),
        published_share_005=float(np.mean(np.concatenate(p_values) < 0.05)),
        windows_with_discovery=windows_with_discovery,
    )


def test_generator_is_deterministic_float32_and_ragged() -> None:
    a, b = _draw(7, n_pairs=3), _draw(7, n_pairs=3)
    assert a.returns.dtype == np.float32 and a.returns.shape == (N_RETURNS, N_SYMBOLS)
    assert np.array_equal(a.returns.view(np.uint32), b.returns.view(np.uint32))
    assert np.array_equal(a.truth, b.truth) and a.truth.size == 3
    missing = np.isnan(a.returns)
    # a missing column block sits at the start or at the end of the window, never in a pair
    for column in np.flatnonzero(missing.any(axis=0)):
        rows = np.flatnonzero(missing[:, column])
        assert rows[0] == 0 or rows[-1] == N_RETURNS - 1
        assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1))
    pair_columns = np.concatenate([a.truth["leader"], a.truth["lagger"]])
    assert not missing[:, pair_columns].any()


def test_generator_gaussian_innovations() -> None:
    """``student_t_df = inf``: standard normal innovations (finite returns, lighter-tailed
    market innovations than the default Student-t(4))."""
    gaussian = market_like_returns(2000, 8, seed=5, student_t_df=np.inf, ragged_share=0.0)
    assert np.isfinite(gaussian.returns).all()
    heavy = market_like_returns(2000, 8, seed=5, ragged_share=0.0)
    kurtosis = [
        float(np.mean(x**4) / np.mean(x**2) ** 2)
        for x in (
            gaussian.market / np.sqrt(gaussian.variance),
            heavy.market / np.sqrt(heavy.variance),
        )
    ]
    assert kurtosis[0] < kurtosis[1]


def test_generator_market_reversal_and_pair_correlation() -> None:
    draw = market_like_returns(20_000, 12, seed=3, n_pairs=2, ragged_share=0.0)
    m = draw.market
    assert abs(np.corrcoef(m[:-1], m[1:])[0, 1] - MARKET_AUTOCORRELATION) < 0.03
    R = draw.returns.astype(np.float64)
    for pair in draw.truth:
        lag = int(pair["lag"])
        lagged = np.corrcoef(R[:-lag, pair["leader"]], R[lag:, pair["lagger"]])[0, 1]
        assert abs(lagged - pair["rho"]) < 0.03
        assert abs(np.corrcoef(R[:, pair["leader"]], R[:, pair["lagger"]])[0, 1]) < 0.03


def test_robust_residual_test_is_calibrated_and_white_noise_is_not() -> None:
    new = calibration(new_definition)
    assert new.failures() == [], new
    band = LAG_SHARE_BELOW[0.05]
    assert band[0] <= new.lag_1_share_005 <= band[1], new  # no reversal left in the residuals
    old = calibration(old_definition)
    failures = old.failures()
    # the lag p-values (both levels), the published share and the discoveries
    assert len(failures) == 4, failures
    assert old.lag_1_share_005 > 2 * old.later_lags_share_005, old  # the market's reversal


def test_injected_pairs_are_found_at_q_005_by_the_new_definition() -> None:
    """Over ``INJECTED_WINDOWS`` windows with 4 injected pairs each: the share of pairs
    :func:`find_lead_lag_pairs` reports on the residuals at ``q <= 0.05`` with their true lag
    is at least :data:`MIN_RECOVERED_SHARE`, and the pairs it reports besides are few."""
    recovered, injected, false_discoveries = 0, 0, 0
    for w in range(INJECTED_WINDOWS):
        draw = _draw(FIRST_INJECTED_SEED + w, n_pairs=4)
        pairs = find_lead_lag_pairs(
            _residuals(draw.returns),
            max_lag=MAX_LAG,
            k_leaders=3,
            k_laggers=3,
            min_overlap=MIN_OVERLAP,
            max_q_value=Q_LEVEL,
        )
        truth, found = _triples(draw.truth), _triples(pairs)
        injected += len(truth)
        recovered += len(truth & found)
        false_discoveries += len(found - truth)
    assert recovered / injected >= MIN_RECOVERED_SHARE, (recovered, injected)
    assert false_discoveries <= 2, false_discoveries
