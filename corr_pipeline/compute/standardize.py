"""Standardized, zero-filled returns, their prefix sums and gap structure: the kernels' input.

For a T × N float32 returns matrix ``R`` with NaN gaps, column ``j`` is
standardized over its own finite rows (float64 two-pass, then float32; a numba pass per
column, chunks of columns on the worker threads):

    Z[t, j] = (R[t, j] − mean_j) / std_j    where R[t, j] is finite
            = 0                              elsewhere (and everywhere for a constant column)

Pearson correlation is invariant under a positive affine map of each column,
so correlating ``Z`` equals correlating ``R`` on every overlap, while all
values are O(1): no overflow of squares at 1e15, no underflow at 1e-15, and
float32 products keep their digits (columns are centred before any sum).

Prefix sums over time (float64, from the float32 values) give any
contiguous range's sums in O(1):

    PZ[t, j]  = Σ_{u < t} Z[u, j]        PZ2[t, j] = Σ_{u < t} Z[u, j]²
    PM[t, j]  = #{u < t : R[u, j] finite}

A :class:`Side` is a contiguous row range ``[row0, row0 + T')`` of the window
seen as one operand of a correlation: ``[0, T)`` for the synchronous matrix;
``[0, T − ℓ)`` (leaders) and ``[ℓ, T)`` (laggers) for lag ℓ. Within a side each
column's presence is an *interval* ``[lo_j, hi_j)`` (first to last finite row:
listings and delistings cost nothing) plus a CSR list of *interior gaps*
(halts, bad prints) inside it.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class Transposed:
    """Column-major copies of a window's arrays, for kernels that walk one column's history
    (lead-lag): row ``j`` is column ``j`` of the time-major array."""

    present_t: np.ndarray  # N × T uint8
    raw_t: np.ndarray  # N × T float32, R transposed (for the exact fallback)
    prefix_t: np.ndarray  # N × (T + 1) float64, PZ transposed
    prefix_sq_t: np.ndarray  # N × (T + 1) float64, PZ2 transposed
    prefix_count_t: np.ndarray  # N × (T + 1) int32, PM transposed


@dataclass(frozen=True)
class Standardized:
    """The whole window, standardized once (see module docstring)."""

    raw: np.ndarray  # T × N float32, the returns as given (not copied)
    z: np.ndarray  # T × N float32
    z_t: np.ndarray  # N × T float32 (Z transposed, C order)
    present: np.ndarray  # T × N uint8, 1 where R is finite
    prefix: np.ndarray  # (T + 1) × N float64, PZ
    prefix_sq: np.ndarray  # (T + 1) × N float64, PZ2
    prefix_count: np.ndarray  # (T + 1) × N int32, PM
    transposed: Transposed | None  # built when asked for (``standardize(transposed=True)``)

    @property
    def n_rows(self) -> int:
        return int(self.z.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.z.shape[1])

    def _transposed(self) -> Transposed:
        if self.transposed is None:
            raise ValueError("this window was standardized without its transposed arrays")
        return self.transposed

    @property
    def present_t(self) -> np.ndarray:
        return self._transposed().present_t

    @property
    def raw_t(self) -> np.ndarray:
        return self._transposed().raw_t

    @property
    def prefix_t(self) -> np.ndarray:
        return self._transposed().prefix_t

    @property
    def prefix_sq_t(self) -> np.ndarray:
        return self._transposed().prefix_sq_t

    @property
    def prefix_count_t(self) -> np.ndarray:
        return self._transposed().prefix_count_t


def standardize(
    returns: np.ndarray,
    pool: Executor | None = None,
    column_chunk: int = 512,
    *,
    transposed: bool = True,
) -> Standardized:
    """Standardize ``returns`` and build the prefix sums, a chunk of columns at a time.

    Chunks write disjoint columns, so they run in ``pool`` when one is given. With
    ``transposed=False`` the column-major copies (:class:`Transposed`, 45 % of the memory,
    needed by lead-lag only) are not built.
    """
    n_rows, n_cols = returns.shape
    if transposed:
        copies = Transposed(
            present_t=np.empty((n_cols, n_rows), dtype=np.uint8),
            raw_t=np.empty((n_cols, n_rows), dtype=np.float32),
            prefix_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
            prefix_sq_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
            prefix_count_t=np.empty((n_cols, n_rows + 1), dtype=np.int32),
        )
    else:  # placeholders the kernel never writes
        copies = Transposed(
            present_t=np.empty((0, 0), dtype=np.uint8),
            raw_t=np.empty((0, 0), dtype=np.float32),
            prefix_t=np.empty((0, 0), dtype=np.float64),
            prefix_sq_t=np.empty((0, 0), dtype=np.float64),
            prefix_count_t=np.empty((0, 0), dtype=np.int32),
        )
    window = Standardized(
        raw=returns,
        z=np.empty((n_rows, n_cols), dtype=np.float32),
        z_t=np.empty((n_cols, n_rows), dtype=np.float32),
        present=np.empty((n_rows, n_cols), dtype=np.uint8),
        prefix=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_sq=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_count=np.empty((n_rows + 1, n_cols), dtype=np.int32),
        transposed=copies if transposed else None,
    )

    def fill(start: int) -> None:
        _standardize_columns(
            returns,
            start,
            min(start + column_chunk, n_cols),
            window.z,
            window.z_t,
            window.present,
            window.prefix,
            window.prefix_sq,
            window.prefix_count,
            transposed,
            copies.present_t,
            copies.raw_t,
            copies.prefix_t,
            copies.prefix_sq_t,
            copies.prefix_count_t,
        )

    starts = range(0, n_cols, column_chunk)
    list(pool.map(fill, starts) if pool is not None else map(fill, starts))
    return window


@njit(cache=True, nogil=True)
def _standardize_columns(
    returns,
    first,
    last,
    z,
    z_t,
    present,
    prefix,
    prefix_sq,
    prefix_count,
    transposed,
    present_t,
    raw_t,
    prefix_t,
    prefix_sq_t,
    prefix_count_t,
):  # pragma: no cover - compiled
    """Standardize columns ``[first, last)`` of ``returns`` into ``z``, ``z_t`` and the prefix
    sums (and, if ``transposed``, the column-major copies), one column at a time.

    Float64 two-pass moments over the finite values (sequential sums), then
    ``Z = float32((R − mean) · (1 / std))`` (0 where R is not finite) and the running sums of
    ``float64(Z)``, its square and the presence. A column varies iff its largest finite value
    exceeds its smallest and ``std`` is finite and > 0; otherwise its ``Z`` is 0. A column's
    values are read once (strided; the neighbouring columns of the chunk share its cache
    lines) into a float64 buffer.
    """
    n_rows = returns.shape[0]
    values = np.empty(n_rows)
    finite = np.empty(n_rows, dtype=np.bool_)
    for j in range(first, last):
        count = 0
        total = 0.0
        highest = -np.inf
        lowest = np.inf
        for t in range(n_rows):
            value = np.float64(returns[t, j])
            ok = math.isfinite(value)
            values[t] = value
            finite[t] = ok
            present[t, j] = ok
            if ok:
                count += 1
                total += value
                highest = max(highest, value)
                lowest = min(lowest, value)
        mean = total / max(count, 1)
        squares = 0.0
        for t in range(n_rows):
            if finite[t]:
                deviation = values[t] - mean
                squares += deviation * deviation
        std = math.sqrt(squares / max(count, 1))
        varies = highest > lowest and std > 0.0 and math.isfinite(std)
        scale = 1.0 / std if varies else 0.0
        running = 0.0
        running_sq = 0.0
        running_count = 0
        prefix[0, j] = 0.0
        prefix_sq[0, j] = 0.0
        prefix_count[0, j] = 0
        for t in range(n_rows):
            standardized = np.float32(0.0)
            if finite[t]:
                standardized = np.float32((values[t] - mean) * scale)
                running_count += 1
            z[t, j] = standardized
            z_t[j, t] = standardized
            value = np.float64(standardized)
            running += value
            running_sq += value * value
            prefix[t + 1, j] = running
            prefix_sq[t + 1, j] = running_sq
            prefix_count[t + 1, j] = running_count
        if transposed:
            for t in range(n_rows):
                present_t[j, t] = finite[t]
                raw_t[j, t] = returns[t, j]
            for t in range(n_rows + 1):
                prefix_t[j, t] = prefix[t, j]
                prefix_sq_t[j, t] = prefix_sq[t, j]
                prefix_count_t[j, t] = prefix_count[t, j]


@dataclass(frozen=True)
class Side:
    """Rows ``[row0, row0 + n_rows)`` of a window: presence intervals and interior gaps.

    ``lo[j], hi[j]`` bound column j's finite rows in local coordinates (``lo == hi``
    when it has none); ``gap_rows[gap_ptr[j]:gap_ptr[j + 1]]`` are its local rows
    inside ``[lo, hi)`` that are not finite, ascending. ``total[j] = PZ[row0 + n_rows, j] − PZ[row0, j]`` and ``total_sq``
    (the same with PZ2) are the column's sums over the side.
    """

    row0: int
    n_rows: int
    lo: np.ndarray  # (N,) int64
    hi: np.ndarray  # (N,) int64
    gap_ptr: np.ndarray  # (N + 1,) int64
    gap_rows: np.ndarray  # int64
    total: np.ndarray  # (N,) float64
    total_sq: np.ndarray  # (N,) float64


def make_side(window: Standardized, row0: int, row1: int) -> Side:
    """The side for rows ``[row0, row1)``: O(N + gaps) work, no copy of the data."""
    lo, hi, gap_ptr, gap_rows = _intervals_and_gaps(window.present, row0, row1)
    return Side(
        row0=row0,
        n_rows=row1 - row0,
        lo=lo,
        hi=hi,
        gap_ptr=gap_ptr,
        gap_rows=gap_rows,
        total=window.prefix[row1] - window.prefix[row0],
        total_sq=window.prefix_sq[row1] - window.prefix_sq[row0],
    )


@njit(cache=True, nogil=True)
def _intervals_and_gaps(present, row0, row1):  # pragma: no cover - compiled
    """``(lo, hi, gap_ptr, gap_rows)`` of :class:`Side` for rows ``[row0, row1)`` of the
    time-major presence, in two row-by-row sweeps (vectorised over the columns):
    ``lo[j]`` = first local row present, ``hi[j]`` = last + 1 (both 0 when none), then the
    local rows of ``[lo, hi)`` not present, ascending per column, in CSR form."""
    n_cols = present.shape[1]
    n_rows = row1 - row0
    lo = np.zeros(n_cols, dtype=np.int64)
    hi = np.zeros(n_cols, dtype=np.int64)
    count = np.zeros(n_cols, dtype=np.int64)
    for t in range(n_rows):
        row = present[row0 + t]
        for j in range(n_cols):
            here = row[j] != 0
            lo[j] = t if here and count[j] == 0 else lo[j]
            hi[j] = t + 1 if here else hi[j]
            count[j] += here
    gap_ptr = np.zeros(n_cols + 1, dtype=np.int64)
    for j in range(n_cols):
        gap_ptr[j + 1] = gap_ptr[j] + (hi[j] - lo[j] - count[j])
    gap_rows = np.empty(gap_ptr[n_cols], dtype=np.int64)
    cursor = gap_ptr[:n_cols].copy()
    for t in range(n_rows):
        row = present[row0 + t]
        for j in range(n_cols):
            if row[j] == 0 and lo[j] <= t < hi[j]:
                gap_rows[cursor[j]] = t
                cursor[j] += 1
    return lo, hi, gap_ptr, gap_rows
