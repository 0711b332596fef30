"""Market residuals: each symbol's returns less what the strongest eigenportfolios explain
(SPEC §6 "Market residuals"), the series the lead-lag scan reads with
``lead_lag_market_modes = m > 0``.

Real returns share a market factor whose own serial correlation (a lag-1 reversal of the index
in stressed markets) appears in every pair's lagged correlation; lead-lag between two stocks is
what is left once the market is taken out (Avellaneda and Lee's residual returns on
eigenportfolios). With ``v_1 … v_m`` the unit eigenvectors of ``C`` (SPEC §5, :mod:`~corr_pipeline.compute.market_modes`)
for its ``m`` largest eigenvalues:

    z[t, j] = (R[t, j] − μ_j) / σ_j       (μ_j, σ_j: mean and ddof-0 std of j's finite returns;
                                            z = 0 where R is NaN)
    F[t, k] = Σ_j v_k[j] · z[t, j]          (the eigenportfolio returns, T × m)
    E[t, j] = R[t, j] − α_j − Σ_k β_jk F[t, k]

with ``(α_j, β_j)`` the least squares of ``R[t, j]`` on ``(1, F[t, 1], …, F[t, m])`` over the rows
where ``R[t, j]`` is finite; ``E`` is NaN where ``R`` is. The signs of the ``v_k`` do not matter.

How: in float64, a chunk of columns at a time (O(T·N) memory, no N × N array): ``F`` is the sum
over chunks of ``Z_chunk @ V_chunk``; then each column's normal equations ``G_j β_j = b_j``
with ``G_j = Σ_t m[t, j] x_t x_tᵀ`` (``x_t = (1, F[t])``, ``m`` the presence) for the whole chunk
in one product of the presence with the ``(m + 1)²`` products of the design's columns, and
``b_j = Σ_t m[t, j] R[t, j] x_t`` in another; the ``(m + 1) × (m + 1)`` systems are solved
together (a column whose system is singular, e.g. with fewer finite rows than ``m + 1``, by
``numpy.linalg.lstsq``, its minimum-norm solution). The design is well conditioned (the
eigenportfolio returns are uncorrelated with unit-scale variance), so the normal equations
lose no digit that float32 keeps.
"""

from __future__ import annotations

import numpy as np

from corr_pipeline.compute.market_modes import market_modes
from corr_pipeline.compute.validation import check_returns, check_square_corr

__all__ = ["eigenportfolio_returns", "market_residuals"]

COLUMN_CHUNK = 4096
"""Columns per chunk: a chunk's float64 temporaries are ``T × 4096 × 8`` bytes (8 MB at
T = 252) each."""


def market_residuals(
    R: np.ndarray,
    vectors: np.ndarray | None = None,
    *,
    corr: np.ndarray | None = None,
    m: int | None = None,
) -> np.ndarray:
    """The market residuals ``E`` (float32 T × N, NaN where ``R`` is) of the columns of ``R``
    (float32 T × N returns, NaN where missing), module docstring.

    Give either ``vectors`` (float N × m, the unit eigenvectors of ``C``, e.g.
    :func:`~corr_pipeline.compute.market_modes.market_modes`'s ``.vectors``), or ``corr`` (N × N
    float32, SPEC §3, possibly a read-only memory map) and ``m``: the ``m`` strongest modes are
    then found from it. ``m = 0`` (no vectors) gives the returns themselves, as a copy.

    Examples
    --------
    >>> import numpy as np
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> from corr_pipeline.compute import pairwise_correlation
    >>> corr = pairwise_correlation(R, min_overlap=60).corr
    >>> E = market_residuals(R, corr=corr, m=1)  # less the strongest mode (0 and 1 together)
    >>> E.dtype, E.shape, bool(np.array_equal(np.isnan(E), np.isnan(R)))
    (dtype('float32'), (250, 4), True)
    >>> round(float(np.corrcoef(E[20:-1, 2], E[21:, 3])[0, 1]), 2)  # 2 still leads 3
    0.71
    """
    check_returns(R)
    n_cols = R.shape[1]
    if vectors is None:
        if corr is None or m is None:
            raise ValueError("give the eigenvectors, or corr and the number of modes m")
        check_square_corr(corr)
        if corr.shape[0] != n_cols:
            raise ValueError(f"corr is {corr.shape[0]} × {corr.shape[1]} but R has N = {n_cols}")
        vectors = market_modes(corr, m).vectors
    elif corr is not None or m is not None:
        raise ValueError("give the eigenvectors or corr and m, not both")
    vectors = np.asarray(vectors, dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] != n_cols:
        raise ValueError(f"vectors must be N × m with N = {n_cols}, got shape {vectors.shape}")
    if not np.all(np.isfinite(vectors)):
        raise ValueError("vectors hold NaN or infinite values")
    if vectors.shape[1] == 0:
        return R.copy()
    design = np.column_stack([np.ones(R.shape[0]), eigenportfolio_returns(R, vectors)])
    out = np.empty(R.shape, dtype=np.float32)
    for start in range(0, n_cols, COLUMN_CHUNK):
        stop = min(start + COLUMN_CHUNK, n_cols)
        out[:, start:stop] = _residual_chunk(R[:, start:stop], design)
    return out


def eigenportfolio_returns(R: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``F = Z @ V`` (float64 T × m): the returns of the eigenportfolios ``vectors`` on the
    standardised returns (module docstring), summed a chunk of columns at a time."""
    F = np.zeros((R.shape[0], vectors.shape[1]))
    for start in range(0, R.shape[1], COLUMN_CHUNK):
        stop = min(start + COLUMN_CHUNK, R.shape[1])
        F += _standardised(R[:, start:stop]) @ vectors[start:stop]
    return F


def _standardised(block: np.ndarray) -> np.ndarray:
    """``z`` of the module docstring for a block of columns, float64, 0 where NaN (and for a
    constant column)."""
    X = block.astype(np.float64)
    present = np.isfinite(X)
    counts = np.maximum(present.sum(axis=0), 1)
    X[~present] = 0.0
    mean = X.sum(axis=0) / counts
    X -= mean
    X[~present] = 0.0
    std = np.sqrt((X * X).sum(axis=0) / counts)
    np.divide(X, std, out=X, where=std > 0)
    X[:, ~(std > 0)] = 0.0
    return X


def _residual_chunk(block: np.ndarray, design: np.ndarray) -> np.ndarray:
    """``E`` of a chunk of columns (module docstring) from the design ``(1, F)``."""
    X = block.astype(np.float64)
    present = np.isfinite(X)
    X[~present] = 0.0
    weights = present.astype(np.float64)
    k = design.shape[1]
    cross = (design[:, :, None] * design[:, None, :]).reshape(design.shape[0], k * k)
    gram = (weights.T @ cross).reshape(-1, k, k)  # one (m+1) × (m+1) system per column
    rhs = X.T @ design  # zeros where missing: the sums over the finite rows
    coefficients = np.empty_like(rhs)
    solvable = np.linalg.matrix_rank(gram) == k
    if np.any(solvable):
        coefficients[solvable] = np.linalg.solve(gram[solvable], rhs[solvable][:, :, None])[:, :, 0]
    for j in np.flatnonzero(~solvable):
        rows = present[:, j]
        coefficients[j] = np.linalg.lstsq(design[rows], X[rows, j], rcond=None)[0]
    residuals = X - design @ coefficients.T
    residuals[~present] = np.nan
    return residuals.astype(np.float32)
