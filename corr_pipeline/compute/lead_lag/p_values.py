"""The p-value of one lag's robust statistic (SPEC §6 "Significance") and its histogram bin:
compiled helpers of the lead-lag kernels and the significance count.

For a pair's best lag, with ``a_t = x̃[t, i]`` and ``b_t = x̃[t + ℓ, j]`` over the rows where both
are finite (``x̃`` each column less its mean over its own finite rows),

    t_stat = Σ a_t·b_t / sqrt(Σ a_t²·b_t²)

(Dalla, Giraitis and Phillips' robust test of a cross-correlation: standard normal under a null
of no cross-correlation even when the variances move together over time) and the two-sided
p-value ``p = erfc(|t_stat| / √2)``; a zero denominator gives ``p = 1``. The statistic does not
depend on each column's scale, so the standardised window's ``Z`` gives it as well as ``x̃``.

The histogram of the count bins ``u = z + z²/2`` (``z = |t_stat|``) rather than ``p``, which
needs no ``erfc``: with ``λ(z) = φ(z) / Q(z)`` the normal's inverse Mills ratio,
``d ln p / dz = −λ(z)`` and ``λ(z) <= (z + sqrt(z² + 4)) / 2 <= z + 1 = du / dz``, so
``|d ln p / du| <= 1`` and a bin of width ``Δu`` holds p-values within a factor ``exp(Δu)`` of
each other. Bins of ``Δu = 2⁻¹⁷`` (relative width 7.6e-6 in p) up to :data:`U_FINE`
(``p ≈ 1.3e-17``), then of ``2⁻¹²`` (2.4e-4) up to :data:`U_LAST`; ``p = 0`` (beyond
:data:`U_LAST`, ``p < 1e-289``) has bin 0. Bins are numbered so that a larger bin holds larger
p-values: bin ``N_BINS − 1`` holds ``u < 2⁻¹⁷`` (p up to 1). :func:`bin_upper_p` gives each
bin's largest p-value (at its lowest ``u``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

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
FINE_BINS = int(U_FINE * FINE_STEPS)
_COARSE_BINS = int((U_LAST - U_FINE) * COARSE_STEPS)
N_BINS = 1 + FINE_BINS + _COARSE_BINS
"""Bin 0 for p = 0, the coarse bins, then the fine ones (the largest p-values last)."""
NO_P_VALUE = N_BINS - 1
"""The bin of ``p = 1`` (a zero denominator): the last."""


@njit(cache=True, nogil=True, inline="always")
def robust_t(sxy, squares):  # pragma: no cover - compiled
    """``t_stat`` of the module docstring from ``Σ a·b`` and ``Σ (a·b)²``; 0 (``p = 1``) for a
    zero denominator."""
    if not squares > 0.0:
        return 0.0
    return sxy / math.sqrt(squares)


@njit(cache=True, nogil=True, inline="always")
def lag_p_value(t_stat):  # pragma: no cover - compiled
    """Two-sided p-value of the robust statistic, ``erfc(|t| / √2)``; decreasing in ``|t|``.
    The pair's ``p_value`` is its Šidák correction over the lags."""
    return math.erfc(abs(t_stat) / math.sqrt(2.0))


@njit(cache=True, nogil=True, inline="always")
def t_bin(t_stat):  # pragma: no cover - compiled
    """The histogram bin (module docstring) of :func:`lag_p_value` ``(t_stat)``:
    non-increasing in ``|t_stat|``."""
    z = abs(t_stat)
    u = z + 0.5 * z * z
    if u < U_FINE:
        return N_BINS - 1 - np.int64(u * FINE_STEPS)
    if u < U_LAST:
        return N_BINS - 1 - FINE_BINS - np.int64((u - U_FINE) * COARSE_STEPS)
    return 0


@njit(cache=True, nogil=True)
def bin_upper_p(b):  # pragma: no cover - compiled
    """The largest lag p-value of bin ``b``: ``erfc(z / √2)`` at the bin's lowest ``u``
    (``z = sqrt(1 + 2u) − 1``), 0 for bin 0."""
    if b <= 0:
        return 0.0
    k = N_BINS - 1 - b
    if k < FINE_BINS:
        u = k / FINE_STEPS
    else:
        u = U_FINE + (k - FINE_BINS) / COARSE_STEPS
    z = math.sqrt(1.0 + 2.0 * u) - 1.0
    return math.erfc(z / math.sqrt(2.0))
