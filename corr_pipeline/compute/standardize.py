"""Standardized, zero-filled returns, their prefix sums and gap structure: the kernels' input.

For a T × N float32 returns matrix ``R`` with NaN gaps, column ``j`` is
standardized over its own finite rows (float64 two-pass, then float32):

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

from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Standardized:
    """The whole window, standardized once (see module docstring)."""

    z: np.ndarray  # T × N float32
    z_t: np.ndarray  # N × T float32 (Z transposed, C order)
    present_t: np.ndarray  # N × T uint8, 1 where R is finite
    raw_t: np.ndarray  # N × T float32, R transposed (for the exact fallback)
    prefix: np.ndarray  # (T + 1) × N float64, PZ
    prefix_sq: np.ndarray  # (T + 1) × N float64, PZ2
    prefix_t: np.ndarray  # N × (T + 1) float64, PZ transposed
    prefix_sq_t: np.ndarray  # N × (T + 1) float64, PZ2 transposed
    prefix_count_t: np.ndarray  # N × (T + 1) int32, PM transposed

    @property
    def n_rows(self) -> int:
        return int(self.z.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.z.shape[1])


def standardize(
    returns: np.ndarray, pool: Executor | None = None, column_chunk: int = 512
) -> Standardized:
    """Standardize ``returns`` and build the prefix sums, a chunk of columns at a time.

    Chunks write disjoint columns, so they run in ``pool`` when one is given.
    """
    n_rows, n_cols = returns.shape
    window = Standardized(
        z=np.empty((n_rows, n_cols), dtype=np.float32),
        z_t=np.empty((n_cols, n_rows), dtype=np.float32),
        present_t=np.empty((n_cols, n_rows), dtype=np.uint8),
        raw_t=np.empty((n_cols, n_rows), dtype=np.float32),
        prefix=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_sq=np.empty((n_rows + 1, n_cols), dtype=np.float64),
        prefix_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
        prefix_sq_t=np.empty((n_cols, n_rows + 1), dtype=np.float64),
        prefix_count_t=np.empty((n_cols, n_rows + 1), dtype=np.int32),
    )
    chunks = [
        slice(start, min(start + column_chunk, n_cols)) for start in range(0, n_cols, column_chunk)
    ]

    def fill(cols: slice) -> None:
        _standardize_columns(returns, window, cols)

    list(pool.map(fill, chunks) if pool is not None else map(fill, chunks))
    return window


def _standardize_columns(returns: np.ndarray, window: Standardized, cols: slice) -> None:
    """Fill every array of ``window`` for the columns ``cols``."""
    chunk = returns[:, cols].astype(np.float64)
    mask = np.isfinite(chunk)
    count = mask.sum(axis=0)
    mean = np.where(mask, chunk, 0.0).sum(axis=0) / np.maximum(count, 1)
    deviation = np.where(mask, chunk - mean, 0.0)
    std = np.sqrt((deviation**2).sum(axis=0) / np.maximum(count, 1))
    highest = np.where(mask, chunk, -np.inf).max(axis=0, initial=-np.inf)
    lowest = np.where(mask, chunk, np.inf).min(axis=0, initial=np.inf)
    varies = (highest > lowest) & (std > 0) & np.isfinite(std)
    scale = np.where(varies, 1.0 / np.where(varies, std, 1.0), 0.0)
    z = (deviation * scale).astype(np.float32)
    z64 = z.astype(np.float64)
    for prefix, prefix_t, values in (
        (window.prefix, window.prefix_t, z64),
        (window.prefix_sq, window.prefix_sq_t, z64 * z64),
    ):
        prefix[0, cols] = 0.0
        np.cumsum(values, axis=0, out=prefix[1:, cols])
        prefix_t[cols] = prefix[:, cols].T
    window.z[:, cols] = z
    window.z_t[cols] = z.T
    window.present_t[cols] = mask.T
    window.raw_t[cols] = returns[:, cols].T
    window.prefix_count_t[cols, 0] = 0
    np.cumsum(mask.T, axis=1, out=window.prefix_count_t[cols, 1:])


@dataclass(frozen=True)
class Side:
    """Rows ``[row0, row0 + n_rows)`` of a window: presence intervals and interior gaps.

    ``lo[j], hi[j]`` bound column j's finite rows in local coordinates (``lo == hi``
    when it has none); ``gap_rows[gap_ptr[j]:gap_ptr[j + 1]]`` are its local rows
    inside ``[lo, hi)`` that are not finite, ascending, and ``gap_cols`` holds the
    column of each of those entries. ``partial_cols`` lists, ascending, the columns
    whose interval is not the whole side (``[0, n_rows)``); ``partial_ptr[j]`` counts
    those below ``j``.
    """

    row0: int
    n_rows: int
    lo: np.ndarray  # (N,) int64
    hi: np.ndarray  # (N,) int64
    gap_ptr: np.ndarray  # (N + 1,) int64
    gap_rows: np.ndarray  # int64
    gap_cols: np.ndarray  # int64, same length as gap_rows
    partial_ptr: np.ndarray  # (N + 1,) int64
    partial_cols: np.ndarray  # int64


def make_side(window: Standardized, row0: int, row1: int) -> Side:
    """The side for rows ``[row0, row1)``: O(N + gaps) work, no copy of the data."""
    present = window.present_t[:, row0:row1].astype(bool)
    n_rows = row1 - row0
    has_any = present.any(axis=1)
    lo = np.where(has_any, present.argmax(axis=1), 0)
    hi = np.where(has_any, n_rows - present[:, ::-1].argmax(axis=1), 0)
    local = np.arange(n_rows)
    interior_gap = ~present & (local >= lo[:, None]) & (local < hi[:, None])
    gap_cols, gap_rows = np.nonzero(interior_gap)  # row-major: by column, rows ascending
    partial = (lo != 0) | (hi != n_rows)
    return Side(
        row0=row0,
        n_rows=n_rows,
        lo=lo.astype(np.int64),
        hi=hi.astype(np.int64),
        gap_ptr=_counts_below(interior_gap.sum(axis=1)),
        gap_rows=gap_rows.astype(np.int64),
        gap_cols=gap_cols.astype(np.int64),
        partial_ptr=_counts_below(partial),
        partial_cols=np.flatnonzero(partial).astype(np.int64),
    )


def _counts_below(counts: np.ndarray) -> np.ndarray:
    """``ptr[j] = Σ_{c < j} counts[c]`` for ``j = 0 .. N`` (CSR row pointers), int64."""
    ptr = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr
