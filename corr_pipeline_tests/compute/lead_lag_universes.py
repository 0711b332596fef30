"""Universes of the lead-lag tests beyond :mod:`corr_pipeline_tests.compute.universes`: pairs
to inject, and the special universes the screen's bounds and the brute force are checked on
(full histories, every column ragged, constant segments, exact ties)."""

from __future__ import annotations

import numpy as np

from corr_pipeline_tests.compute.universes import (
    Universe,
    add_halts,
    add_stale_quotes,
    factor_returns,
    realistic_universe,
)


def injected_pairs(seed: int, N: int, n_pairs: int, max_lag: int) -> list[tuple[int, int, int]]:
    """``n_pairs`` (leader, lagger, lag) of distinct symbols, lags in ``1 .. max_lag``."""
    rng = np.random.default_rng(1000 + seed)
    symbols = rng.choice(N, size=2 * n_pairs, replace=False)
    return [
        (int(symbols[2 * p]), int(symbols[2 * p + 1]), int(rng.integers(1, max_lag + 1)))
        for p in range(n_pairs)
    ]


def all_ragged_universe(seed: int, T: int, N: int, min_overlap: int) -> Universe:
    """Every column listed late or delisted early (10-60 % of the window missing), plus halts."""
    rng = np.random.default_rng(seed)
    R = factor_returns(rng, T, N)
    for j in range(N):
        k = int(rng.uniform(0.1, 0.6) * T)
        if rng.random() < 0.5:
            R[:k, j] = np.nan
        else:
            R[T - k :, j] = np.nan
    add_halts(R, rng, n_halts=N // 3, max_len=6)
    return Universe(
        f"all_ragged_s{seed}", R.astype(np.float32), min_overlap, [f"s{j}" for j in range(N)]
    )


def constant_segments_universe(seed: int, T: int, N: int, min_overlap: int) -> Universe:
    """Mixed universe with many runs of exactly zero returns, a constant column and a column
    constant except for its first rows (near-constant overlaps: the float64 fallback)."""
    universe = realistic_universe(seed, T, N, min_overlap, injected=injected_pairs(seed, N, 3, 3))
    rng = np.random.default_rng(seed)
    R = universe.R.copy()
    add_stale_quotes(R, rng, n_runs=N, max_len=T // 3)
    R[:, 1] = 0.003
    R[:, 2] = 0.001
    R[:8, 2] = rng.normal(0.0, 0.02, 8)
    R[:, 3] = R[:, 4] * 1e6 + 7.0  # huge offset and scale
    return Universe(
        f"constant_segments_s{seed}", R.astype(np.float32), min_overlap, universe.column_names
    )


def tied_universe(seed: int, T: int, N: int, min_overlap: int) -> Universe:
    """Exact duplicate columns (leaders and laggers): exact ties everywhere among them."""
    universe = realistic_universe(seed, T, N, min_overlap, injected=injected_pairs(seed, N, 3, 2))
    R = universe.R.copy()
    for a, b in ((0, 5), (0, 9), (3, 11), (20, 21)):
        R[:, b] = R[:, a]
    for leader, lagger, _ in universe.injected:
        R[:, (lagger + 1) % N] = R[:, lagger]
        R[:, (leader + 2) % N] = R[:, leader]
    return Universe(f"tied_s{seed}", R, min_overlap, universe.column_names)


SPECIAL_UNIVERSES = {
    "full_history": lambda: realistic_universe(
        70,
        252,
        120,
        60,
        ragged=False,
        halts=False,
        nan_fraction=0.0,
        injected=injected_pairs(70, 120, 4, 5),
    ),
    "full_history_scattered_gaps": lambda: realistic_universe(
        71, 252, 120, 60, ragged=False, halts=False, nan_fraction=0.01
    ),
    "all_ragged": lambda: all_ragged_universe(72, 200, 110, 40),
    "mixed": lambda: realistic_universe(73, 252, 130, 60, injected=injected_pairs(73, 130, 4, 5)),
    "constant_segments": lambda: constant_segments_universe(74, 120, 90, 30),
    "ties": lambda: tied_universe(75, 150, 80, 40),
}
