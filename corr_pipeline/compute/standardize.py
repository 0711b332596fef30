"""Standardized, zero-filled returns and their gap structure: the kernels' input.

For a T × N float32 returns matrix ``R`` with NaN gaps, column ``j`` is
standardized over its own finite rows (float64 two-pass, then float32):

    Z[t, j] = (R[t, j] − mean_j) / std_j    where R[t, j] is finite
            = 0                              elsewhere (and everywhere for a constant column)

Pearson correlation is invariant under a positive affine map of each column,
so correlating ``Z`` equals correlating ``R`` on every overlap, while all
values are O(1): no overflow of squares at 1e15, no underflow at 1e-15, and
float32 sums keep their digits (the columns are centred before any sum).

A :class:`Side` is a contiguous row range of the window seen as one operand of
a correlation: ``rows [0, T)`` for the synchronous matrix; ``[0, T − ℓ)``
(leaders) and ``[ℓ, T)`` (laggers) for lag ℓ. Per side it keeps the column
sums ``s_j = Σ_t Z[t, j]``, ``q_j = Σ_t Z[t, j]²``, counts ``n_j``, and the gaps:

* *dense-gap* columns (more than ``T' / DENSE_GAP_DIVISOR`` gaps: listings,
  delistings) are corrected with matrix products against their 0/1
  presence mask;
* the other columns' few gaps (halts, bad prints) are kept as a CSR list of
  gap rows and corrected by subtraction inside the fused kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DENSE_GAP_DIVISOR = 16
"""A column with more than T'/16 gaps is handled by dense products (a cost choice only)."""


@dataclass(frozen=True)
class Standardized:
    """The whole window, standardized once (see module docstring)."""

    z: np.ndarray  # T × N float32, C order
    z_sq: np.ndarray  # T × N float32, Z²
    z_t: np.ndarray  # N × T float32, C order (Z transposed)
    present_t: np.ndarray  # N × T uint8, 1 where R is finite
    raw_t: np.ndarray  # N × T float32, R transposed (for the exact fallback)

    @property
    def n_rows(self) -> int:
        return int(self.z.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.z.shape[1])


def standardize(returns: np.ndarray, column_chunk: int = 4096) -> Standardized:
    """Standardize ``returns`` column by column (chunks keep float64 temporaries small)."""
    n_rows, n_cols = returns.shape
    z = np.zeros((n_rows, n_cols), dtype=np.float32)
    present = np.isfinite(returns)
    for start in range(0, n_cols, column_chunk):
        stop = min(start + column_chunk, n_cols)
        chunk = returns[:, start:stop].astype(np.float64)
        mask = present[:, start:stop]
        count = mask.sum(axis=0)
        filled = np.where(mask, chunk, 0.0)
        mean = filled.sum(axis=0) / np.maximum(count, 1)
        deviation = np.where(mask, chunk - mean, 0.0)
        std = np.sqrt((deviation**2).sum(axis=0) / np.maximum(count, 1))
        highest = np.where(mask, chunk, -np.inf).max(axis=0, initial=-np.inf)
        lowest = np.where(mask, chunk, np.inf).min(axis=0, initial=np.inf)
        varies = (highest > lowest) & (std > 0) & np.isfinite(std)
        scale = np.where(varies, 1.0 / np.where(varies, std, 1.0), 0.0)
        z[:, start:stop] = deviation * scale
    return Standardized(
        z=z,
        z_sq=np.square(z),
        z_t=np.ascontiguousarray(z.T),
        present_t=np.ascontiguousarray(present.T).view(np.uint8),
        raw_t=np.ascontiguousarray(returns.T),
    )


@dataclass(frozen=True)
class Side:
    """Rows ``[row_start, row_start + n_rows)`` of a :class:`Standardized` window."""

    z: np.ndarray  # T' × N float32 view
    z_sq: np.ndarray  # T' × N float32 view
    z_t: np.ndarray  # N × T' float32 view
    present_t: np.ndarray  # N × T' uint8 view
    raw_t: np.ndarray  # N × T' float32 view
    col_sum: np.ndarray  # (N,) float64  s_j
    col_sq_sum: np.ndarray  # (N,) float64  q_j
    count: np.ndarray  # (N,) int64  n_j
    dense_cols: np.ndarray  # (d,) int64 ascending, the dense-gap columns
    dense_pos: np.ndarray  # (N,) int64, position in dense_cols or -1
    dense_present: np.ndarray  # T' × d float32 presence of dense columns
    dense_present_t: np.ndarray  # d × T' float32
    gap_ptr: np.ndarray  # (N + 1,) int64 CSR pointers (empty for dense columns)
    gap_rows: np.ndarray  # gap row indices (local to the side)

    @property
    def n_rows(self) -> int:
        return int(self.z.shape[0])


def make_side(window: Standardized, row_start: int, row_stop: int) -> Side:
    """The operand for rows ``[row_start, row_stop)``: views plus O(N) statistics and gaps."""
    rows = slice(row_start, row_stop)
    z = window.z[rows]
    present_t = window.present_t[:, rows]
    n_rows = row_stop - row_start
    count = present_t.sum(axis=1, dtype=np.int64)
    gaps = n_rows - count
    is_dense = gaps * DENSE_GAP_DIVISOR > n_rows
    dense_cols = np.flatnonzero(is_dense)
    dense_pos = np.full(window.n_cols, -1, dtype=np.int64)
    dense_pos[dense_cols] = np.arange(dense_cols.size)
    dense_present_t = present_t[dense_cols].astype(np.float32)

    sparse_gap_counts = np.where(is_dense, 0, gaps)
    gap_ptr = np.zeros(window.n_cols + 1, dtype=np.int64)
    np.cumsum(sparse_gap_counts, out=gap_ptr[1:])
    gap_cols, gap_rows = np.nonzero((present_t == 0) & ~is_dense[:, None])
    del gap_cols  # row-major order already groups the gap rows by column, ascending
    return Side(
        z=z,
        z_sq=window.z_sq[rows],
        z_t=window.z_t[:, rows],
        present_t=present_t,
        raw_t=window.raw_t[:, rows],
        col_sum=z.sum(axis=0, dtype=np.float64),
        col_sq_sum=window.z_sq[rows].sum(axis=0, dtype=np.float64),
        count=count,
        dense_cols=dense_cols,
        dense_pos=dense_pos,
        dense_present=np.ascontiguousarray(dense_present_t.T),
        dense_present_t=dense_present_t,
        gap_ptr=gap_ptr,
        gap_rows=gap_rows.astype(np.int64),
    )
