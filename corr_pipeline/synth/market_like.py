"""Returns that look like real daily equity returns, for measuring the calibration of the
lead-lag significance test (SPEC §6) on the data it will meet, not on white noise.

:func:`market_like_returns` draws a float32 ``T × N`` returns matrix (NaN where a symbol is
not listed) with the three features of real daily returns that break a white-noise test of
lagged correlation, and optionally injected lead-lag pairs as a known answer:

* a **market factor with a lag-1 reversal** (autocorrelation ``φ = −0.3``), which appears in
  every pair's lagged correlation of the raw returns;
* a **volatility factor common to all symbols** (GARCH(1, 1), persistence ``α + β = 0.97``):
  calm and stressed periods, under which ``√n · r`` is not standard normal;
* **fat tails** (Student-t innovations, ``df = 4`` by default).

Model (every draw from ``numpy.random.default_rng(seed)`` in the order listed, so the same
arguments give bit-identical arrays). ``T = n_returns``; the factors are simulated over
``BURN_IN + T`` days from ``h = 1``, ``m = 0`` and the first ``BURN_IN`` are dropped, so the
window starts in the stationary regime. ``t_ν`` is a Student-t draw with ``ν = student_t_df``
degrees of freedom scaled to unit variance (``· sqrt((ν − 2) / ν)``); ``ν = inf`` draws
standard normals instead (``rng.standard_normal``, the limit: Gaussian innovations, for
measuring which part of a test's behaviour comes from the tails).

1. Per symbol ``j``: market loading ``b_j ~ U(0.5, 1.2)``; if ``n_sectors > 0``, sector
   ``s(j)`` uniform in ``0 .. n_sectors − 1`` and sector loading ``g_j ~ U(0.3, 0.8)``
   (else ``g_j = 0``); daily volatility ``σ_j = clip(exp(N(ln 0.02, 0.4²)), 0.005, 0.1)``;
   drift ``μ_j ~ N(0.0003, 0.0003²)``.
2. Market innovations ``η[t] ~ t_ν``; the common variance and the market factor::

       h[t] = ω + α · h[t−1] · η[t−1]² + β · h[t−1]      ω = 0.03, α = 0.08, β = 0.89
       m[t] = φ · m[t−1] + sqrt(1 − φ²) · sqrt(h[t]) · η[t]     φ = −0.3

   (``E[h] = ω / (1 − α − β) = 1``, so ``m`` has unit variance and lag-1 autocorrelation
   ``φ``; large market moves raise every symbol's volatility the next days).
3. Sector factors ``f[t, k] ~ t_ν`` (``n_sectors`` columns), then idiosyncratic
   ``e[t, j] ~ t_ν``; for every symbol not in an injected pair::

       r[t, j] = μ_j + σ_j · (b_j · m[t] + sqrt(h[t]) · (g_j · f[t, s(j)] + w · e[t, j]))
                       / sqrt(b_j² + g_j² + w²),          w = 1.2

   so ``σ_j`` is the symbol's unconditional daily volatility; synchronous correlation
   ``b_i b_j / sqrt((b_i² + g_i² + w²)(b_j² + g_j² + w²))`` ≈ 0.3 (plus the sector's share
   within one sector).
4. Injected pure lead-lag pairs (``n_pairs``, all ``2 · n_pairs`` symbols distinct, chosen by
   ``rng.choice``: leaders first): lag ``ℓ`` uniform in ``1 .. max_pair_lag``, population
   lagged correlation ``ρ ~ U(rho_range)``, then the leaders' standard normal ``z_L`` over
   ``T + max_pair_lag`` days (the days before the window feed the laggers' first returns)
   and the laggers' ``e_G ~ t_ν``::

       r[t, L] = σ_L · sqrt(h[t]) · z_L[t]
       r[t, G] = β_LG · r[t − ℓ, L] + σ_G · sqrt(1 − ρ²) · sqrt(h[t]) · e_G[t],
       β_LG = ρ · σ_G / σ_L

   so ``corr(r[t − ℓ, L], r[t, G]) = ρ`` and the synchronous correlation is 0 in population:
   neither symbol has a market or sector exposure. The leader's innovations are Gaussian: with
   Student-t(4) ones a few outlier days carry most of ``Σ a·b`` and the robust test of SPEC §6
   cannot certify the pair (see :mod:`corr_pipeline.synth.universe`).
5. Ragged listings, among the symbols not in a pair: each is ragged with probability
   ``ragged_share``, then loses a fraction ``U(0.1, 0.5)`` of the window (``⌊fraction · T⌋``
   rows), at the start (listed late) or at the end (delisted early), with equal probability
   (draws: the ragged flags, the fractions and the sides, one per eligible symbol, in that
   order). Those rows are NaN.

The output is float32 (the factor arithmetic is float64). Memory: ``T × N`` float64 for the
idiosyncratic draws and the returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from corr_pipeline.synth.universe import TRUTH_DTYPE

__all__ = [
    "GARCH_ALPHA",
    "GARCH_BETA",
    "GARCH_OMEGA",
    "MARKET_AUTOCORRELATION",
    "MarketLikeReturns",
    "market_like_returns",
]

MARKET_AUTOCORRELATION = -0.3
"""``φ``: the market factor's lag-1 autocorrelation (a reversal)."""
GARCH_OMEGA = 0.03
GARCH_ALPHA = 0.08
GARCH_BETA = 0.89
"""The common variance's GARCH(1, 1) parameters: persistence ``α + β = 0.97``, ``E[h] = 1``."""
IDIOSYNCRATIC_WEIGHT = 1.2
BURN_IN = 250
"""Days simulated before the window and dropped (the variance forgets ``h = 1`` in ~30)."""


@dataclass(frozen=True, eq=False)
class MarketLikeReturns:
    """A draw of :func:`market_like_returns`.

    Attributes:
        returns: float32 ``T × N`` log returns, NaN where the symbol is not listed.
        truth: :data:`~corr_pipeline.synth.TRUTH_DTYPE` records of the injected pairs (leader
            and lagger columns, lag, ``β_LG``, population lagged correlation ``ρ``), sorted by
            leader; empty without pairs.
        market: float64 ``(T,)`` the market factor ``m`` over the window.
        variance: float64 ``(T,)`` the common variance ``h`` over the window.
        sector: int64 ``(N,)`` each symbol's sector ``s(j)`` (step 1), ``-1`` for the symbols
            of the injected pairs (no sector exposure); all 0 with ``n_sectors = 0``.
    """

    returns: np.ndarray
    truth: np.ndarray
    market: np.ndarray
    variance: np.ndarray
    sector: np.ndarray


def market_like_returns(
    n_returns: int,
    n_symbols: int,
    *,
    seed: int,
    n_sectors: int = 0,
    n_pairs: int = 0,
    ragged_share: float = 0.15,
    student_t_df: float = 4.0,
    rho_range: tuple[float, float] = (0.5, 0.8),
    max_pair_lag: int = 3,
) -> MarketLikeReturns:
    """``n_returns × n_symbols`` market-like returns (the module docstring states the model).

    Args:
        n_returns: ``T`` (>= 2, > ``max_pair_lag``).
        n_symbols: ``N`` (>= 1, >= ``2 · n_pairs``).
        seed: the generator seed; the same arguments give bit-identical arrays.
        n_sectors: number of sector factors (0: none).
        n_pairs: number of injected lead-lag pairs.
        ragged_share: probability that a symbol outside the pairs is listed late or delisted
            early.
        student_t_df: degrees of freedom ``ν > 2`` of the Student-t innovations; ``math.inf``
            for Gaussian ones.
        rho_range: ``(low, high)`` of the pairs' population lagged correlation, in ``(0, 1)``.
        max_pair_lag: the largest injected lag.
    """
    _validate(n_returns, n_symbols, n_sectors, n_pairs, ragged_share, student_t_df, rho_range)
    if not 1 <= max_pair_lag < n_returns:
        raise ValueError(f"max_pair_lag must be in 1 .. {n_returns - 1}, got {max_pair_lag}")
    rng = np.random.default_rng(seed)

    def student_t(size: int | tuple[int, ...]) -> np.ndarray:
        if math.isinf(student_t_df):  # the limit: Gaussian innovations
            return rng.standard_normal(size)
        return rng.standard_t(student_t_df, size) * np.sqrt((student_t_df - 2.0) / student_t_df)

    # 1. per-symbol parameters
    market_loading = rng.uniform(0.5, 1.2, n_symbols)
    if n_sectors > 0:
        sector = rng.integers(0, n_sectors, n_symbols)
        sector_loading = rng.uniform(0.3, 0.8, n_symbols)
    else:
        sector = np.zeros(n_symbols, dtype=np.int64)
        sector_loading = np.zeros(n_symbols)
    volatility = np.clip(np.exp(rng.normal(np.log(0.02), 0.4, n_symbols)), 0.005, 0.1)
    drift = rng.normal(0.0003, 0.0003, n_symbols)

    # 2. the common variance and the market factor, burn-in included
    n_total = BURN_IN + n_returns
    variance, market = _garch_market(student_t(n_total))
    window = slice(BURN_IN, n_total)
    scale = np.sqrt(variance[window])[:, None]

    # 3. factor-model returns
    sector_factors = student_t((n_returns, n_sectors))
    returns = student_t((n_returns, n_symbols))
    returns *= IDIOSYNCRATIC_WEIGHT
    if n_sectors > 0:
        returns += sector_factors[:, sector] * sector_loading
    returns *= scale
    returns += market[window, None] * market_loading
    norm = np.sqrt(market_loading**2 + sector_loading**2 + IDIOSYNCRATIC_WEIGHT**2)
    returns *= volatility / norm
    returns += drift

    # 4. injected pairs
    truth = _inject_pairs(
        rng, returns, variance, volatility, n_pairs, rho_range, max_pair_lag, student_t
    )

    # 5. ragged listings
    in_pair = np.zeros(n_symbols, dtype=bool)
    in_pair[truth["leader"]] = in_pair[truth["lagger"]] = True
    eligible = np.flatnonzero(~in_pair)
    ragged = rng.random(eligible.size) < ragged_share
    cut = (rng.uniform(0.1, 0.5, eligible.size) * n_returns).astype(np.int64)
    listed_late = rng.random(eligible.size) < 0.5
    for column, rows, late in zip(eligible[ragged], cut[ragged], listed_late[ragged], strict=True):
        if late:
            returns[:rows, column] = np.nan
        else:
            returns[n_returns - rows :, column] = np.nan

    sector = sector.astype(np.int64)
    sector[in_pair] = -1
    return MarketLikeReturns(
        returns=returns.astype(np.float32),
        truth=truth,
        market=market[window].copy(),
        variance=variance[window].copy(),
        sector=sector,
    )


def _garch_market(innovations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``h`` and ``m`` of step 2 of the module docstring from the market innovations ``η``."""
    phi = MARKET_AUTOCORRELATION
    variance = np.empty(innovations.size)
    market = np.empty(innovations.size)
    h, m = 1.0, 0.0
    for t, eta in enumerate(innovations):
        if t > 0:
            h = GARCH_OMEGA + (GARCH_ALPHA * innovations[t - 1] ** 2 + GARCH_BETA) * h
        m = phi * m + np.sqrt((1.0 - phi * phi) * h) * eta
        variance[t], market[t] = h, m
    return variance, market


def _inject_pairs(
    rng: np.random.Generator,
    returns: np.ndarray,
    variance: np.ndarray,
    volatility: np.ndarray,
    n_pairs: int,
    rho_range: tuple[float, float],
    max_pair_lag: int,
    student_t,
) -> np.ndarray:
    """Overwrite the columns of ``n_pairs`` leader/lagger pairs (step 4 of the module
    docstring); their truth records, sorted by leader."""
    n_returns, n_symbols = returns.shape
    symbols = rng.choice(n_symbols, size=2 * n_pairs, replace=False)
    leaders, laggers = symbols[:n_pairs], symbols[n_pairs:]
    lags = rng.integers(1, max_pair_lag + 1, n_pairs)
    rho = rng.uniform(rho_range[0], rho_range[1], n_pairs)
    beta = rho * volatility[laggers] / volatility[leaders]
    # the leaders over the window and the max_pair_lag days before it
    extended_scale = np.sqrt(variance[variance.size - n_returns - max_pair_lag :])[:, None]
    leader_extended = rng.standard_normal((n_returns + max_pair_lag, n_pairs))
    leader_extended *= extended_scale * volatility[leaders]
    source_rows = max_pair_lag + np.arange(n_returns)[:, None] - lags
    lagged_leader = np.take_along_axis(leader_extended, source_rows, axis=0)
    noise = student_t((n_returns, n_pairs)) * extended_scale[max_pair_lag:]
    returns[:, leaders] = leader_extended[max_pair_lag:]
    returns[:, laggers] = beta * lagged_leader + noise * volatility[laggers] * np.sqrt(1 - rho**2)
    truth = np.empty(n_pairs, dtype=TRUTH_DTYPE)
    truth["leader"], truth["lagger"], truth["lag"] = leaders, laggers, lags
    truth["beta"], truth["rho"] = beta, rho
    truth.sort(order="leader")
    return truth


def _validate(
    n_returns: int,
    n_symbols: int,
    n_sectors: int,
    n_pairs: int,
    ragged_share: float,
    student_t_df: float,
    rho_range: tuple[float, float],
) -> None:
    for name, value, minimum in (
        ("n_returns", n_returns, 2),
        ("n_symbols", n_symbols, 1),
        ("n_sectors", n_sectors, 0),
        ("n_pairs", n_pairs, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if 2 * n_pairs > n_symbols:
        raise ValueError(f"2 · n_pairs = {2 * n_pairs} symbols exceed n_symbols = {n_symbols}")
    if not 0.0 <= ragged_share <= 1.0:
        raise ValueError(f"ragged_share must be in [0, 1], got {ragged_share}")
    if not student_t_df > 2.0:
        raise ValueError(f"student_t_df must be > 2 (finite variance), got {student_t_df}")
    low, high = rho_range
    if not 0.0 < low <= high < 1.0:
        raise ValueError(f"rho_range must satisfy 0 < low <= high < 1, got {rho_range}")
