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

from corr_pipeline.compute.transposes import transpose_columns
from corr_pipeline.compute.workers import available_cores


@dataclass(frozen=True)
class Transposed:
    """Column-major copies of a window's arrays, for kernels that walk one column's history
    (lead-lag): row ``j`` is column ``j`` of the time-major array."""

    present_t: np.ndarray  # N × T uint8
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
    prefix_count: np.ndarray  # (T + 1) × N int32, PM; (0, 0) in the layout "lead-lag"
    transposed: Transposed | None  # built in the layouts "lead-lag" and "both"

    @property
    def n_rows(self) -> int:
        return int(self.z.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.z.shape[1])

    def _transposed(self) -> Transposed:
        if self.transposed is None:
            raise ValueError(
                'this window was standardized without its transposed arrays (layout "correlation")'
            )
        return self.transposed

    @property
    def present_t(self) -> np.ndarray:
        return self._transposed().present_t

    @property
    def prefix_t(self) -> np.ndarray:
        return self._transposed().prefix_t

    @property
    def prefix_sq_t(self) -> np.ndarray:
        return self._transposed().prefix_sq_t

    @property
    def prefix_count_t(self) -> np.ndarray:
        return self._transposed().prefix_count_t


MAX_COLUMN_CHUNK = 1024
"""Widest chunk of columns one call of the numba pass takes: its per-column sums (4 x 8 bytes
a column) and a row's run of every array stay in the core's L2 cache, and a pool of two
threads still gets two chunks each at N = 4,000 (with one each, a thread that starts late
leaves both to the other: 4.6–9.3 ms against 4.8–6.2 ms)."""


def column_chunk_size(n_cols: int, workers: int) -> int:
    """Columns per chunk: as wide as :data:`MAX_COLUMN_CHUNK` allows, in a number of chunks that
    is a multiple of ``workers`` (equal shares for the pool's threads; with fewer than 64
    columns a worker, the rounding may leave fewer chunks), a multiple of 8 (whole 8 x 8
    transposes)."""
    chunks = workers * max(1, -(-n_cols // (workers * MAX_COLUMN_CHUNK)))
    per_chunk = -(-n_cols // chunks)
    return max(8, (per_chunk + 7) // 8 * 8)


#: The arrays each layout of :func:`standardize` builds, by the algorithm that reads them.
LAYOUTS = ("correlation", "lead-lag", "both")


def standardize(
    returns: np.ndarray,
    pool: Executor | None = None,
    column_chunk: int | None = None,
    *,
    layout: str = "both",
) -> Standardized:
    """Standardize ``returns`` and build the prefix sums, a chunk of columns at a time.

    Chunks write disjoint columns, so they run in ``pool`` when one is given (one thread per
    available core, as :func:`~corr_pipeline.compute.workers.worker_pool` makes it); their
    width is :func:`column_chunk_size` unless ``column_chunk`` is given (the values do not
    depend on it). ``layout`` says which arrays are kept (the values are the same in each):

    - ``"correlation"``: the time-major ones (``z``, ``z_t``, ``present``, ``prefix``,
      ``prefix_sq``, ``prefix_count``), no :class:`Transposed`;
    - ``"lead-lag"``: the time-major ones but ``prefix_count`` (a ``(0, 0)`` placeholder: each
      chunk counts in a scratch of its own), and the column-major copies;
    - ``"both"``: all of them (a stripe context serves both algorithms).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    n_rows, n_cols = returns.shape
    transposed = layout != "correlation"
    time_major_counts = layout != "lead-lag"
    if transposed:
        copies = Transposed(
            present_t=np.empty((n_cols, n_rows), dtype=np.uint8),
            prefix_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
            prefix_sq_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
            prefix_count_t=np.empty((n_cols, n_rows + 1), dtype=np.int32),
        )
    else:  # placeholders the kernel never writes
        copies = Transposed(
            present_t=np.empty((0, 0), dtype=np.uint8),
            prefix_t=np.empty((0, 0), dtype=np.float64),
            prefix_sq_t=np.empty((0, 0), dtype=np.float64),
            prefix_count_t=np.empty((0, 0), dtype=np.int32),
        )
    counts_shape = (n_rows + 1, n_cols) if time_major_counts else (0, 0)
    window = Standardized(
        raw=returns,
        z=np.empty((n_rows, n_cols), dtype=np.float32),
        z_t=np.empty((n_cols, n_rows), dtype=np.float32),
        present=np.empty((n_rows, n_cols), dtype=np.uint8),
        prefix=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_sq=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_count=np.empty(counts_shape, dtype=np.int32),
        transposed=copies if transposed else None,
    )

    if column_chunk is None:
        column_chunk = column_chunk_size(n_cols, available_cores() if pool is not None else 1)
    chunk = column_chunk

    # the records :func:`_standardize_columns` takes
    time_major = (
        window.z,
        window.z_t,
        window.present,
        window.prefix,
        window.prefix_sq,
        window.prefix_count,
    )
    column_major = (copies.present_t, copies.prefix_t, copies.prefix_sq_t, copies.prefix_count_t)
    keep = (transposed, time_major_counts)

    def fill(start: int) -> None:
        span = (start, min(start + chunk, n_cols))
        _standardize_columns(returns, span, time_major, column_major, keep)

    starts = range(0, n_cols, chunk)
    list(pool.map(fill, starts) if pool is not None else map(fill, starts))
    return window


@njit(cache=True, nogil=True)
def _standardize_columns(
    returns, span, time_major, column_major, keep
):  # pragma: no cover - compiled
    """Standardize the columns ``span = (first, last)`` of ``returns`` into the window's arrays.

    The records (the arrays of :class:`Standardized` and :class:`Transposed`):

    * ``time_major`` = (``z``, ``z_t``, ``present``, ``prefix``, ``prefix_sq``,
      ``prefix_count``);
    * ``column_major`` = (``present_t``, ``prefix_t``, ``prefix_sq_t``, ``prefix_count_t``),
      written when ``transposed``;
    * ``keep`` = (``transposed``, ``time_major_counts``): without ``time_major_counts`` the
      chunk's running counts go to a scratch of its own, transposed into ``prefix_count_t``.

    Per column, float64 two-pass moments over the finite values (sequential sums, row 0 first:
    :func:`_moments`, then :func:`_scales`), then ``Z = float32((R − mean) · (1 / std))`` (0
    where R is not finite) and the running sums of ``float64(Z)``, its square and the presence
    (:func:`_standardized_sums`). A column varies iff its largest finite value exceeds its
    smallest and ``std`` is finite and > 0; otherwise its ``Z`` is 0.

    The three passes sweep the chunk's rows in order, each row's columns side by side (the
    loops vectorise over columns, and every access is a unit-stride run of a row); each
    column's sums still add its rows one after the other from row 0, so the values are those of
    a column-at-a-time loop, bit for bit. ``z_t`` and the column-major copies are the chunk's
    block transposed afterwards by 8 × 8 register transposes (``kernels.transpose_columns``).
    """
    first, last = span
    z, z_t, present, prefix, prefix_sq, prefix_count = time_major
    transposed, time_major_counts = keep
    n_rows = returns.shape[0]
    moments = _moments(returns, first, last, present)
    mean, scale = _scales(returns, first, last, present, moments)
    if time_major_counts:
        counts = prefix_count
        counts_first = first
    else:
        counts = np.empty((n_rows + 1, last - first), dtype=np.int32)
        counts_first = 0
    _standardized_sums(
        returns, first, last, (z, present, prefix, prefix_sq), counts, counts_first, mean, scale
    )
    transpose_columns(z, first, z_t[first:last])
    if transposed:
        present_t, prefix_t, prefix_sq_t, prefix_count_t = column_major
        transpose_columns(present, first, present_t[first:last])
        transpose_columns(prefix, first, prefix_t[first:last])
        transpose_columns(prefix_sq, first, prefix_sq_t[first:last])
        transpose_columns(counts, counts_first, prefix_count_t[first:last])


@njit(inline="always")
def _moments(returns, first, last, present):  # pragma: no cover - compiled
    """First pass: each column's presence into ``present`` and its ``(count, total, highest,
    lowest)`` over the finite values, row 0 first."""
    m = last - first
    count = np.zeros(m, dtype=np.int64)
    total = np.zeros(m)
    highest = np.full(m, -np.inf)
    lowest = np.full(m, np.inf)
    for t in range(returns.shape[0]):
        row = returns[t, first:last]
        here = present[t, first:last]
        for c in range(m):
            value = np.float64(row[c])
            ok = math.isfinite(value)
            here[c] = ok
            count[c] += ok
            total[c] += value if ok else 0.0  # + 0.0 leaves a sum that is never -0.0 alone
            highest[c] = max(highest[c], value) if ok else highest[c]
            lowest[c] = min(lowest[c], value) if ok else lowest[c]
    return count, total, highest, lowest


@njit(inline="always")
def _scales(returns, first, last, present, moments):  # pragma: no cover - compiled
    """Second pass: each column's ``(mean, scale)``, ``scale`` = 1 / std (two-pass) when the
    column varies, else 0."""
    count, total, highest, lowest = moments
    m = last - first
    mean = np.empty(m)
    for c in range(m):
        mean[c] = total[c] / max(count[c], 1)
    squares = np.zeros(m)
    for t in range(returns.shape[0]):
        row = returns[t, first:last]
        here = present[t, first:last]
        for c in range(m):
            deviation = np.float64(row[c]) - mean[c]
            squares[c] += deviation * deviation if here[c] else 0.0
    scale = np.empty(m)
    for c in range(m):
        std = math.sqrt(squares[c] / max(count[c], 1))
        varies = highest[c] > lowest[c] and std > 0.0 and math.isfinite(std)
        scale[c] = 1.0 / std if varies else 0.0
    return mean, scale


@njit(inline="always")
def _standardized_sums(
    returns, first, last, outputs, counts, counts_first, mean, scale
):  # pragma: no cover - compiled
    """Third pass: ``Z`` and its running sums, ``outputs`` = (``z``, ``present``, ``prefix``,
    ``prefix_sq``); the running counts into ``counts`` from column ``counts_first``."""
    z, present, prefix, prefix_sq = outputs
    m = last - first
    running = np.zeros(m)
    running_sq = np.zeros(m)
    running_count = np.zeros(m, dtype=np.int32)
    prefix[0, first:last] = 0.0
    prefix_sq[0, first:last] = 0.0
    counts[0, counts_first : counts_first + m] = 0
    for t in range(returns.shape[0]):
        row = returns[t, first:last]
        here = present[t, first:last]
        z_row = z[t, first:last]
        prefix_row = prefix[t + 1, first:last]
        prefix_sq_row = prefix_sq[t + 1, first:last]
        prefix_count_row = counts[t + 1, counts_first : counts_first + m]
        for c in range(m):
            standardized = (
                np.float32((np.float64(row[c]) - mean[c]) * scale[c])
                if here[c]
                else np.float32(0.0)
            )
            z_row[c] = standardized
            value = np.float64(standardized)
            running[c] += value
            running_sq[c] += value * value
            running_count[c] += here[c]
            prefix_row[c] = running[c]
            prefix_sq_row[c] = running_sq[c]
            prefix_count_row[c] = running_count[c]


@dataclass(frozen=True)
class Side:
    """Rows ``[row0, row0 + n_rows)`` of a window: presence intervals and interior gaps.

    ``lo[j], hi[j]`` bound column j's finite rows in local coordinates (``lo == hi``
    when it has none); ``gap_rows[gap_ptr[j]:gap_ptr[j + 1]]`` are its local rows
    inside ``[lo, hi)`` that are not finite, ascending. ``total[j] = PZ[row0 + n_rows, j] −
    PZ[row0, j]`` and ``total_sq`` (the same with PZ2) are the column's sums over the side, the
    float64 difference rounded to float32 (the correlation's fused pass sums in float32).
    """

    row0: int
    n_rows: int
    lo: np.ndarray  # (N,) int64
    hi: np.ndarray  # (N,) int64
    gap_ptr: np.ndarray  # (N + 1,) int64
    gap_rows: np.ndarray  # int64
    total: np.ndarray  # (N,) float32
    total_sq: np.ndarray  # (N,) float32


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
        total=(window.prefix[row1] - window.prefix[row0]).astype(np.float32),
        total_sq=(window.prefix_sq[row1] - window.prefix_sq[row0]).astype(np.float32),
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
