"""Significance of lead-lag pairs: Šidák p-values and Benjamini–Hochberg q-values (SPEC §6).

For an ordered pair ``(i, j)`` with best lag ``ℓ*`` (:mod:`lead_lag`), ``r`` its lagged
correlation and ``n`` its overlap:

    z = atanh(r)·sqrt(n − 3)      p = erfc(|z| / √2)      p_value = 1 − (1 − p)^max_lag

and, over all ``m`` ordered pairs ``i != j`` that have a best lag (not only the reported ones),
with the p-values sorted ascending,

    q_(k) = min over l >= k of p_(l)·m / l,   capped at 1.

**How, in O(block × N) memory.** The q-value of a p-value ``p`` is ``inf over t >= p of
m·t / F(t)``, ``F(t)`` the number of pairs with a p-value ``<= t``, so q-values need the counts
``F``, not the sorted p-values. The exact pass (:mod:`~corr_pipeline.compute.lead_lag.exact_pass`)
computes every pair's best-lag correlation from float64 products with the exact evaluation's
sums and formula and counts its lag p-value ``p`` (before Šidák, which is increasing) in the
histogram of
:mod:`~corr_pipeline.compute.lead_lag.p_values`, whose bins hold p-values within a factor
``1 + 2⁻¹⁷`` of each other (``1 + 2⁻¹²`` below ``p = 1.3e-17``; the histogram bins
``u = z + z²/2``, which needs no ``erfc``), and so does their image under Šidák (concave
through 0). With ``C_b`` the pairs in bins ``<= b`` and ``hi'_b`` the Šidák p-value of the
bin's largest p-value, a pair in bin ``b`` has

    q ∈ [min(m·p_value / C_b, min over b' > b of m·lo'_b' / C_b'),  min over b' >= b of m·hi'_b' / C_b']

(every pair of bin ``b'`` has rank ``<= C_b'`` and the last one rank ``C_b'``), an interval of
relative width at most ``7.6e-6`` (``2.4e-4`` where ``q < 1e-6``); the upper end is reported,
and pairs of equal p-value get equal q-values. The histogram is kept sparse (the bins that hold
pairs) and does not depend on the tiles' order, the threads or the stripes.

**Significant candidates** (``max_q_value`` < 1). The reported q-value is a non-decreasing step
function of the bin, so ``q <= max_q_value`` exactly when the pair's bin is at most the last
bin whose q-value is ``<= max_q_value`` (:func:`candidate_bin_limit`): the scan's candidacy
condition (``kernels.pair_values``), bounded by its screen; the scan then needs every count
before its first selection, so the pass runs whole before it (without the condition, the pass
runs block by block inside the scan and bounds its improvements too).

The reported pairs' p-values are computed exactly from the pair alone (``kernels.lagged_value``
at each lag), so they do not depend on the tiles.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.exact_pass import PValueCounts, count_p_values
from corr_pipeline.compute.lead_lag.kernels import lagged_value, pair_data
from corr_pipeline.compute.lead_lag.p_values import N_BINS, bin_upper_p, lag_p_value, p_bin
from corr_pipeline.compute.standardize import standardize
from corr_pipeline.compute.validation import check_min_overlap, check_positive_int, check_returns
from corr_pipeline.compute.workers import available_cores, worker_pool


@dataclass(frozen=True)
class Significance:
    """P- and q-values of the reported pairs, aligned with them; ``m`` the pairs counted."""

    p_value: np.ndarray  # float64
    q_value: np.ndarray  # float64
    m: int


def sidak(p: np.ndarray | float, max_lag: int) -> np.ndarray:
    """``1 − (1 − p)^max_lag``, in float64."""
    with np.errstate(divide="ignore"):  # p = 1: log1p(−1) = −inf, and the result 1
        return -np.expm1(max_lag * np.log1p(-np.asarray(p, dtype=np.float64)))


def pair_significance(
    R: np.ndarray,
    leaders: np.ndarray,
    laggers: np.ndarray,
    *,
    max_lag: int,
    min_overlap: int,
    block_rows: int | None = None,
) -> Significance:
    """P- and q-values (see the module docstring) of the ordered pairs ``(leaders[k],
    laggers[k])`` of the columns of ``R`` (float32 T × N returns, NaN where missing), each with a
    best lag over lags ``1 .. max_lag``. ``block_rows``: count the pairs in calls over that many
    leaders at a time, as stripes do; the values do not depend on it."""
    check_returns(R)
    n_rows, n_cols = R.shape
    check_positive_int(max_lag, "max_lag")
    if max_lag >= n_rows:
        raise ValueError(f"max_lag must be < T = {n_rows}, got {max_lag}")
    check_min_overlap(min_overlap, n_rows)
    leaders = np.asarray(leaders, dtype=np.int64)
    laggers = np.asarray(laggers, dtype=np.int64)
    _check_pairs(leaders, laggers, n_cols)
    with worker_pool() as pool:
        window = standardize(R, pool, layout="lead-lag")
        step = n_cols if block_rows is None else max(1, int(block_rows))
        counts = PValueCounts.merge(
            [
                count_p_values(window, max_lag, min_overlap, pool, (lo, min(lo + step, n_cols)))
                for lo in range(0, n_cols, step)
            ]
        )
    lags = (np.ones(leaders.size, np.int64), np.full(leaders.size, max_lag, np.int64))
    p, bins = _pair_lag_p_values(
        leaders, laggers, lags, min_overlap, FALLBACK_TAU, pair_data(window)
    )
    if np.isnan(p).any():
        k = int(np.flatnonzero(np.isnan(p))[0])
        raise ValueError(
            f"pair {k} ({leaders[k]}, {laggers[k]}) has no finite lagged correlation "
            f"at lags 1..{max_lag} with min_overlap = {min_overlap}: it has no best lag"
        )
    return Significance(sidak(p, max_lag), q_values(bins, counts, max_lag), counts.m)


def annotate(
    pairs: np.ndarray,
    data: tuple,
    counts: PValueCounts,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
) -> np.ndarray:
    """``pairs`` (``LEAD_LAG_DTYPE``, each with a best lag) with their ``p_value`` and
    ``q_value`` filled in, from the pairs alone at their best lag (on ``pool``'s threads;
    ``data``: the window's ``kernels.pair_data``, as the scan's screen holds it) and the
    histogram ``counts`` of every pair. The best lag is the scan's, found by the same exact
    evaluation and rule, so evaluating that lag alone gives the search's value."""
    leaders = pairs["leader"].astype(np.int64)
    laggers = pairs["lagger"].astype(np.int64)
    lags = pairs["lag"].astype(np.int64)
    p = np.empty(pairs.size)
    bins = np.empty(pairs.size, dtype=np.int64)
    step = max(1024, -(-pairs.size // (4 * available_cores())))

    def evaluate(lo: int) -> None:
        hi = min(lo + step, pairs.size)
        p[lo:hi], bins[lo:hi] = _pair_lag_p_values(
            leaders[lo:hi], laggers[lo:hi], (lags[lo:hi],) * 2, min_overlap, FALLBACK_TAU, data
        )

    list(pool.map(evaluate, range(0, pairs.size, step)))
    out = pairs.copy()
    out["p_value"] = sidak(p, max_lag)
    out["q_value"] = q_values(bins, counts, max_lag)
    return out


def _check_pairs(leaders: np.ndarray, laggers: np.ndarray, n_cols: int) -> None:
    if leaders.shape != laggers.shape or leaders.ndim != 1:
        raise ValueError(
            f"leaders and laggers must be 1-d of one length, got {leaders.shape}, {laggers.shape}"
        )
    for name, side in (("leader", leaders), ("lagger", laggers)):
        bad = np.flatnonzero((side < 0) | (side >= n_cols))
        if bad.size:
            raise ValueError(f"pair {bad[0]}: {name} {side[bad[0]]} is outside [0, {n_cols})")
    same = np.flatnonzero(leaders == laggers)
    if same.size:
        raise ValueError(f"pair {same[0]} is a symbol with itself ({leaders[same[0]]})")


@njit(cache=True, nogil=True)
def _pair_lag_p_values(
    leaders, laggers, lags, min_overlap, tau, data
):  # pragma: no cover - compiled
    """Per pair, the lag p-value of its best lag (NaN without one) and its histogram bin, the
    pair alone evaluated over the lags ``lags[0][k] .. lags[1][k]`` (the largest float32
    ``|r|``, ties to the smaller lag)."""
    out = np.empty(leaders.size, dtype=np.float64)
    bins = np.zeros(leaders.size, dtype=np.int64)
    for k in range(leaders.size):
        best_abs = np.float32(-1.0)
        best_r = np.nan
        best_n = 0
        for lag in range(lags[0][k], lags[1][k] + 1):
            value, count = lagged_value(leaders[k], laggers[k], lag, min_overlap, tau, data)
            magnitude = abs(np.float32(value))
            if magnitude > best_abs:
                best_abs = magnitude
                best_r = value
                best_n = count
        out[k] = np.nan
        if best_abs >= 0:
            out[k] = lag_p_value(best_r, best_n)
            bins[k] = p_bin(best_r, best_n)
    return out, bins


def _bin_q_values(counts: PValueCounts, max_lag: int) -> np.ndarray:
    """Per bin of ``counts``, the reported q-value of its pairs (module docstring), capped at 1:
    ``min over b' >= b of m·hi'_b' / C_b'``, in one backward pass (no temporaries)."""
    return _suffix_q_values(counts.bins, counts.counts, counts.m, max_lag)


@njit(cache=True, nogil=True)
def _suffix_q_values(bins, counts, m, max_lag):  # pragma: no cover - compiled
    out = np.empty(bins.size)
    after = 0  # pairs in the bins after this one: C_b = m − after
    lowest = np.inf
    for k in range(bins.size - 1, -1, -1):
        edge = bin_upper_p(np.int64(bins[k]))
        sidak_edge = -math.expm1(max_lag * math.log1p(-edge)) if edge < 1.0 else 1.0
        lowest = min(lowest, m * sidak_edge / (m - after))
        out[k] = min(lowest, 1.0)
        after += counts[k]
    return out


def q_values(bins: np.ndarray, counts: PValueCounts, max_lag: int) -> np.ndarray:
    """The q-values (module docstring) of pairs in the histogram bins ``bins``
    (``p_values.p_bin``) of ``counts``."""
    if bins.size == 0:
        return np.empty(0, dtype=np.float64)
    per_bin = np.concatenate([_bin_q_values(counts, max_lag), [1.0]])
    return per_bin[np.searchsorted(counts.bins, bins)]


def candidate_bin_limit(counts: PValueCounts, max_q_value: float, max_lag: int) -> int:
    """The largest histogram bin whose pairs have a q-value ``<= max_q_value`` (module
    docstring): ``N_BINS`` for ``max_q_value >= 1`` (no condition), −1 when no pair
    qualifies."""
    if max_q_value >= 1.0:
        return N_BINS
    passing = np.flatnonzero(_bin_q_values(counts, max_lag) <= max_q_value)
    if passing.size == 0:
        return -1
    return int(counts.bins[passing[-1]])
