"""A ragged float32 returns matrix ``R`` (T × N, NaN = missing) for sizing the compute kernels.

:func:`ragged_returns` feeds the correlation and lead-lag benchmarks the input shape of SPEC §2
directly (no prices, no database): a factor model with fat tails, part of the symbols listed late
or delisted early, and scattered missing days. Unlike :func:`corr_pipeline.synth.generate_universe`
it carries no injected answer; it only has to look like a real window for the kernels' speed and
memory (NaN pattern, correlation structure).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ragged_returns"]


def ragged_returns(
    n_rows: int,
    n_cols: int,
    *,
    seed: int = 0,
    ragged_share: float = 0.15,
    gap_share: float = 0.005,
    n_factors: int = 20,
) -> np.ndarray:
    """float32 ``(n_rows, n_cols)`` returns, NaN where missing; bit-identical for one ``seed``.

    Model (draws from ``numpy.random.default_rng(seed)`` in this order)::

        R[t, j] = market[t] · a_j + sector[t, s(j)] · g_j + 0.01 · e[t, j]

    with ``market`` and the ``n_factors`` sector factors normal with 1 % daily volatility,
    loadings ``a_j, g_j ~ U(0.5, 1.5)``, sector ``s(j)`` uniform and ``e`` Student-t with 4
    degrees of freedom (fat tails). Then each column, with probability ``ragged_share``, loses
    a random 10-60 % of the window, at the start (listed late) or at the end (delisted early)
    with equal probability; finally every cell is NaN with probability ``gap_share``
    (scattered missing days).
    """
    rng = np.random.default_rng(seed)
    market = rng.standard_normal((n_rows, 1)) * 0.01
    sectors = rng.standard_normal((n_rows, n_factors)) * 0.01
    sector_of = rng.integers(0, n_factors, n_cols)
    returns = (
        market * rng.uniform(0.5, 1.5, n_cols)
        + sectors[:, sector_of] * rng.uniform(0.5, 1.5, n_cols)
        + rng.standard_t(4, (n_rows, n_cols)) * 0.01
    ).astype(np.float32)
    ragged = np.flatnonzero(rng.random(n_cols) < ragged_share)
    missing = (rng.uniform(0.1, 0.6, ragged.size) * n_rows).astype(int)
    late = rng.random(ragged.size) < 0.5
    for col, k, is_late in zip(ragged, missing, late, strict=True):
        if is_late:
            returns[:k, col] = np.nan
        else:
            returns[n_rows - k :, col] = np.nan
    returns[rng.random((n_rows, n_cols)) < gap_share] = np.nan
    return returns


def example_returns() -> np.ndarray:
    """The four-symbol universe of the compute functions' docstring examples: 250 standard
    normal float32 returns (``default_rng(0)``) where symbol 1 moves with symbol 0
    (``R[:, 1] += R[:, 0]``), symbol 3 follows symbol 2 a day later (``R[1:, 3] += R[:-1, 2]``)
    and symbol 2 is listed 20 days late (its first 20 returns NaN)."""
    returns = np.random.default_rng(0).standard_normal((250, 4)).astype(np.float32)
    returns[:, 1] += returns[:, 0]
    returns[1:, 3] += returns[:-1, 2]
    returns[:20, 2] = np.nan
    return returns
