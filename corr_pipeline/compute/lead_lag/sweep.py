"""The sweep over every ordered pair of lead-lag (SPEC §6): from float32 products, each pair's best
lag and robust statistic with a proved error bound, its p-value counted for the q-values, and
bounds of its improvement for the scan's selection.

**The products.** Work items of one tile of ``GEMM_TILE`` leaders × ``PRODUCT_COLUMNS``
laggers, in sub-chunks of :data:`SWEEP_COLUMNS`: the tile's leaders shifted by every lag
(``S[ℓ, i, u] = Z[u − ℓ, i]``, 0 for ``u < ℓ``; lag 0 too when the synchronous correlation is
not given) against the laggers give every lag's ``P = Σ_t Z[t, i]·Z[t + ℓ, j]`` (the added terms
are exact zeros) as the float64 sum of float32 products over row chunks of at most
:data:`K_CHUNK` rows (:attr:`Sweep.k_chunks` of them). The
grid of tiles, columns and row chunks is fixed, and each lag's ``P`` is a product call of its
own on one BLAS thread (BLAS rounds an element differently as the rows of its call or its
threads change: OpenBLAS 0.3.31 does), so every value is the same whatever the blocks, threads,
stripes or pool, with or without lag 0.

**Per pair** (:func:`sweep_tile`, vectorised over the laggers), for each lag: the overlap's
sums ``Sx, Sy, Sxx, Syy, n`` of ``kernels.overlap_moments`` (the same operations in the same
order, so bit for bit the exact evaluation's; a lagger listed late or gone early from the
per-lag table ``sweep_kernels.lagger_sums``), then ``r̂ = (P − Sx·Sy/n) / sqrt(var_x·var_y)``. At the
largest ``|r̂|`` the robust statistic ``t̂ = P / sqrt(Q)`` (``p_values``), with
``Q = Σ_t Z[t, i]²·Z[t + ℓ, j]²`` at that lag alone, from the pair's two rows of ``Z²``:
float32 partial sums of ``sweep_kernels.Q_TERMS`` terms added in float64 (a sum of positive
terms: its relative error does not grow with cancellation), where products of every lag would
cost as much as ``P``'s. The lag is chosen for a group of ``sweep_kernels.GROUP_ROWS`` leaders
first, then their ``Q`` are summed four laggers at a time, so that each load of a leader's row
serves four pairs and the laggers' rows are read once per group; every pair sums the window's
``T`` terms, its lagger's row padded with zeros past the window (exact zeros: the sum and the
bound are those of the ``T − ℓ`` terms).

**The bound.** With ``u = 2⁻²⁴`` and ``γ_k = k·u / (1 − k·u)``, a float32 dot product of ``k``
terms in any order (BLAS's included) lies within ``γ_k·Σ|a·b|`` of the exact sum; the chunks'
float64 sum adds ``γ'_c`` (``2⁻⁵³`` units), and the exact evaluation's own float64 sums
(``kernels.lagged_value``) differ from the exact ones by at most ``γ'_T``. By Cauchy–Schwarz
``Σ_K |Z_i·Z_j| <= sqrt(S_i·S_j)``, ``S_i`` the column's whole sum of squares, so

    |P̂ − P| <= A := G·sqrt(S_i·S_j),    G = γ_K + γ'_{c+2} + γ'_T     (K = the chunk's rows)

for the true sum and for the exact evaluation's. Each lag's correlation is then within
``δ = A / sqrt(var_x·var_y) + 2⁻⁴⁸`` of the exact evaluation's (the same sums, one float64
rounding of the formula), unless a variance takes the exact evaluation's float64 fallback
(``var <= tau·base``: decided on the same sums, so identically here), and the best lag is
*certain* when the largest ``|r̂|`` beats every other lag's ``|r̂| + δ`` by more than its own
``δ`` and two float32 roundings (``2⁻²³``): the exact evaluation's choice (SPEC §6, the largest
float32 ``|r|``) is then the same lag. For ``Q`` every term is positive: with the squares
rounded to float32, ``|Q̂ − Q| <= γ_Q·Q + η`` (``γ_Q = γ_{K_Q+2} + γ'_{c_Q+2}``: the
squares' and the product's roundings and the ``K_Q = Q_TERMS`` terms of a partial sum added
in any order, then its ``c_Q`` partial sums in float64; ``η = T·2⁻¹⁴⁸`` for products below
float32's normal range), so ``Q ∈ [Q_lo, Q_hi] = [(Q̂ − η)/(1 + γ_Q),
(Q̂ + η)/(1 − γ_Q)]`` and

    |t̂ − t| <= Δ := (A + |P̂|) / sqrt(Q_lo) − |P̂| / sqrt(Q_hi) + 2⁻⁴⁸·|t̂|.

Since ``|d ln p / d|t|| = λ(|t|) <= |t| + 1`` (``p_values``), ``|ln p(t̂) − ln p(t)| <= Δ·(|t̂| +
Δ + 1)``. A pair is **counted** in the bin of ``p(t̂)`` when its best lag is certain and
``Δ·(|t̂| + Δ + 1) <= ln(1 + EPSILON)``; every other pair with a finite lag (an uncertain best
lag, a fallback, ``Q_lo <= 0``, a bound too wide) is **deferred**: evaluated exactly
(``kernels.best_lag``) after the sweep and counted in the bin of its exact ``p``. So every
counted p-value is within a factor ``1 + EPSILON`` of the pair's own; ``significance`` shows
what that gives the q-values.

**Bounds** (when asked): the best magnitude lies between the largest ``|r̂| − δ`` and the
largest ``|r̂| + δ`` over the lags (1 when a lag takes the fallback), rounded outward to
float32; the synchronous correlation is ``corr``'s (exact) or lag 0's ``|r̂₀| ± δ₀`` (0 to 1 on
a fallback); ``upper`` and ``lower`` bound the float32 improvement ``best − |sync|`` (float32
subtraction is monotone), −∞ when at most ``min_improvement`` (no candidate / not surely one),
for ``i = j`` and without a finite lag. With a q-value condition (``bin_limit``), a pair whose
certain best lag has ``t_bin(|t̂| + Δ) > bin_limit`` is no candidate (``upper`` −∞), and only a
pair with ``t_bin(max(|t̂| − Δ, 0)) <= bin_limit`` keeps its ``lower``.

**Activity** (when asked): per leader, the smallest bin any of its pairs' p-value could be in
(``t_bin(|t̂| + Δ)``; a deferred pair's exact bin): once the q-value threshold is known, a
leader whose smallest bin is above it has no candidate, as leader or as lagger's leader.

A thread's histogram holds one byte a bin (8.6 MB, its pages as touched): a bin that reaches
256 is reset to 0 and recorded as one *spill* of 256 pairs, so the count of a bin is its byte
plus 256 times its spills, exact for any number of pairs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from corr_pipeline.compute.correlation.kernels import FALLBACK_TAU
from corr_pipeline.compute.lead_lag.kernels import pair_data
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.sweep_kernels import (
    Q_TERMS,
    exact_bins,
    lagger_sums,
    shift_leaders,
    sweep_tile,
)
from corr_pipeline.compute.standardize import Standardized
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, Progress, tiles_covering
from corr_pipeline.compute.workers import fresh_buffer, single_threaded_blas

EPSILON = 9e-4
"""A counted p-value is within a factor ``1 + EPSILON`` of the pair's own (module docstring)."""

K_CHUNK = 128
"""Rows per float32 product of ``P``: the window's rows are cut into ``ceil(T / K_CHUNK)``
near-equal chunks, each a product of its own, added in float64 (``γ_K`` of the bound is that of
a chunk)."""

SWEEP_COLUMNS = 512
"""Laggers per product call inside a work item (its products, ``(L + 1)·c·GEMM_TILE·512``
floats, and the laggers' rows of ``Z²`` stay near the core's cache)."""

_NOTHING = np.empty((0, 0), dtype=np.float32)
_NO_SYNC = np.zeros((1, 1), dtype=np.float32)
_NO_RECORD = np.empty((0, 0), dtype=np.int64)


def gamma32(terms: int) -> float:
    """``γ_k`` of float32 (``u = 2⁻²⁴``)."""
    unit = 2.0**-24
    return terms * unit / (1.0 - terms * unit)


def gamma64(terms: int) -> float:
    """``γ'_k`` of float64 (``u = 2⁻⁵³``)."""
    unit = 2.0**-53
    return terms * unit / (1.0 - terms * unit)


def row_chunks(n_rows: int, most: int) -> np.ndarray:
    """The boundaries of row chunks of at most ``most`` rows: ``ceil(T / most)`` near-equal
    parts."""
    parts = max(1, -(-n_rows // most))
    return np.linspace(0, n_rows, parts + 1).round().astype(np.int64)


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


@dataclass
class _Workspace:
    """One thread's counts and buffers for :class:`Sweep`."""

    histogram: np.ndarray  # uint8, N_BINS (module docstring); pages as touched
    spilled: list[np.ndarray] = field(default_factory=list)  # spilled bins, per item
    deferred: list[np.ndarray] = field(default_factory=list)  # (leader, lagger, lag), per item
    buffers: dict[str, np.ndarray] = field(default_factory=dict)

    def buffer(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        size = int(np.prod(shape))
        found = self.buffers.get(name)
        if found is None or found.size < size or found.dtype != np.dtype(dtype):
            found = np.empty(size, dtype)
            self.buffers[name] = found
        return found[:size].reshape(shape)


@dataclass
class Bounds:
    """Where a sweep writes a block's improvement bounds: ``upper``, ``lower`` (rows × N
    float32), ``sync`` (the block's rows of ``corr``, read; None without it: lag 0 is then
    among the products), and ``rows``: per leader, its row in them (−1: not in the block)."""

    upper: np.ndarray
    lower: np.ndarray
    sync: np.ndarray | None
    rows: np.ndarray
    min_improvement: float
    bin_limit: int = N_BINS


@dataclass(frozen=True)
class SweepInputs:
    """What every sweep of a window reads, built once (a stripe's process keeps it for the
    call's other stripes): the pairs' data and per-lag lagger tables, the squares of the window,
    each column's ``sqrt(S)``, the products' row chunks and the bound's constants."""

    window: Standardized
    max_lag: int
    min_overlap: int
    data: tuple
    laggers: tuple
    squares_t: np.ndarray  # N × (T + max_lag) float32, Z² rounded, zero after row T
    roots: np.ndarray  # N float64, sqrt(S) rounded up
    chunks: np.ndarray  # the row chunks' boundaries, for P
    params: tuple  # (G, γ_Q, η, ln(1 + EPSILON))


def sweep_inputs(window: Standardized, max_lag: int, min_overlap: int) -> SweepInputs:
    """The :class:`SweepInputs` of ``window`` (module docstring)."""
    data = pair_data(window)
    chunks = row_chunks(window.n_rows, K_CHUNK)
    longest = int(np.diff(chunks).max()) if window.n_rows else 0
    c = chunks.size - 1
    return SweepInputs(
        window=window,
        max_lag=max_lag,
        min_overlap=min_overlap,
        data=data,
        laggers=lagger_sums(data, max_lag),
        squares_t=_padded_squares(window.z_t, max_lag),
        roots=np.sqrt(window.prefix_sq[window.n_rows]) * (1.0 + 2.0**-40),
        chunks=chunks,
        params=(
            gamma32(longest) + gamma64(c + 2) + gamma64(window.n_rows + 2),  # G
            gamma32(Q_TERMS + 2) + gamma64(-(-window.n_rows // Q_TERMS) + 2),  # γ_Q
            window.n_rows * 2.0**-148,  # η
            math.log1p(EPSILON),
        ),
    )


class Sweep:
    """The sweep of the module docstring over a window, for one call (or one stripe): work
    items run on a pool's threads, each thread counting into its own histogram (kept across
    calls of :meth:`run`) with its own buffers; :meth:`counts` evaluates the deferred pairs,
    sums the histograms and drops them."""

    def __init__(self, inputs: SweepInputs) -> None:
        self.inputs = inputs
        self.window = inputs.window
        self.max_lag = inputs.max_lag
        self.min_overlap = inputs.min_overlap
        self.data = inputs.data
        self.workspaces: dict[int, _Workspace] = {}  # per thread
        self.lock = threading.Lock()
        self.activity = np.full(inputs.window.n_cols, N_BINS, dtype=np.int64)

    @property
    def k_chunks(self) -> int:
        """The row chunks each product is summed from."""
        return int(self.inputs.chunks.size - 1)

    def _workspace(self) -> _Workspace:
        key = threading.get_ident()
        with self.lock:
            if key not in self.workspaces:
                self.workspaces[key] = _Workspace(np.zeros(N_BINS, dtype=np.uint8))
            return self.workspaces[key]

    def run(
        self,
        leaders: np.ndarray,
        pool: Executor,
        *,
        count: bool = True,
        bounds: Bounds | None = None,
        activity: bool = False,
        progress: Progress | None = None,
        record: np.ndarray | None = None,
    ) -> None:
        """Sweep the pairs of ``leaders`` (ascending leader indices) with every lagger: count
        their p-values (``count``), write their improvement bounds (``bounds``; with lag 0 among
        the products when it has no ``corr`` rows), keep each leader's smallest possible bin
        (``activity``, :attr:`activity`); ``progress(items_done, items)`` after each work item.
        Leaders are taken in tiles of ``GEMM_TILE``: the aligned tiles of a contiguous range,
        else runs of the list. ``record`` (N × N int64, for checks at small N): each counted
        pair's bin, −1 for a deferred one."""
        recorded = _NO_RECORD if record is None else record
        first_lag = 0 if bounds is not None and bounds.sync is None else 1
        window = self.window
        n_cols = window.n_cols
        leaders = np.asarray(leaders, dtype=np.int64)
        tiles = _tiles_of(leaders, n_cols)
        outputs = (
            (_NOTHING, _NOTHING, _NOTHING, False, np.float32(0.0), N_BINS)
            if bounds is None
            else (
                bounds.upper,
                bounds.lower,
                _NO_SYNC if bounds.sync is None else bounds.sync,
                bounds.sync is not None,
                np.float32(bounds.min_improvement),
                int(bounds.bin_limit),
            )
        )
        out_rows = np.full(n_cols, -1, np.int64) if bounds is None else bounds.rows
        wanted = np.zeros(n_cols, dtype=np.bool_)
        wanted[leaders] = True

        def item_of(item: tuple[np.ndarray, int, int]) -> None:
            tile, col0, col1 = item
            space = self._workspace()
            n_lags = self.max_lag + 1 - first_lag
            shape = (n_lags, tile.size, window.n_rows)
            shifted = space.buffer("shifted", shape, np.float32)
            shift_leaders(window.z_t, tile, first_lag, shifted)
            rows = out_rows[tile] if bounds is not None else np.where(wanted[tile], 0, -1)
            for sub0 in range(col0, col1, SWEEP_COLUMNS):
                sub1 = min(sub0 + SWEEP_COLUMNS, col1)
                self._sweep_columns(
                    space,
                    (tile, rows, sub0, first_lag),
                    shifted,
                    sub1,
                    (count, activity, recorded),
                    outputs,
                )

        items = [
            (tile, col0, min(col0 + PRODUCT_COLUMNS, n_cols))
            for tile in tiles
            for col0 in range(0, n_cols, PRODUCT_COLUMNS)
        ]
        with single_threaded_blas():  # the same products on any pool (workers module)
            for done, _ in enumerate(pool.map(item_of, items), start=1):  # re-raises an error
                if progress is not None:
                    progress(done, len(items))

    def _sweep_columns(self, space, where, shifted, col1, flags, outputs) -> None:
        """The products and :func:`sweep_tile` of one tile and laggers ``[col0, col1)``
        (``where`` = (tile, rows, col0, first_lag), ``flags`` = (count, activity, record))."""
        tile, rows, col0, first_lag = where
        count, activity, record = flags
        window = self.window
        width = col1 - col0
        n_lags, height = shifted.shape[0], shifted.shape[1]
        c = self.k_chunks
        products = space.buffer("products", (c, n_lags, height, width), np.float32)
        for k in range(c):
            u0, u1 = int(self.inputs.chunks[k]), int(self.inputs.chunks[k + 1])
            laggers = window.z[u0:u1, col0:col1]
            for lag in range(n_lags):  # one call per lag: the same shape with or without lag 0
                np.matmul(shifted[lag, :, u0:u1], laggers, out=products[k, lag])
        spills = space.buffer("spills", (height * width,), np.int32)
        deferred = space.buffer("deferred", (height * width, 3), np.int64)
        low_bins = space.buffer("low_bins", (height,), np.int64)
        low_bins[:] = N_BINS
        n_spills, n_deferred = sweep_tile(
            products,
            self.inputs.squares_t,
            (tile, rows, col0, first_lag, self.min_overlap, FALLBACK_TAU),
            (window.z, window.prefix, window.prefix_sq, self.inputs.roots),
            self.data,
            self.inputs.laggers,
            self.inputs.params,
            (count, space.histogram, spills, deferred, activity, low_bins, record),
            outputs,
        )
        if n_spills:
            space.spilled.append(spills[:n_spills].copy())
        if n_deferred:
            space.deferred.append(deferred[:n_deferred].copy())
        if activity:
            with self.lock:
                np.minimum.at(self.activity, tile, low_bins)

    def counts(self, pool: Executor) -> PValueCounts:
        """The histogram of every pair swept so far with ``count``, its deferred pairs
        evaluated exactly on ``pool`` (and their exact bins taken into :attr:`activity`);
        the threads' buffers are dropped."""
        spaces = list(self.workspaces.values())
        self.workspaces.clear()
        deferred = [a for s in spaces for a in s.deferred]
        pairs = np.concatenate(deferred) if deferred else np.empty((0, 3), np.int64)
        bins = self.exact_bins(pairs, pool)
        found = bins >= 0
        np.minimum.at(self.activity, pairs[found, 0], bins[found])
        exact = [bins[found].astype(np.int32)]
        return _sparse([s.histogram for s in spaces], [a for s in spaces for a in s.spilled], exact)

    def exact_bins(self, pairs: np.ndarray, pool: Executor) -> np.ndarray:
        """The exact bin of each pair's p-value at its best lag (−1 without one), on ``pool``:
        ``pairs`` rows ``(leader, lagger, lag)``, the lag when known to be the best, else 0."""
        out = np.full(pairs.shape[0], -1, dtype=np.int64)
        step = 4096

        def evaluate(lo: int) -> None:
            hi = min(lo + step, pairs.shape[0])
            out[lo:hi] = exact_bins(
                pairs[lo:hi], self.max_lag, self.min_overlap, FALLBACK_TAU, self.data
            )

        list(pool.map(evaluate, range(0, pairs.shape[0], step)))
        return out


def block_bounds(
    sweep: Sweep,
    leaders: np.ndarray,
    corr: np.ndarray | None,
    min_improvement: float,
    bin_limit: int,
    pool: Executor,
    *,
    count: bool,
    empty: Callable[[str, tuple[int, int], type], np.ndarray] = fresh_buffer,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sweep the block of ``leaders`` and return the scan's ``(upper, lower, sync_block)``, each
    ``b × N`` float32 (``sync_block``: the block's rows of ``corr``, a 1 × 1 dummy without it),
    in arrays from ``empty(name, shape, dtype)``; ``count``: also count their p-values."""
    n_cols = sweep.window.n_cols
    shape = (leaders.size, n_cols)
    upper = empty("lead-lag-upper", shape, np.float32)
    lower = empty("lead-lag-lower", shape, np.float32)
    sync = None
    if corr is not None:
        sync = empty("lead-lag-sync", shape, np.float32)
        start = int(leaders[0]) if leaders.size else 0
        if leaders.size and int(leaders[-1]) + 1 - start == leaders.size:
            np.copyto(sync, corr[start : start + leaders.size])
        else:
            for k, i in enumerate(leaders):
                sync[k] = corr[i]
    rows = np.full(n_cols, -1, dtype=np.int64)
    rows[leaders] = np.arange(leaders.size)
    sweep.run(
        leaders,
        pool,
        count=count,
        bounds=Bounds(upper, lower, sync, rows, min_improvement, bin_limit),
    )
    return upper, lower, _NO_SYNC if sync is None else sync


def _padded_squares(z_t: np.ndarray, max_lag: int) -> np.ndarray:
    """``Z²`` rounded to float32, one row per column, followed by ``max_lag`` zeros: the terms of
    ``Q`` past the window's end are exact zeros (``sweep_kernels._squares_at_best_lags``)."""
    out = np.zeros((z_t.shape[0], z_t.shape[1] + max_lag), dtype=np.float32)
    np.square(z_t, out=out[:, : z_t.shape[1]])
    return out


def _tiles_of(leaders: np.ndarray, n_cols: int) -> list[np.ndarray]:
    """The leaders in tiles: for a contiguous range, the aligned tiles ``[k·GEMM_TILE,
    (k+1)·GEMM_TILE)`` that meet it, whole (the products' fixed grid; the rows outside the
    range are not swept); else runs of ``GEMM_TILE`` of the list."""
    if leaders.size == 0:
        return []
    start, stop = int(leaders[0]), int(leaders[-1]) + 1
    if stop - start == leaders.size:
        return [
            np.arange(a, min(b, n_cols), dtype=np.int64) for a, b in tiles_covering(start, stop)
        ]
    return [leaders[k : k + GEMM_TILE] for k in range(0, leaders.size, GEMM_TILE)]


def _sparse(
    histograms: list[np.ndarray], spilled: list[np.ndarray], exact: list[np.ndarray]
) -> PValueCounts:
    """The threads' byte histograms and spills (module docstring) and the deferred pairs'
    exact bins summed, as :class:`PValueCounts`, a slice of 2²⁰ bins at a time (an 8 MB
    temporary)."""
    spill_bins, spills = np.unique(
        np.concatenate(spilled) if spilled else np.empty(0, np.int32), return_counts=True
    )
    exact_bins, exact_counts = np.unique(
        np.concatenate(exact) if exact else np.empty(0, np.int32), return_counts=True
    )
    bins, counts = [], []
    for lo in range(0, N_BINS, 1 << 20):
        hi = min(lo + (1 << 20), N_BINS)
        total = np.zeros(hi - lo, dtype=np.int64)
        for histogram in histograms:
            total += histogram[lo:hi]
        a, b = np.searchsorted(spill_bins, (lo, hi))
        total[spill_bins[a:b] - lo] += 256 * spills[a:b]  # distinct bins: no repeats to add
        a, b = np.searchsorted(exact_bins, (lo, hi))
        total[exact_bins[a:b] - lo] += exact_counts[a:b]
        found = np.flatnonzero(total)
        bins.append((found + lo).astype(np.int32))
        counts.append(total[found])
    return PValueCounts(np.concatenate(bins), np.concatenate(counts))
