"""Test data builders: return matrices ``R`` (``T × N`` float32, NaN = missing) for the compute tests.

Realistic part: a fat-tailed factor model (market + sectors, Student-t innovations, occasional
jumps), ragged listings and delistings, trading halts (NaN runs), stale quotes (runs of exact zero
returns) and ~0.5 % scattered NaNs.

Adversarial part (:func:`adversarial_columns`), each column named so failures can be traced:
two symbols with no common row; a column constant on part of the window with a partner present
only there (→ NaN, zero variance on the overlap); overlaps of ``min_overlap − 1``, ``min_overlap``
and ``min_overlap + 1`` rows; a symbol with fewer than ``min_overlap`` finite returns (NaN
diagonal); quiet (1e-5 vol) and drifting (0.05 ± 1e-4) regimes with a partner present only
there; 1e15 and 1e-15 scales; near-perfect correlation and anti-correlation (1e-6 noise); an
all-NaN column; a fully constant column; an exact duplicate column.

Lead-lag injection (:func:`inject_lead_lag`): an independent leader and
``lagger[t + lag] = leader[t] + noise``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Universe:
    name: str
    R: np.ndarray  # float32 (T, N)
    min_overlap: int
    column_names: list[str]
    injected: list[tuple[int, int, int]] = field(default_factory=list)  # (leader, lagger, lag)

    @property
    def T(self) -> int:
        return self.R.shape[0]

    @property
    def N(self) -> int:
        return self.R.shape[1]

    def __repr__(self) -> str:  # short ids in pytest output
        return f"Universe({self.name}, T={self.T}, N={self.N}, min_overlap={self.min_overlap})"


def _student_t(rng: np.random.Generator, shape, df: float = 4.0) -> np.ndarray:
    """Unit-variance Student-t draws (fat tails)."""
    return rng.standard_t(df, size=shape) * np.sqrt((df - 2.0) / df)


def factor_returns(
    rng: np.random.Generator, T: int, N: int, n_sectors: int = 8, df: float = 4.0
) -> np.ndarray:
    """Daily log returns from market + sector factors with fat-tailed shocks (float64, no NaN)."""
    market = 0.010 * _student_t(rng, T, df)
    sectors = 0.008 * _student_t(rng, (T, n_sectors), df)
    sector_of = rng.integers(0, n_sectors, size=N)
    beta = rng.normal(1.0, 0.35, size=N)
    sector_loading = rng.uniform(0.3, 1.2, size=N)
    idio_vol = np.exp(rng.normal(np.log(0.015), 0.4, size=N))
    idio = idio_vol * _student_t(rng, (T, N), df)
    jumps = (rng.random((T, N)) < 0.002) * rng.normal(0.0, 0.12, size=(T, N))
    return market[:, None] * beta + sectors[:, sector_of] * sector_loading + idio + jumps


def make_ragged(R: np.ndarray, rng: np.random.Generator, late: float = 0.15, early: float = 0.1):
    """Listings (NaN before a start row) and delistings (NaN after an end row), in place."""
    T, N = R.shape
    for j in range(N):
        u = rng.random()
        if u < late:
            R[: rng.integers(1, max(2, int(0.6 * T))), j] = np.nan
        elif u < late + early:
            R[rng.integers(int(0.4 * T), T) :, j] = np.nan
    return R


def add_halts(R: np.ndarray, rng: np.random.Generator, n_halts: int, max_len: int = 12):
    """Trading halts: runs of NaN returns, in place."""
    T, N = R.shape
    if N == 0:
        return R
    for _ in range(n_halts):
        j = rng.integers(0, N)
        start = rng.integers(0, T)
        R[start : start + rng.integers(1, max_len + 1), j] = np.nan
    return R


def add_stale_quotes(R: np.ndarray, rng: np.random.Generator, n_runs: int, max_len: int = 8):
    """Illiquid names: runs of exactly zero returns (unchanged close), in place."""
    T, N = R.shape
    if N == 0:
        return R
    for _ in range(n_runs):
        j = rng.integers(0, N)
        start = rng.integers(0, T)
        segment = R[start : start + rng.integers(2, max_len + 1), j]
        segment[np.isfinite(segment)] = 0.0
    return R


def add_scattered_nans(R: np.ndarray, rng: np.random.Generator, fraction: float = 0.005):
    """Isolated bad prints: a fraction of entries set to NaN, in place."""
    R[rng.random(R.shape) < fraction] = np.nan
    return R


def inject_lead_lag(
    R: np.ndarray,
    rng: np.random.Generator,
    pairs: list[tuple[int, int, int]],
    noise: float = 0.6,
):
    """For each ``(leader, lagger, lag)``: the leader becomes an independent fat-tailed series,
    and ``lagger[t + lag] = leader[t] + noise · σ · ε`` (``lagger[:lag]`` is pure noise). In place.
    Lagged correlation ≈ 1/sqrt(1 + noise²); synchronous correlation ≈ 0.
    """
    T = R.shape[0]
    for leader, lagger, lag in pairs:
        sigma = 0.02
        R[:, leader] = sigma * _student_t(rng, T)
        R[:, lagger] = noise * sigma * _student_t(rng, T)
        R[lag:, lagger] += R[: T - lag, leader]
    return R


def adversarial_columns(
    rng: np.random.Generator, T: int, min_overlap: int
) -> tuple[np.ndarray, list[str]]:
    """The adversarial columns listed in the module docstring, as float64 ``(T, K)``."""
    base = factor_returns(rng, T, 6)
    x, y, z = base[:, 0], base[:, 1], base[:, 2]
    columns: dict[str, np.ndarray] = {}
    nan = np.full(T, np.nan)

    half = T // 2
    a = nan.copy()
    a[:half] = x[:half]
    b = nan.copy()
    b[half:] = y[half:]
    columns["no_overlap_a"] = a
    columns["no_overlap_b"] = b

    seg_len = min(T // 2, min_overlap + 3)
    seg_start = (T - seg_len) // 3
    const_part = z.copy()
    const_part[seg_start : seg_start + seg_len] = 0.0123
    partner = nan.copy()
    partner[seg_start : seg_start + seg_len] = x[seg_start : seg_start + seg_len]
    columns["constant_on_part"] = const_part
    columns["partner_only_where_constant"] = partner
    zero_part = y.copy()
    zero_part[seg_start : seg_start + seg_len] = 0.0
    columns["zero_on_part"] = zero_part

    # anchor finite on rows [0, h); partner_m finite on rows [h - m, T) → overlap exactly m.
    h = max(min_overlap + 1, T // 2)
    anchor = nan.copy()
    anchor[:h] = x[:h] + 0.5 * z[:h]
    columns["overlap_anchor"] = anchor
    for m in (min_overlap - 1, min_overlap, min_overlap + 1):
        if m <= 0 or m > h:
            continue
        p = nan.copy()
        p[h - m :] = (x + base[:, 3])[h - m :]
        columns[f"overlap_{m}"] = p
    few = nan.copy()
    few[: min_overlap - 1] = base[: min_overlap - 1, 4]
    columns["fewer_than_min_overlap"] = few

    # Regimes: on the partner's rows the column is far quieter (1e-5 vs 5e-2 vol) or sits on a
    # large drift (0.05 ± 1e-4); a correlation from whole-column moments would cancel badly.
    regime_len = min(T // 2, max(min_overlap + 5, T // 3))
    regime = slice(T - regime_len - 1, T - 1)
    signal = base[regime, 3] + 0.5 * base[regime, 4]
    quiet = 2.5 * y
    quiet[regime] = 1e-5 * signal
    drift = y.copy()
    drift[regime] = 0.05 + 1e-4 * (signal + 0.8 * base[regime, 5])
    regime_partner = nan.copy()
    regime_partner[regime] = 0.02 * base[regime, 3]
    columns["regime_quiet"] = quiet
    columns["regime_drift"] = drift
    columns["regime_partner"] = regime_partner

    columns["scale_1e15"] = 1e15 * (x + 0.7 * base[:, 5])
    columns["scale_1e-15"] = 1e-15 * (y + 0.7 * base[:, 5])
    columns["near_perfect_pos"] = x + 1e-6 * rng.standard_normal(T)
    columns["near_perfect_neg"] = -x + 1e-6 * rng.standard_normal(T)
    columns["all_nan"] = nan.copy()
    columns["fully_constant"] = np.full(T, 0.003)
    columns["duplicate_of_z"] = z.copy()
    columns["z"] = z.copy()
    names = list(columns)
    return np.column_stack([columns[name] for name in names]), names


def realistic_universe(
    seed: int,
    T: int,
    N: int,
    min_overlap: int,
    *,
    ragged: bool = True,
    halts: bool = True,
    nan_fraction: float = 0.005,
    injected: list[tuple[int, int, int]] | None = None,
    name: str | None = None,
) -> Universe:
    """Factor model + (optionally) ragged listings, halts, stale quotes, scattered NaNs and
    injected lead-lag pairs."""
    rng = np.random.default_rng(seed)
    R = factor_returns(rng, T, N)
    injected = list(injected or [])
    inject_lead_lag(R, rng, injected)
    if ragged:
        make_ragged(R, rng)
    if halts:
        add_halts(R, rng, n_halts=max(1, N // 4), max_len=max(2, T // 20))
        add_stale_quotes(R, rng, n_runs=max(1, N // 10))
    add_scattered_nans(R, rng, nan_fraction)
    return Universe(
        name or f"realistic_s{seed}_T{T}_N{N}",
        R.astype(np.float32),
        min_overlap,
        [f"s{j}" for j in range(N)],
        injected,
    )


def adversarial_universe(seed: int, T: int, N_realistic: int, min_overlap: int) -> Universe:
    """Realistic columns with every adversarial column inserted at random positions."""
    rng = np.random.default_rng(seed)
    realistic = factor_returns(rng, T, N_realistic)
    make_ragged(realistic, rng)
    add_halts(realistic, rng, n_halts=max(1, N_realistic // 4), max_len=max(2, T // 20))
    add_scattered_nans(realistic, rng)
    adversarial, adversarial_names = adversarial_columns(rng, T, min_overlap)
    R = np.column_stack([realistic, adversarial])
    names = [f"s{j}" for j in range(N_realistic)] + adversarial_names
    order = rng.permutation(R.shape[1])
    return Universe(
        f"adversarial_s{seed}_T{T}_N{R.shape[1]}",
        R[:, order].astype(np.float32),
        min_overlap,
        [names[j] for j in order],
    )


def random_small_universe(
    seed: int, T: int, N: int, min_overlap: int, nan_fraction: float
) -> Universe:
    """Small random universe for property tests: factor model, ragged, dense NaNs, and with some
    probability an all-NaN or constant column."""
    rng = np.random.default_rng(seed)
    R = factor_returns(rng, T, N, n_sectors=3)
    make_ragged(R, rng, late=0.3, early=0.2)
    add_scattered_nans(R, rng, nan_fraction)
    if N >= 3 and rng.random() < 0.3:
        R[:, rng.integers(0, N)] = np.nan
    if N >= 3 and rng.random() < 0.3:
        R[:, rng.integers(0, N)] = 0.004
    return Universe(
        f"small_s{seed}_T{T}_N{N}", R.astype(np.float32), min_overlap, [f"s{j}" for j in range(N)]
    )


def correlation_universes() -> list[Universe]:
    """The fixed set of universes every correlation test runs over."""
    return [
        realistic_universe(1, 40, 1, 20, name="N1_T40"),
        realistic_universe(2, 252, 1, 60, name="N1_T252"),
        realistic_universe(3, 40, 2, 20, ragged=False, name="N2_T40"),
        realistic_universe(4, 252, 2, 60, name="N2_T252"),
        realistic_universe(5, 40, 37, 20, name="realistic_T40_N37"),
        realistic_universe(6, 252, 301, 60, name="realistic_T252_N301"),
        realistic_universe(7, 252, 129, 2, name="realistic_T252_N129_minoverlap2"),
        adversarial_universe(8, 40, 17, 10),
        adversarial_universe(9, 252, 203, 60),
        adversarial_universe(10, 252, 50, 20),
        adversarial_universe(11, 130, 40, 30),
    ]
