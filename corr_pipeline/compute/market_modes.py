"""The strongest eigenmodes of the correlation matrix, and the correlation without them (SPEC §5).

``C`` is ``corr`` in float64 with NaN taken as 0 and a unit diagonal. Its ``m`` largest
eigenvalues ``λ_1 ≥ … ≥ λ_m`` with unit eigenvectors ``v_k`` are the *market modes*; ``λ_k / N``
is the share of the variance mode ``k`` carries. With them removed::

    C_res = C − Σ_k λ_k v_k v_kᵀ,
    C_m[i, j] = C_res[i, j] / sqrt(C_res[i, i] · C_res[j, j]),   C_m[i, i] = 1,

where a symbol whose residual variance ``C_res[i, i]`` is not positive (all of it lies in the
removed modes) has ``C_m[i, j]`` NaN for every ``j != i``, which the clusters' distance takes as
0, like any undefined correlation.

Method
------
Block Lanczos with full reorthogonalisation and Rayleigh–Ritz over the Krylov subspace
``span{Q_0, C Q_0, C² Q_0, …}`` (Golub & Van Loan §10.3). Each step is one pass over ``corr`` in
chunks of rows computing ``C Q_j`` for a block of ``b`` vectors in float64 (each chunk of the
float32 rows cleaned into a small float64 buffer, so no float64 or cleaned copy of ``corr``
exists); ``corr`` may be a read-only memory map. Memory is O(N · d) for a subspace of dimension ``d`` (a few hundred at
most) plus the row blocks: no N × N array, no dense eigendecomposition of ``C``. The Ritz pairs'
residuals ``‖C u − θ u‖`` come from the stored products, with no extra pass; the iteration stops
when the top ``m`` are below ``tol · θ_1``, or when the subspace is the whole space (then the
Ritz pairs are exact). The start block is fixed (a seeded generator), so the modes, and the
clusters built on them, are the same from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from corr_pipeline.compute.validation import check_square_corr
from corr_pipeline.compute.workers import thread_buffer, worker_pool

__all__ = ["MarketModes", "market_modes", "residual_correlation"]

#: Relative residual ``‖C u − θ u‖ / θ_1`` at which a Ritz pair counts as converged.
DEFAULT_TOLERANCE = 1e-11

#: Vectors per Lanczos block: at least this many, and at least ``m + 4``. A wider block
#: converges in fewer passes over ``corr``, and a pass costs about the same for 8 or 16
#: vectors, as it is bound by reading and converting ``corr``.
BLOCK_VECTORS = 16

#: Rows of ``corr`` converted and multiplied at a time (a fixed grid).
CHUNK_ROWS = 32

#: Largest Krylov subspace before the iteration gives up (O(N · d) float64 memory, twice).
MAX_DIMENSION = 400

_SEED = 20_240_521


@dataclass(frozen=True)
class MarketModes:
    """The ``m`` strongest eigenmodes of ``C``: ``eigenvalues`` float64 ``(m,)`` descending,
    ``vectors`` float64 ``(N, m)`` with unit columns; ``passes`` over ``corr`` it took."""

    eigenvalues: np.ndarray
    vectors: np.ndarray
    passes: int = 0

    @property
    def share(self) -> np.ndarray:
        """``λ_k / N``: the share of the total variance (``trace C = N``) each mode carries."""
        n = self.vectors.shape[0]
        return self.eigenvalues / n if n else self.eigenvalues.copy()

    def leading(self, m: int) -> MarketModes:
        """The first ``m`` of these modes."""
        return MarketModes(self.eigenvalues[:m].copy(), self.vectors[:, :m].copy(), self.passes)

    def residual_scale(self) -> np.ndarray:
        """``1 / sqrt(C_res[i, i])`` per symbol, NaN where the residual variance
        ``1 − Σ_k λ_k v_ik²`` is not positive."""
        residual = 1.0 - (self.vectors**2) @ self.eigenvalues
        scale = np.full(residual.shape, np.nan)
        positive = residual > 0
        scale[positive] = 1.0 / np.sqrt(residual[positive])
        return scale


@numba.njit(cache=True, nogil=True)
def _clean_rows(block, row0, out):  # pragma: no cover - compiled
    """``out[r] = C[row0 + r]`` in float64: ``corr``'s rows with NaN → 0 and a unit diagonal.
    Returns the number of ±inf entries met."""
    n_inf = 0
    for r in range(block.shape[0]):
        for j in range(block.shape[1]):
            c = np.float64(block[r, j])
            if c != c:
                c = 0.0
            elif abs(c) == np.inf:
                n_inf += 1
            out[r, j] = c
        out[r, row0 + r] = 1.0
    return n_inf


def _apply(corr: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``C @ X`` (N × b, float64) on the worker threads, in chunks of :data:`CHUNK_ROWS` rows
    of ``corr`` (a fixed grid, so the sums do not depend on the threads): each chunk cleaned
    into a float64 thread buffer (``CHUNK_ROWS · N · 8`` bytes) and multiplied by ``X`` in one
    single-threaded BLAS call."""
    n = corr.shape[0]
    X = np.ascontiguousarray(X, dtype=np.float64)
    out = np.empty_like(X)

    def apply_chunk(row0: int) -> int:
        row1 = min(row0 + CHUNK_ROWS, n)
        buf = thread_buffer("market_modes_rows", (row1 - row0, n), np.float64)
        n_inf = int(_clean_rows(np.asarray(corr[row0:row1]), row0, buf))
        np.matmul(buf, X, out=out[row0:row1])
        return n_inf

    with worker_pool() as pool:
        n_inf = sum(pool.map(apply_chunk, range(0, n, CHUNK_ROWS)))
    if n_inf:
        raise ValueError(
            f"corr holds {n_inf} infinite value(s); correlations must be finite or NaN (SPEC §3)"
        )
    return out


def _orthonormal_complement(W: np.ndarray, Q: np.ndarray | None, rng) -> np.ndarray:
    """An orthonormal basis of ``W``'s columns after removing ``span(Q)`` (twice, for full
    reorthogonalisation); columns that vanish are replaced by random directions, so the
    subspace keeps growing by ``W``'s width until it is the whole space."""
    n, width = W.shape
    basis = Q if Q is not None else np.empty((n, 0))
    room = n - basis.shape[1]
    width = min(width, room)
    W = W[:, :width].copy()
    norms0 = np.linalg.norm(W, axis=0)
    for _ in range(2):
        W -= basis @ (basis.T @ W)
    new = np.empty((n, 0))
    for k in range(width):
        w = W[:, k]
        for _ in range(2):
            w = w - basis @ (basis.T @ w) - new @ (new.T @ w)
        norm = np.linalg.norm(w)
        while norm <= 1e-10 * max(norms0[k], 1.0):  # a direction already in the subspace
            w = rng.standard_normal(n)
            for _ in range(2):
                w = w - basis @ (basis.T @ w) - new @ (new.T @ w)
            norm = np.linalg.norm(w)
            norms0[k] = 1.0
        new = np.hstack([new, (w / norm)[:, None]])
    return new


def market_modes(
    corr: np.ndarray,
    m: int,
    *,
    tol: float = DEFAULT_TOLERANCE,
    max_dimension: int = MAX_DIMENSION,
) -> MarketModes:
    """The ``m`` largest eigenpairs of ``C`` (``corr``, NaN → 0, unit diagonal; module
    docstring), by block Lanczos over ``corr`` in row blocks.

    Parameters
    ----------
    corr : float32 (N, N), exactly symmetric (SPEC §3), possibly a read-only ``np.memmap``;
        only read, :data:`CHUNK_ROWS` rows at a time.
    m : number of modes, ``0 <= m < N`` (``m = 0`` gives empty arrays and no pass).
    tol : relative residual ``‖C u − θ u‖ / θ_1`` for convergence.
    max_dimension : the largest subspace tried.

    Returns
    -------
    MarketModes with ``eigenvalues`` (descending) and unit ``vectors`` (signs arbitrary).

    Raises
    ------
    TypeError / ValueError : ``corr`` not a square float32 array or holding ±inf, ``m`` not an
        integer in ``0 .. N−1``. RuntimeError : no convergence within ``max_dimension``.

    Examples
    --------
    >>> import numpy as np
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> from corr_pipeline.compute import pairwise_correlation
    >>> corr = pairwise_correlation(R, min_overlap=60).corr
    >>> modes = market_modes(corr, 1)  # the strongest mode: symbols 0 and 1 together
    >>> round(float(modes.eigenvalues[0]), 3), np.abs(modes.vectors[:, 0]).round(2).tolist()
    (1.751, [0.7, 0.7, 0.14, 0.06])
    """
    check_square_corr(corr)
    n = corr.shape[0]
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
        raise TypeError(f"the number of market modes must be an integer, got {m!r}")
    if not 0 <= m < max(n, 1):
        raise ValueError(
            f"market_modes_removed must be in 0 .. N−1 = {max(n - 1, 0)} for {n} symbols, got {m}"
        )
    if m == 0:
        return MarketModes(np.empty(0), np.empty((n, 0)))
    rng = np.random.default_rng(_SEED)
    width = min(n, max(BLOCK_VECTORS, m + 4))
    blocks = [_orthonormal_complement(rng.standard_normal((n, width)), None, rng)]
    products: list[np.ndarray] = []
    while True:
        products.append(_apply(corr, blocks[-1]))
        Q = np.hstack(blocks)
        CQ = np.hstack(products)
        T = Q.T @ CQ
        theta, Y = np.linalg.eigh((T + T.T) / 2)
        top = np.argsort(-theta, kind="stable")[:m]
        theta, Y = theta[top], Y[:, top]
        U = Q @ Y
        residual = np.linalg.norm(CQ @ Y - U * theta, axis=0)
        whole_space = Q.shape[1] >= n
        if whole_space or residual.max() <= tol * max(abs(theta[0]), 1.0):
            return MarketModes(theta.copy(), U, passes=len(products))
        if Q.shape[1] + width > max_dimension:
            raise RuntimeError(
                f"the {m} strongest eigenmodes of corr did not converge within a subspace of "
                f"{Q.shape[1]} vectors (relative residual {residual.max() / theta[0]:.2e}, "
                f"wanted {tol:.0e})"
            )
        blocks.append(_orthonormal_complement(products[-1], Q, rng))


def residual_correlation(corr_rows: np.ndarray, row0: int, modes: MarketModes) -> np.ndarray:
    """Rows ``row0 ..`` of ``C_m`` (float64) from the same rows of ``corr``: the rank-``m``
    correction of one block of rows, as the clusters apply it tile by tile (module docstring).
    """
    rows = np.arange(row0, row0 + corr_rows.shape[0])
    C = np.nan_to_num(corr_rows.astype(np.float64), nan=0.0)
    C[np.arange(len(rows)), rows] = 1.0
    weighted = modes.vectors * modes.eigenvalues
    scale = modes.residual_scale()
    C -= weighted[rows] @ modes.vectors.T
    C *= scale[rows, None] * scale[None, :]
    C[np.arange(len(rows)), rows] = 1.0
    return C
