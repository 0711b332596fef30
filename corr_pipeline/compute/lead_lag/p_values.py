"""The p-value of one lag's correlation (SPEC §6 "Significance"), and what the screen's
correlation bounds say of it: compiled helpers of the lead-lag kernels and the significance
count."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SIGNIFICANCE_MARGIN = 2.0**-20
"""The screen's correlation bounds are widened by this before they bound a p-value: covers the
rounding of the bounds and of the exact value (below 1e-9 in |corr|)."""


@njit(cache=True, nogil=True, inline="always")
def lag_p_value(r, n):  # pragma: no cover - compiled
    """Two-sided p-value of a correlation ``r`` over ``n`` rows under white noise, SPEC §6:
    ``erfc(atanh(|r|)·sqrt(n − 3) / √2)`` (1 for ``n <= 3``, else 0 for ``|r| = 1``); decreasing
    in ``|r|`` and in ``n``. The pair's ``p_value`` is its Šidák correction over the lags."""
    if n <= 3:
        return 1.0  # no test on three rows or fewer: a correlation there is no evidence
    magnitude = min(abs(r), 1.0)
    if magnitude >= 1.0:
        return 0.0
    return math.erfc(math.atanh(magnitude) * math.sqrt(max(n - 3.0, 0.0)) / math.sqrt(2.0))


@njit(cache=True, nogil=True, inline="always")
def significance_bounds(
    upper, lower, corr_hi, corr_lo, n_lo, n_hi, p_limit
):  # pragma: no cover - compiled
    """The improvement bounds of a pair under the candidacy condition ``lag_p_value < p_limit``
    at its best lag: that lag has ``|corr| <= corr_hi`` and ``n <= n_hi`` rows, so its p-value is
    at least ``lag_p_value(corr_hi, n_hi)`` (decreasing in both), and when that reaches
    ``p_limit`` the pair is no candidate (upper = −∞); a lower bound stays only when the pair is
    sure to pass, ``lag_p_value(corr_lo, n_lo) < p_limit`` (``|corr| >= corr_lo``, ``n >=
    n_lo``). Both correlations are widened by :data:`SIGNIFICANCE_MARGIN`."""
    if upper > -np.inf:
        least = lag_p_value(min(corr_hi + SIGNIFICANCE_MARGIN, 1.0), n_hi)
        upper = upper if least < p_limit else -np.inf
    if lower > -np.inf:
        most = lag_p_value(max(corr_lo - SIGNIFICANCE_MARGIN, 0.0), n_lo)
        lower = lower if most < p_limit else -np.inf
    return upper, lower
