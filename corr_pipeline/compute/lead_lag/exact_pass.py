"""The exact pass over every ordered pair of lead-lag (SPEC §6): each pair's best-lag correlation
from float64 products, its lag p-value counted for the q-values and, for the scan, bounds of its
improvement that bracket the exact evaluation's within a few float32 units.

**The pass.** Work items of one tile of ``GEMM_TILE`` leaders × one chunk of
``PRODUCT_COLUMNS`` laggers: one float64 product of the tile's leaders shifted by every lag
against the chunk (:func:`_shift_leaders`) gives every pair's ``Sxy`` at every lag, then
:func:`count_tile` forms each pair's correlation at each lag from the exact evaluation's sums
(``kernels.overlap_moments``: the same operations in the same order, vectorised over the
laggers) and formula (``kernels.lagged_from_sums``, its float64 fallback for an
ill-conditioned variance included), takes the best lag as ``kernels.pair_values`` does (the
largest float32 ``|r|``, ties to the smaller lag) and counts the bin of its lag p-value
(``p_values.p_bin``) in its thread's histogram, which becomes a sparse :class:`PValueCounts`.
A thread's histogram holds one byte a bin (8.6 MB, a quarter of ``int32``'s cache footprint and
memory): a bin that reaches 256 is reset to 0 and recorded as one *spill* of 256 pairs, so the
count of a bin is its byte plus 256 times its spills, exact for any number of pairs. The bins
equal the exact evaluation's bin for bin (a test checks it), so the histogram does not depend
on the tiles' order, the threads or the stripes.

**The bounds** (:meth:`ExactPass.bound_block`, when the synchronous correlation is given).
A pair's computed correlation at a lag differs from the exact evaluation's only in ``Sxy``:
the product sums the same float64 terms (each an exact product of two float32 values) in
another order, and any order of ``T`` terms lies within ``γ_T·Σ|x·y|`` of the true sum
(``γ_T = T·u / (1 − T·u)``, ``u = 2⁻⁵³``). By Cauchy–Schwarz ``Σ|x·y| <= sqrt(Sxx·Syy)``, and a
pair that does not take the fallback has ``Sxx − Sx²/n > tau·base_x >= tau·Sxx`` (likewise for
``y``), so

    |r − r_exact| <= 2·γ_T·sqrt(Sxx·Syy) / sqrt(var_x·var_y) + 4u < 2·γ_T / tau + 4u,

which :func:`exactness_margin` doubles: ``δ = (64·T + 8)·2⁻⁵³`` (2.5e-12 at T = 350, with
``tau = 1/16``); the fallback's value is the exact evaluation's own. A maximum moves by no more
than its terms, so the best lag's ``max_ℓ |r_exact|`` lies within ``δ`` of the computed
``M = max_ℓ |r|``, which lies within ``2⁻²⁴`` of ``b = float32(M)``, the pass's best magnitude.
Rounding to float32 is monotone, so the exact evaluation's best magnitude lies in
``[float32(b·(1 − 2⁻²³) − δ), float32(b·(1 + 2⁻²³) + δ)]`` (clipped to [0, 1]), and its float32
improvement ``best − |sync|`` (monotone too) between those ends less ``|sync|`` (``corr``'s, as
the exact evaluation reads it): one or two float32 units apart. ``upper`` is −∞ when it is at most
``min_improvement`` (no candidate), ``lower`` when it is (not surely one), both for ``i = j``
and for a pair without a finite lag: the scan's selection (``kernels.select_rows``,
``scan.ColumnPool``) then evaluates exactly only the pairs near each top-k's boundary.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numba import njit

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.kernels import lagged_from_sums, pair_data
from corr_pipeline.compute.lead_lag.p_values import N_BINS, p_bin
from corr_pipeline.compute.standardize import Standardized
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, Progress, tiles_covering
from corr_pipeline.compute.workers import fresh_buffer

_NO_BOUNDS = np.empty((0, 0), dtype=np.float32)


@dataclass(frozen=True)
class PValueCounts:
    """The histogram of the lag p-values of every ordered pair with a best lag, sparse: the bins
    that hold pairs (ascending) and how many each."""

    bins: np.ndarray  # int32 (``p_values.N_BINS`` < 2³¹)
    counts: np.ndarray  # int64

    @property
    def m(self) -> int:
        """The pairs counted."""
        return int(self.counts.sum())

    @classmethod
    def merge(cls, parts: list[PValueCounts]) -> PValueCounts:
        """One histogram of several (of disjoint sets of pairs)."""
        if not parts:
            return cls(np.empty(0, np.int32), np.empty(0, np.int64))
        bins, where = np.unique(np.concatenate([p.bins for p in parts]), return_inverse=True)
        weights = np.concatenate([p.counts for p in parts]).astype(np.float64)  # < 2⁵³: exact
        counts = np.bincount(where, weights=weights, minlength=bins.size)
        return cls(bins.astype(np.int32), counts.astype(np.int64))


def exactness_margin(n_rows: int) -> float:
    """``δ`` of the module docstring: the computed lagged correlations lie within it of the exact
    evaluation's, for a window of ``n_rows`` rows."""
    return (64.0 * n_rows + 8.0) * 2.0**-53


def counts_with_bounds(scanned: bool, corr: np.ndarray | None, max_q_value: float) -> bool:
    """Whether the scan's bounds come from the pass that counts the p-values (one pass over the
    products): when there is a scan, ``corr`` is given (else the screen bounds the synchronous
    correlation from its own lag-0 product) and no q-value condition needs every count before
    the first selection."""
    return scanned and corr is not None and max_q_value >= 1.0


def count_items(n_leaders: int, n_cols: int) -> int:
    """The work items of the pass over ``n_leaders`` leaders from a tile's start."""
    return -(-n_leaders // GEMM_TILE) * -(-n_cols // PRODUCT_COLUMNS)


@dataclass
class _Workspace:
    """One thread's counts and buffers for :class:`ExactPass`."""

    histogram: np.ndarray  # uint8, N_BINS (module docstring); pages as touched
    spilled: list[np.ndarray]  # the spilled bins, an array per work item that spilled
    spills: np.ndarray  # int32, room for one item's spills
    shifted: np.ndarray  # L × GEMM_TILE × T, the leaders shifted by every lag
    columns: np.ndarray  # T × PRODUCT_COLUMNS, the laggers in float64
    products: np.ndarray  # L · GEMM_TILE · PRODUCT_COLUMNS


class ExactPass:
    """The pass of the module docstring over a window, for one call: blocks of leaders run on a
    pool's threads, each thread counting into its own histogram (kept across blocks) with its
    own buffers (``L × GEMM_TILE × PRODUCT_COLUMNS`` float64 products, 10.5 MB at L = 5) and its
    spills (module docstring); :meth:`counts` sums the histograms and drops them."""

    def __init__(self, window: Standardized, max_lag: int, min_overlap: int) -> None:
        self.window = window
        self.max_lag = max_lag
        self.min_overlap = min_overlap
        self.data = pair_data(window)
        self.laggers = _lagger_sums(self.data, max_lag)
        self.workspaces: dict[int, _Workspace] = {}  # per thread
        self.lock = threading.Lock()

    def _workspace(self) -> _Workspace:
        key = threading.get_ident()
        with self.lock:
            if key not in self.workspaces:
                n_rows = self.window.n_rows
                self.workspaces[key] = _Workspace(
                    histogram=np.zeros(N_BINS, dtype=np.uint8),
                    spilled=[],
                    spills=np.empty(GEMM_TILE * PRODUCT_COLUMNS, dtype=np.int32),
                    shifted=np.empty((self.max_lag, GEMM_TILE, n_rows)),
                    columns=np.empty((n_rows, PRODUCT_COLUMNS)),
                    products=np.empty(self.max_lag * GEMM_TILE * PRODUCT_COLUMNS),
                )
            return self.workspaces[key]

    def run(
        self,
        start: int,
        stop: int,
        pool: Executor,
        bounds: tuple = (_NO_BOUNDS, _NO_BOUNDS, _NO_BOUNDS, 0, np.float32(0.0), 0.0),
        progress: Progress | None = None,
    ) -> None:
        """Count the pairs of the leaders ``[start, stop)`` (and fill ``bounds``, the arguments of
        :func:`count_tile`, when its arrays are not empty); ``progress(items_done, items)``."""
        window = self.window
        n_rows, n_cols = window.n_rows, window.n_cols
        arrays = (window.z, window.prefix, window.prefix_sq)

        def item_of(item: tuple[int, int, int]) -> None:
            first, col0, col1 = item
            last = min(first + GEMM_TILE, n_cols)
            height, width = last - first, col1 - col0
            space = self._workspace()
            shifted = space.shifted[:, :height]
            _shift_leaders(window.z_t, first, last, shifted)
            columns = space.columns[:, :width]
            np.copyto(columns, window.z[:, col0:col1])
            products = space.products[: self.max_lag * height * width].reshape(
                self.max_lag, height, width
            )
            np.matmul(shifted.reshape(-1, n_rows), columns, out=products.reshape(-1, width))
            n_spills = count_tile(
                products,
                (first, max(start, first), min(stop, last), col0),
                arrays,
                self.min_overlap,
                FALLBACK_TAU,
                self.data,
                self.laggers,
                (space.histogram, space.spills),
                bounds,
            )
            if n_spills:
                space.spilled.append(space.spills[:n_spills].copy())

        items = [
            (first, col0, min(col0 + PRODUCT_COLUMNS, n_cols))
            for first, _ in tiles_covering(start, stop)
            for col0 in range(0, n_cols, PRODUCT_COLUMNS)
        ]
        for done, _ in enumerate(pool.map(item_of, items), start=1):  # re-raises an error
            if progress is not None:
                progress(done, len(items))

    def bound_block(
        self,
        start: int,
        stop: int,
        corr: np.ndarray,
        min_improvement: float,
        pool: Executor,
        empty: Callable[[str, tuple[int, int], type], np.ndarray] = fresh_buffer,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Count the pairs of the leaders ``[start, stop)`` and bound their improvements (module
        docstring): the scan's ``(upper, lower, sync_block)``, each ``b × N`` float32, the last
        the block's rows of ``corr``, in arrays from ``empty(name, shape, dtype)`` (fresh ones
        by default, or a thread's reused buffers:
        :func:`~corr_pipeline.compute.workers.thread_buffer`)."""
        shape = (stop - start, self.window.n_cols)
        sync_block, upper, lower = (
            empty(f"lead-lag-{name}", shape, np.float32) for name in ("sync", "upper", "lower")
        )
        np.copyto(sync_block, corr[start:stop])
        margin = exactness_margin(self.window.n_rows)
        self.run(
            start,
            stop,
            pool,
            (upper, lower, sync_block, start, np.float32(min_improvement), margin),
        )
        return upper, lower, sync_block

    def counts(self) -> PValueCounts:
        """The histogram of every pair counted so far (the threads' buffers are dropped)."""
        spaces = list(self.workspaces.values())
        self.workspaces.clear()
        return _sparse([s.histogram for s in spaces], [a for s in spaces for a in s.spilled])


def count_p_values(
    window: Standardized,
    max_lag: int,
    min_overlap: int,
    pool: Executor,
    leaders: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> PValueCounts:
    """The histogram (module docstring) of the lag p-values of the best lags of the ordered
    pairs ``i != j`` with a best lag, for the leaders ``i`` in ``leaders`` (all by default) and
    every lagger ``j``, on ``pool``'s threads; ``progress(items_done, items)`` after each work
    item."""
    start, stop = (0, window.n_cols) if leaders is None else leaders
    exact = ExactPass(window, max_lag, min_overlap)
    exact.run(start, stop, pool, progress=progress)
    return exact.counts()


def _sparse(histograms: list[np.ndarray], spilled: list[np.ndarray]) -> PValueCounts:
    """The threads' byte histograms and spills (module docstring) summed, as
    :class:`PValueCounts`, a slice of 2²⁰ bins at a time (an 8 MB temporary)."""
    if not histograms:
        return PValueCounts.merge([])
    spill_bins, spills = np.unique(
        np.concatenate(spilled) if spilled else np.empty(0, np.int32), return_counts=True
    )
    bins, counts = [], []
    for lo in range(0, N_BINS, 1 << 20):
        hi = min(lo + (1 << 20), N_BINS)
        total = np.zeros(hi - lo, dtype=np.int64)
        for histogram in histograms:
            total += histogram[lo:hi]
        a, b = np.searchsorted(spill_bins, (lo, hi))
        total[spill_bins[a:b] - lo] += 256 * spills[a:b]  # distinct bins: no repeats to add
        found = np.flatnonzero(total)
        bins.append((found + lo).astype(np.int32))
        counts.append(total[found])
    return PValueCounts(np.concatenate(bins), np.concatenate(counts))


@njit(cache=True, nogil=True)
def _shift_leaders(z_t, first, last, out):  # pragma: no cover - compiled
    """``out[ℓ − 1, i − first, u] = Z[u − ℓ, i]`` in float64 (0 for ``u < ℓ``): one product with
    ``Z`` gives every lag's ``Σ_{t < T−ℓ} Z[t, i]·Z[t + ℓ, j]`` (the added terms are zeros)."""
    max_lag, _, n_rows = out.shape
    for lag in range(1, max_lag + 1):
        for i in range(first, last):
            row = out[lag - 1, i - first]
            row[:lag] = 0.0
            for u in range(lag, n_rows):
                row[u] = np.float64(z_t[i, u - lag])


@njit(cache=True, nogil=True)
def _lagger_sums(data, max_lag):  # pragma: no cover - compiled
    """Per lag ``ℓ`` and lagger ``j``, the overlap ``[a, b)`` of ``kernels.overlap_moments``
    with a leader present throughout (``a = max(lo_j − ℓ, 0)``, ``b = max(min(hi_j − ℓ,
    T − ℓ), a)``) and the lagger's interval sums over it (``sy``, ``base_y``), the same
    operations as ``overlap_moments``: ``(a, b, sy, base_y)``, each ``max_lag × N``."""
    prefix_t, prefix_sq_t, lo, hi = data[3], data[4], data[8], data[9]
    n_cols, n_rows = prefix_t.shape[0], prefix_t.shape[1] - 1
    a = np.empty((max_lag, n_cols), dtype=np.int64)
    b = np.empty((max_lag, n_cols), dtype=np.int64)
    sy = np.empty((max_lag, n_cols))
    base_y = np.empty((max_lag, n_cols))
    for lag in range(1, max_lag + 1):
        for j in range(n_cols):
            k_lo = min(max(lo[j] - lag, 0), n_rows - lag)
            k_hi = max(min(hi[j] - lag, n_rows - lag), k_lo)
            a[lag - 1, j] = k_lo
            b[lag - 1, j] = k_hi
            sy[lag - 1, j] = prefix_t[j, k_hi + lag] - prefix_t[j, k_lo + lag]
            base_y[lag - 1, j] = prefix_sq_t[j, k_hi + lag] - prefix_sq_t[j, k_lo + lag]
    return a, b, sy, base_y


@njit(cache=True, nogil=True)
def count_tile(
    products, tile, window, min_overlap, tau, data, laggers, counts, bounds
):  # pragma: no cover - compiled
    """Count the lag p-value of each pair's best lag (the largest float32 ``|r|``, ties to the
    smaller lag, as ``kernels.pair_values``) for leaders ``[row_lo, row_hi)`` and the laggers
    ``col0 ..`` of the products (``products[ℓ − 1]``: the pairs' ``Sxy``, rows from
    ``first``). Per leader and lag, the pairs' overlap ``K`` and sums are those of
    ``kernels.overlap_moments``, the same operations in the same order, vectorised over the
    laggers: the interval sums of both columns over ``K`` from the prefix sums (a lagger's from
    ``laggers``, :func:`_lagger_sums`, when ``K`` is its whole overlap with the window), less
    the leader's values where the lagger is missing (its gaps) and the lagger's values where
    the leader is missing (a zero, subtracted exactly, where the lagger is absent); ``r`` is
    then ``kernels.lagged_from_sums``' (its float64 fallback for an ill-conditioned variance
    included).

    ``tile`` = (first, row_lo, row_hi, col0); ``window`` = (z, prefix, prefix_sq), time-major;
    ``counts`` = (histogram, spills): the thread's byte histogram and room for the bins it
    spills (module docstring), one per pair at most; returns the number of spills written;
    ``bounds`` = (upper, lower, sync_block, block_start, min_improvement, margin): with
    non-empty arrays, the pairs' improvement bounds (module docstring) go to rows
    ``i − block_start`` of ``upper`` and ``lower``, ``sync_block`` holding those rows of
    ``corr``."""
    first, row_lo, row_hi, col0 = tile
    z, prefix, prefix_sq = window
    z_t, present_t = data[0], data[1]
    prefix_t, prefix_sq_t, prefix_count_t = data[3], data[4], data[5]
    gap_ptr, gap_rows, lo, hi = data[6], data[7], data[8], data[9]
    lag_a, lag_b, lag_sy, lag_base_y = laggers
    upper, lower, sync_block, block_start, min_improvement, margin = bounds
    histogram, spills = counts
    n_spills = 0
    bounding = upper.shape[0] > 0
    max_lag, _, width = products.shape
    n_rows = z.shape[0]
    k_lo = np.empty(width, dtype=np.int64)
    k_hi = np.empty(width, dtype=np.int64)
    count = np.empty(width, dtype=np.int64)
    sx = np.empty(width)
    sy = np.empty(width)
    sxx = np.empty(width)
    syy = np.empty(width)
    base_x = np.empty(width)
    base_y = np.empty(width)
    best_abs = np.empty(width, dtype=np.float32)
    best_r = np.empty(width)
    best_n = np.empty(width, dtype=np.int64)
    fallback = np.empty(width, dtype=np.bool_)
    partial = np.flatnonzero((lo[col0 : col0 + width] != 0) | (hi[col0 : col0 + width] != n_rows))
    lagger_gaps = np.empty((gap_ptr[col0 + width] - gap_ptr[col0], 2), dtype=np.int64)
    for c in range(width):  # (c, row) of each row where a lagger is missing inside its interval
        for k in range(gap_ptr[col0 + c], gap_ptr[col0 + c + 1]):
            lagger_gaps[k - gap_ptr[col0], 0] = c
            lagger_gaps[k - gap_ptr[col0], 1] = gap_rows[k]
    for i in range(row_lo, row_hi):
        r = i - first
        best_abs[:] = -1.0
        for lag in range(1, max_lag + 1):
            top = n_rows - lag
            # K for a lagger that spans the window, one interval [k0, k1) for the row ...
            k0 = min(max(lo[i], 0), top)
            k1 = max(min(hi[i], top), k0)
            x_sum = prefix_t[i, k1] - prefix_t[i, k0]
            x_sq = prefix_sq_t[i, k1] - prefix_sq_t[i, k0]
            x_count = prefix_count_t[i, k1] - prefix_count_t[i, k0]
            y_hi = prefix[k1 + lag, col0 : col0 + width]
            y_lo = prefix[k0 + lag, col0 : col0 + width]
            y_sq_hi = prefix_sq[k1 + lag, col0 : col0 + width]
            y_sq_lo = prefix_sq[k0 + lag, col0 : col0 + width]
            for c in range(width):
                k_lo[c] = k0
                k_hi[c] = k1
                sx[c] = x_sum
                base_x[c] = x_sq
                sxx[c] = x_sq
                count[c] = x_count
                sy[c] = y_hi[c] - y_lo[c]
                base_y[c] = y_sq_hi[c] - y_sq_lo[c]
                syy[c] = base_y[c]
            # ... and its own for a lagger listed late or gone early.
            for c in partial:
                j = col0 + c
                a = lag_a[lag - 1, j]
                b = lag_b[lag - 1, j]
                kl = max(k0, a)
                kh = max(min(k1, b), kl)
                k_lo[c] = kl
                k_hi[c] = kh
                sx[c] = prefix_t[i, kh] - prefix_t[i, kl]
                base_x[c] = prefix_sq_t[i, kh] - prefix_sq_t[i, kl]
                sxx[c] = base_x[c]
                count[c] = prefix_count_t[i, kh] - prefix_count_t[i, kl]
                if kl == a and kh == b:
                    sy[c] = lag_sy[lag - 1, j]
                    base_y[c] = lag_base_y[lag - 1, j]
                else:
                    sy[c] = prefix[kh + lag, j] - prefix[kl + lag, j]
                    base_y[c] = prefix_sq[kh + lag, j] - prefix_sq[kl + lag, j]
                syy[c] = base_y[c]
            # rows where a lagger is missing: inside its interval, so inside its K exactly
            # when inside [k0, k1)
            for e in range(lagger_gaps.shape[0]):
                c = lagger_gaps[e, 0]
                t = lagger_gaps[e, 1] - lag
                if k0 <= t < k1:
                    v = np.float64(z_t[i, t])
                    sx[c] -= v
                    sxx[c] -= v * v
                    count[c] -= present_t[i, t]
            for k in range(gap_ptr[i], gap_ptr[i + 1]):  # rows where the leader is missing
                t = gap_rows[k]
                if k0 <= t < k1:
                    row = z[t + lag]
                    for c in range(width):
                        v = np.float64(row[col0 + c])
                        sy[c] -= v
                        syy[c] -= v * v
            # Every pair's formula value at once (branch-free, so it vectorises), then the few
            # ill-conditioned ones from the float64 fallback.
            for c in range(width):
                n = count[c]
                inv_n = 1.0 / max(n, 1)
                var_x = sxx[c] - sx[c] * sx[c] * inv_n
                var_y = syy[c] - sy[c] * sy[c] * inv_n
                value = (products[lag - 1, r, c] - sx[c] * sy[c] * inv_n) / math.sqrt(
                    max(var_x * var_y, 1e-300)
                )
                value = min(1.0, max(-1.0, value))
                enough = n >= min_overlap
                conditioned = (var_x > tau * base_x[c]) & (var_y > tau * base_y[c])
                fallback[c] = enough & ~conditioned
                magnitude = abs(np.float32(value))
                better = enough & conditioned & (magnitude > best_abs[c])
                best_abs[c] = magnitude if better else best_abs[c]
                best_r[c] = value if better else best_r[c]
                best_n[c] = n if better else best_n[c]
            for c in range(width):
                if fallback[c]:
                    sums = (
                        k_lo[c],
                        k_hi[c],
                        sx[c],
                        sy[c],
                        sxx[c],
                        syy[c],
                        base_x[c],
                        base_y[c],
                        count[c],
                    )
                    j = col0 + c
                    sxy = products[lag - 1, r, c]
                    value = lagged_from_sums(i, j, lag, sxy, sums, min_overlap, tau, data)[0]
                    magnitude = abs(np.float32(value))
                    if magnitude > best_abs[c]:  # False for NaN
                        best_abs[c] = magnitude
                        best_r[c] = value
                        best_n[c] = count[c]
        if col0 <= i < col0 + width:
            best_abs[i - col0] = -1.0  # not a pair
        for c in range(width):
            if best_abs[c] >= 0.0:
                b = p_bin(best_r[c], best_n[c])
                held = histogram[b] + 1
                if held == 256:
                    spills[n_spills] = b
                    n_spills += 1
                    held = 0
                histogram[b] = held
        if bounding:
            row = i - block_start
            for c in range(width):
                sync = abs(sync_block[row, col0 + c])
                if math.isnan(sync):
                    sync = np.float32(0.0)
                magnitude = np.float64(best_abs[c])
                high = np.float32(min(magnitude * (1.0 + 2.0**-23) + margin, 1.0)) - sync
                low = np.float32(max(magnitude * (1.0 - 2.0**-23) - margin, 0.0)) - sync
                ok = best_abs[c] >= 0.0
                upper[row, col0 + c] = high if ok and high > min_improvement else -np.inf
                lower[row, col0 + c] = low if ok and low > min_improvement else -np.inf
    return n_spills
