"""The p-value of one lag's correlation (SPEC §6 "Significance") and its histogram bin: compiled
helpers of the lead-lag kernels and the significance count.

For a correlation ``r`` over ``n`` rows, ``z = atanh(|r|)·sqrt(n − 3)`` and the two-sided
p-value ``p = erfc(z / √2)`` (1 for ``n <= 3``: two or three points are no evidence). The
histogram of the count bins ``u = z + z²/2`` rather than ``p``, which needs no ``erfc``: with
``λ(z) = φ(z) / Q(z)`` the normal's inverse Mills ratio, ``d ln p / dz = −λ(z)`` and
``λ(z) <= (z + sqrt(z² + 4)) / 2 <= z + 1 = du / dz``, so ``|d ln p / du| <= 1`` and a bin of
width ``Δu`` holds p-values within a factor ``exp(Δu)`` of each other. Bins of ``Δu = 2⁻¹⁷``
(relative width 7.6e-6 in p) up to :data:`U_FINE` (``p ≈ 1.3e-17``), then of ``2⁻¹²`` (2.4e-4)
up to :data:`U_LAST`; ``p = 0`` (``|r| = 1``, or beyond :data:`U_LAST`, ``p < 1e-289``) has
bin 0. Bins are numbered so that a larger bin holds larger p-values: bin ``N_BINS − 1`` holds
``u < 2⁻¹⁷`` (p up to 1). :func:`bin_upper_p` gives each bin's largest p-value (at its lowest
``u``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SIGNIFICANCE_MARGIN = 2.0**-20
"""The screen's correlation bounds are widened by this before they bound a p-value: covers the
rounding of the bounds and of the exact value (below 1e-9 in |corr|)."""

FINE_STEPS = 2.0**17
"""Bins per unit of ``u`` below :data:`U_FINE`."""
COARSE_STEPS = 2.0**12
"""Bins per unit of ``u`` from :data:`U_FINE` to :data:`U_LAST`."""
U_FINE = 45.0
"""``u`` of ``z = 8.54``, ``p = 1.3e-17``: a q-value below it is below 1e-6 for any universe
of fewer than 2³⁰ pairs and 64 lags, so its bins may be coarser."""
U_LAST = 700.0
"""``u`` of ``z = 36.4``: beyond it ``p < 1e-289``, counted as 0 (and below 1e-308 a float64
p-value loses its relative precision)."""
_FINE_BINS = int(U_FINE * FINE_STEPS)
_COARSE_BINS = int((U_LAST - U_FINE) * COARSE_STEPS)
N_BINS = 1 + _FINE_BINS + _COARSE_BINS
"""Bin 0 for p = 0, the coarse bins, then the fine ones (the largest p-values last)."""


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
    return math.erfc(math.atanh(magnitude) * math.sqrt(n - 3.0) / math.sqrt(2.0))


@njit(cache=True, nogil=True, inline="always")
def p_bin(r, n):  # pragma: no cover - compiled
    """The histogram bin (module docstring) of :func:`lag_p_value` ``(r, n)``: non-increasing
    in ``|r|`` and in ``n``."""
    if n <= 3:
        return N_BINS - 1
    magnitude = min(abs(r), 1.0)
    if magnitude >= 1.0:
        return 0
    z = 0.5 * math.log1p(2.0 * magnitude / (1.0 - magnitude)) * math.sqrt(n - 3.0)
    u = z + 0.5 * z * z
    if u < U_FINE:
        return N_BINS - 1 - np.int64(u * FINE_STEPS)
    if u < U_LAST:
        return N_BINS - 1 - _FINE_BINS - np.int64((u - U_FINE) * COARSE_STEPS)
    return 0


@njit(cache=True, nogil=True)
def bin_upper_p(b):  # pragma: no cover - compiled
    """The largest lag p-value of bin ``b``: ``erfc(z / √2)`` at the bin's lowest ``u``
    (``z = sqrt(1 + 2u) − 1``), 0 for bin 0."""
    if b <= 0:
        return 0.0
    k = N_BINS - 1 - b
    if k < _FINE_BINS:
        u = k / FINE_STEPS
    else:
        u = U_FINE + (k - _FINE_BINS) / COARSE_STEPS
    z = math.sqrt(1.0 + 2.0 * u) - 1.0
    return math.erfc(z / math.sqrt(2.0))


@njit(cache=True, nogil=True, inline="always")
def significance_bounds(
    upper, lower, corr_hi, corr_lo, n_lo, n_hi, bin_limit
):  # pragma: no cover - compiled
    """The improvement bounds of a pair under the candidacy condition ``p_bin <= bin_limit`` at
    its best lag: that lag has ``|corr| <= corr_hi`` and ``n <= n_hi`` rows, so its bin is at
    least ``p_bin(corr_hi, n_hi)`` (non-increasing in both), and when that exceeds ``bin_limit``
    the pair is no candidate (upper = −∞); a lower bound stays only when the pair is sure to
    pass, ``p_bin(corr_lo, n_lo) <= bin_limit`` (``|corr| >= corr_lo``, ``n >= n_lo``). Both
    correlations are widened by :data:`SIGNIFICANCE_MARGIN`."""
    if upper > -np.inf:
        least = p_bin(min(corr_hi + SIGNIFICANCE_MARGIN, 1.0), n_hi)
        upper = upper if least <= bin_limit else -np.inf
    if lower > -np.inf:
        most = p_bin(max(corr_lo - SIGNIFICANCE_MARGIN, 0.0), n_lo)
        lower = lower if most <= bin_limit else -np.inf
    return upper, lower
