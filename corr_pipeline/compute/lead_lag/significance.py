"""Significance of lead-lag pairs: Šidák p-values and Benjamini–Hochberg q-values (SPEC §6).

For an ordered pair ``(i, j)`` with best lag ``ℓ*`` (:mod:`lead_lag`), its robust statistic
``t_stat`` at that lag (:mod:`~corr_pipeline.compute.lead_lag.p_values`):

    p = erfc(|t_stat| / √2)      p_value = 1 − (1 − p)^max_lag

and, over all ``M`` ordered pairs ``i != j`` that have a best lag (not only the reported ones),
with the p-values sorted ascending,

    q_(k) = min over l >= k of p_(l)·M / l,   capped at 1.

**How, in O(block × N) memory.** The q-value of a p-value ``p`` is ``min over t >= p of
M·t / F(t)``, ``F(t)`` the number of pairs with a p-value ``<= t``, so q-values need the counts
``F``, not the sorted p-values. The sweep (:mod:`~corr_pipeline.compute.lead_lag.sweep`)
counts every pair's lag p-value (before Šidák, which is increasing) in the histogram of
:mod:`~corr_pipeline.compute.lead_lag.p_values`, whose bins hold p-values within a factor
``1 + 2⁻¹⁷`` of each other (``1 + 2⁻¹²`` below ``p = 1.3e-17``), and so does their image under
Šidák (concave through 0). With ``C_b`` the pairs in bins ``<= b`` and ``hi'_b`` the Šidák
p-value of the bin's largest p-value, a pair in bin ``b`` has

    q ∈ [min(M·p_value / C_b, min over b' > b of M·lo'_b' / C_b'),  min over b' >= b of M·hi'_b' / C_b']

(every pair of bin ``b'`` has rank ``<= C_b'`` and the last one rank ``C_b'``), an interval of
relative width at most ``7.6e-6`` (``2.4e-4`` where ``q < 1e-6``); the upper end is reported,
and pairs of equal p-value get equal q-values. The histogram is kept sparse (the bins that hold
pairs) and does not depend on the tiles' order, the threads or the stripes.

**The bound** (SPEC §6: within a relative 1e-3). The sweep counts each pair at a p-value ``p'``
within a factor ``1 + ε`` of its own ``p`` (``ε = sweep.EPSILON`` = 9e-4; a pair it cannot
certify so is evaluated exactly). Šidák keeps the factor (``s(p) = 1 − (1 − p)^L`` is concave
with ``s(0) = 0``, so ``s(p·(1 + ε)) <= (1 + ε)·s(p)``). Then the counts ``F'`` of the counted
values satisfy ``F'(t) >= F(t / (1 + ε))`` (a pair with ``p <= t / (1 + ε)`` has ``p' <= t``),
and for any ``x`` within the factor of ``p_i`` (the pair's counted value, or its own exact one,
which the reported q-values use)

    min over t >= x of M·t / F'(t)  <=  min over t >= p_i·(1 + ε) of M·t / F(t / (1 + ε))
                                     =  (1 + ε) · min over s >= p_i of M·s / F(s)  =  (1 + ε)·q_i,

and likewise ``>= q_i / (1 + ε)``: the Benjamini–Hochberg values of the counted p-values are
within a factor ``1 + ε`` of the exact ones, and the histogram's reported value within
``(1 + ε)(1 + 7.6e-6) − 1 < 9.1e-4`` of them (below ``q = 1e-6``, within ``1.2e-3·q``, far
inside SPEC's 1e-5 absolute). ``corr_pipeline_tests`` check every pair's q-value against a
float64 brute force, and each counted p-value against its pair's.

**Significant candidates** (``max_q_value`` < 1). The reported q-value is a non-decreasing step
function of the bin, so ``q <= max_q_value`` exactly when the pair's bin is at most the last
bin whose q-value is ``<= max_q_value`` (:func:`candidate_bin_limit`): the scan's candidacy
condition (``kernels.pair_values``), bounded by the sweep.

The reported pairs' p-values are computed exactly from the pair alone (``kernels.lagged_value``
at its best lag), so they do not depend on the tiles; so are the reverse direction's values.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.kernels import best_lag, lagged_value, pair_data
from corr_pipeline.compute.lead_lag.p_values import N_BINS, bin_upper_p, lag_p_value, t_bin
from corr_pipeline.compute.lead_lag.sweep import PValueCounts, Sweep, sweep_inputs
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


def count_p_values(
    window,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
    leaders: tuple[int, int] | None = None,
) -> PValueCounts:
    """The histogram (:mod:`~corr_pipeline.compute.lead_lag.sweep`) of the lag p-values of the
    best lags of the ordered pairs ``i != j`` with a best lag, for the leaders ``i`` in
    ``leaders`` (all by default) and every lagger ``j``, on ``pool``'s threads."""
    start, stop = (0, window.n_cols) if leaders is None else leaders
    sweep = Sweep(sweep_inputs(window, max_lag, min_overlap))
    sweep.run(np.arange(start, stop), pool)
    return sweep.counts(pool)


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
    laggers[k])`` of the columns of ``R`` (float32 T × N series, NaN where missing: the returns
    or their market residuals), each with a best lag over lags ``1 .. max_lag``.
    ``block_rows``: count the pairs in calls over that many leaders at a time, as stripes do;
    the values do not depend on it.

    Examples
    --------
    >>> import numpy as np
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> s = pair_significance(R, np.array([2]), np.array([3]), max_lag=2, min_overlap=60)
    >>> bool(s.p_value[0] < 1e-10), bool(s.q_value[0] < 1e-9), s.m  # 12 ordered pairs tested
    (True, True, 12)
    """
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
        found = _best_lags(leaders, laggers, max_lag, min_overlap, FALLBACK_TAU, pair_data(window))
    if np.any(found[2] == 0):
        k = int(np.flatnonzero(found[2] == 0)[0])
        raise ValueError(
            f"pair {k} ({leaders[k]}, {laggers[k]}) has no finite lagged correlation "
            f"at lags 1..{max_lag} with min_overlap = {min_overlap}: it has no best lag"
        )
    _, _, _, p, bins = found
    return Significance(sidak(p, max_lag), q_values(bins, counts, max_lag), counts.m)


def annotate(
    pairs: np.ndarray,
    data: tuple,
    counts: PValueCounts,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
) -> np.ndarray:
    """``pairs`` (``LEAD_LAG_DTYPE``, each with a best lag) with their ``p_value``, ``q_value``
    and reverse direction filled in, from the pairs alone (on ``pool``'s threads; ``data``: the
    window's ``kernels.pair_data``) and the histogram ``counts`` of every pair. The best lag is
    the scan's, found by the same exact evaluation and rule, so evaluating that lag alone gives
    the search's value; the reverse pair ``(lagger, leader)`` is searched over every lag."""
    leaders = pairs["leader"].astype(np.int64)
    laggers = pairs["lagger"].astype(np.int64)
    lags = pairs["lag"].astype(np.int64)
    p = np.empty(pairs.size)
    bins = np.empty(pairs.size, dtype=np.int64)
    reverse = (
        np.zeros(pairs.size, dtype=np.int64),
        np.empty(pairs.size),
        np.empty(pairs.size, dtype=np.int64),
    )
    step = max(1024, -(-pairs.size // (4 * available_cores())))

    def evaluate(lo: int) -> None:
        hi = min(lo + step, pairs.size)
        p[lo:hi], bins[lo:hi] = _lag_p_values(
            leaders[lo:hi], laggers[lo:hi], lags[lo:hi], min_overlap, FALLBACK_TAU, data
        )
        _, corr, lag, _, rbins = _best_lags(
            laggers[lo:hi], leaders[lo:hi], max_lag, min_overlap, FALLBACK_TAU, data
        )
        reverse[0][lo:hi], reverse[1][lo:hi], reverse[2][lo:hi] = lag, corr, rbins

    list(pool.map(evaluate, range(0, pairs.size, step)))
    out = pairs.copy()
    out["p_value"] = sidak(p, max_lag)
    out["q_value"] = q_values(bins, counts, max_lag)
    has_reverse = reverse[0] > 0
    out["reverse_lag"] = reverse[0]
    out["reverse_lagged_corr"] = np.where(has_reverse, reverse[1], np.nan)
    out["reverse_q_value"] = np.nan
    out["reverse_q_value"][has_reverse] = q_values(reverse[2][has_reverse], counts, max_lag)
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
def _lag_p_values(leaders, laggers, lags, min_overlap, tau, data):  # pragma: no cover - compiled
    """Per pair, the lag p-value and histogram bin of its robust statistic at lag ``lags[k]``."""
    out = np.empty(leaders.size, dtype=np.float64)
    bins = np.empty(leaders.size, dtype=np.int64)
    for k in range(leaders.size):
        t_stat = lagged_value(leaders[k], laggers[k], lags[k], min_overlap, tau, data)[2]
        out[k] = lag_p_value(t_stat)
        bins[k] = t_bin(t_stat)
    return out, bins


@njit(cache=True, nogil=True)
def _best_lags(leaders, laggers, max_lag, min_overlap, tau, data):  # pragma: no cover - compiled
    """Per pair, its best lag searched over ``1 .. max_lag`` (0 without one): ``(best_abs,
    corr, lag, p, bin)``, the lag p-value and bin of its robust statistic there."""
    n = leaders.size
    magnitude = np.empty(n, dtype=np.float32)
    corr = np.empty(n)
    lag = np.zeros(n, dtype=np.int64)
    p = np.ones(n)
    bins = np.full(n, N_BINS - 1, dtype=np.int64)
    for k in range(n):
        best_abs, value, found, _, t_stat = best_lag(
            leaders[k], laggers[k], max_lag, min_overlap, tau, data
        )
        magnitude[k] = best_abs
        corr[k] = value
        lag[k] = found
        if found > 0:
            p[k] = lag_p_value(t_stat)
            bins[k] = t_bin(t_stat)
    return magnitude, corr, lag, p, bins


def _bin_q_values(counts: PValueCounts, max_lag: int) -> np.ndarray:
    """Per bin of ``counts``, the reported q-value of its pairs (module docstring), capped at 1:
    ``min over b' >= b of M·hi'_b' / C_b'``, in one backward pass (no temporaries)."""
    return _suffix_q_values(counts.bins, counts.counts, counts.m, max_lag)


@njit(cache=True, nogil=True)
def _suffix_q_values(bins, counts, m, max_lag):  # pragma: no cover - compiled
    out = np.empty(bins.size)
    after = 0  # pairs in the bins after this one: C_b = m − after
    lowest = np.inf
    for k in range(bins.size - 1, -1, -1):
        lowest = min(lowest, m * _sidak_edge(bins[k], max_lag) / (m - after))
        out[k] = min(lowest, 1.0)
        after += counts[k]
    return out


@njit(cache=True, nogil=True, inline="always")
def _sidak_edge(b, max_lag):  # pragma: no cover - compiled
    """The Šidák p-value of bin ``b``'s largest lag p-value."""
    edge = bin_upper_p(np.int64(b))
    return -math.expm1(max_lag * math.log1p(-edge)) if edge < 1.0 else 1.0


@njit(cache=True, nogil=True)
def _q_of_bins(query, bins, below, per_bin, m, max_lag):  # pragma: no cover - compiled
    """The reported q-value of a pair in bin ``query[k]``: its bin's (``per_bin``) when pairs
    were counted there, else ``min(M·hi'_b / C, the next counted bin's)``, ``C`` the pairs
    counted in the bins below (``below``, cumulative): the Benjamini–Hochberg value of the
    counted p-values at the upper end of its bin (module docstring)."""
    out = np.empty(query.size)
    for k in range(query.size):
        b = query[k]
        at = np.searchsorted(bins, b)
        after = per_bin[at] if at < bins.size else 1.0
        if at < bins.size and bins[at] == b:
            out[k] = after
        elif at > 0:
            out[k] = min(after, m * _sidak_edge(b, max_lag) / below[at - 1], 1.0)
        else:
            out[k] = after
    return out


def q_values(bins: np.ndarray, counts: PValueCounts, max_lag: int) -> np.ndarray:
    """The q-values (module docstring) of pairs whose exact p-values are in the histogram bins
    ``bins`` (``p_values.t_bin``) of ``counts`` (a pair's own bin may hold no counted pair:
    its counted value may lie in a neighbouring bin, within the factor ``1 + ε``)."""
    if bins.size == 0:
        return np.empty(0, dtype=np.float64)
    return _q_of_bins(
        np.asarray(bins, dtype=np.int64),
        counts.bins.astype(np.int64),
        np.cumsum(counts.counts),
        np.concatenate([_bin_q_values(counts, max_lag), [1.0]]),
        counts.m,
        max_lag,
    )


def candidate_bin_limit(counts: PValueCounts, max_q_value: float, max_lag: int) -> int:
    """The largest histogram bin whose pairs have a q-value ``<= max_q_value`` (module
    docstring; :func:`q_values` is non-decreasing in the bin): ``N_BINS`` for
    ``max_q_value >= 1`` (no condition), −1 when no pair qualifies. After the last counted bin
    that qualifies, the bins before the next counted one qualify while ``M·hi'_b / C``
    does."""
    if max_q_value >= 1.0:
        return N_BINS
    passing = np.flatnonzero(_bin_q_values(counts, max_lag) <= max_q_value)
    if passing.size == 0:
        return -1
    last = int(passing[-1])
    limit = int(counts.bins[last])
    stop = int(counts.bins[last + 1]) if last + 1 < counts.bins.size else N_BINS
    lo, hi = limit, stop - 1  # the largest bin in (limit, stop) whose q still qualifies
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if q_values(np.array([mid]), counts, max_lag)[0] <= max_q_value:
            lo = mid
        else:
            hi = mid - 1
    return lo
