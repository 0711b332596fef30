"""Hierarchical clustering of the correlation matrix (SPEC §5).

Distance (Mantegna), for ``i < j``::

    d[i, j] = sqrt(max(0, 2 · (1 − c))),   c = float64(corr[i, j]),  NaN → 0 (d = sqrt(2)),

the ``max`` only clipping a correlation a rounding step above 1. Agglomerative linkage
(``average`` by default; ``single``, ``complete``, ``weighted``), cut at a distance threshold or
into a requested number of clusters, labels ``0..K−1`` numbered by first appearance (SPEC §5).

Exactness
---------
SPEC §5's reference is ``scipy.cluster.hierarchy.linkage(condensed d, method)`` then
``fcluster``. The kernels here are a port of scipy's own algorithms (``scipy/cluster/
_hierarchy.pyx``: ``nn_chain`` for average / complete / weighted, ``mst_single_linkage`` for
single) with the same distance-update formulas in the same operation order, the same strict
``<`` comparisons visiting candidates in the same ascending index order, the same stable sort by
height and the same union-find relabelling. They therefore reproduce scipy's linkage matrix
``Z`` bit for bit, ties included, and the cut is scipy's own ``fcluster`` on that ``Z``.
fastcluster is deliberately not used: its average update ``s·a + t·b`` with
``s = n_x/(n_x+n_y)`` rounds differently from scipy's ``(n_x·a + n_y·b)/(n_x+n_y)`` (its ``Z``
heights differ from scipy's in the last bits on nearly every input) and its NN-chain restarts
differently, so on tied distances its partition can differ from the reference.

What differs from scipy is only *where the distances live and how the live clusters are
walked*, which changes speed and memory but no comparison or arithmetic:

* Storage. scipy's condensed vector keeps row ``x`` contiguous for partners ``i > x`` but
  scatters partners ``i < x`` one per cache line, ~N·8 bytes apart; at N = 24,000 those strided
  reads dominate the NN-chain (about 1.5·N² of its ~2·N² reads). Here the upper triangle is
  stored in ``B × B`` tiles (``B = 64``, row-major inside a tile, tiles of one tile-row
  consecutive), so both kinds of scan stay within 32 KiB tiles. The position of pair
  ``i < j`` is ``G[i] + F[j]`` for two O(N) tables, which also describe scipy's condensed layout
  (``G[i] = N·i − i(i+1)/2 − i − 1``, ``F[j] = j``) so one kernel serves both.
* Live clusters are kept in a dense sorted array (with their ``G``/``F`` entries) instead of
  being found by testing ``size[i] == 0`` over all ``i``: same indices, same order, no wasted
  reads of dead rows, and independent loads the CPU can overlap.

Memory at N = 24,000
--------------------
One float64 distance buffer: ``N(N−1)/2`` = 287,988,000 distances plus 0.27 % tile padding =
288,768,000 × 8 B = 2.31 GB, built from the (possibly memory-mapped, float32) ``corr`` one block
of rows at a time (``corr`` is only read, never copied) and then consumed in place by the
linkage. Everything else is O(N) (tables, live list, the (N−1) × 4 ``Z``). For comparison scipy's
``linkage`` copies its 2.30 GB input (``nn_chain`` starts with ``dists.copy()``) and fastcluster's
public ``linkage`` copies it too. Pass ``work=`` a float64 ``np.memmap`` of
:func:`distance_buffer_length` elements to keep those 2.31 GB out of anonymous memory (they are
then held by the page cache, and written back to the file, instead): the snapshot's clustering
step does, with a scratch file of the matrix store. On this machine's kernel (6.18, ext4) the
page cache maps such a file with 2 MiB pages as the heap would, so the linkage runs as fast
(docs/benchmarks.md, Clusters).

Not smaller in float32: scipy's reference works on ``d = sqrt(2·(1 − c))`` rounded to float64,
which is in general not a float32 (the square root of the 24-bit ``2·(1 − c)`` rounds at the
53rd bit), and the average and weighted updates produce float64 values that are not distances of any
``c``. Only the *original* distances could be recomputed from the float32 ``corr`` on the fly,
exactly; the updated ones must stay float64.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from scipy.cluster.hierarchy import fcluster

from corr_pipeline.compute.intrinsics import prefetch
from corr_pipeline.compute.market_modes import MarketModes, market_modes
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, block_rows_for, row_blocks
from corr_pipeline.compute.validation import (
    check_array,
    check_finite_number,
    check_output,
    check_square_corr,
    check_working_memory,
)
from corr_pipeline.compute.workers import available_cores, worker_pool

__all__ = [
    "LINKAGE_METHODS",
    "TILE_SHIFT",
    "condensed_distances",
    "distance_buffer_length",
    "hierarchical_clusters",
    "linkage_matrix",
]

#: Accepted linkage methods and the code the kernels use for them.
LINKAGE_METHODS: dict[str, int] = {"single": 0, "complete": 1, "average": 2, "weighted": 3}

#: Live clusters ahead whose column entry the NN-chain prefetches (measured: ~10 % faster at
#: N = 24,000; 8, 16 and 32 within noise of each other).
PREFETCH_AHEAD = 32

#: Tiles of ``2**TILE_SHIFT`` × ``2**TILE_SHIFT`` distances in the working buffer (0 would mean
#: scipy's plain condensed layout).
TILE_SHIFT = 6


# --------------------------------------------------------------------------------------------
# Layouts of the upper triangle: pair i < j lives at G[i] + F[j]
# --------------------------------------------------------------------------------------------


def _layout(n: int, tile_shift: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(G, F, length)`` of the triangle layout; ``tile_shift == 0`` is scipy's condensed one."""
    i = np.arange(n, dtype=np.int64)
    if tile_shift == 0:
        return n * i - ((i * (i + 1)) >> 1) - i - 1, i, n * (n - 1) // 2
    b = 1 << tile_shift
    nb = (n + b - 1) >> tile_shift
    bi = i >> tile_shift
    # tile (bi, bj), bi <= bj, starts at (bi·nb − bi(bi−1)/2 + bj − bi)·b²; row-major inside
    G = ((bi * nb - ((bi * (bi - 1)) >> 1) - bi) << (2 * tile_shift)) + (
        (i & (b - 1)) << tile_shift
    )
    F = (bi << (2 * tile_shift)) + (i & (b - 1))
    return G, F, nb * (nb + 1) // 2 * b * b


def distance_buffer_length(n: int) -> int:
    """Length (float64 elements) of the ``work`` buffer :func:`hierarchical_clusters` needs."""
    b = 1 << TILE_SHIFT
    nb = (n + b - 1) >> TILE_SHIFT
    return nb * (nb + 1) // 2 * b * b


@numba.njit(cache=True, nogil=True)
def _fill_rows(block, row0, n, G, F, run_shift, out, W, V, scale):  # pragma: no cover - compiled
    """Write the distances of rows ``row0 .. row0+len(block)-1`` (pairs ``j > i``) into ``out``.

    Runs of ``2**run_shift`` consecutive ``j`` are contiguous in ``out`` (the whole row when
    ``run_shift`` is 0). With ``m = W.shape[1] > 0`` modes removed, the correlation is first
    replaced by ``C_m[i, j] = (c − Σ_k W[i, k] V[j, k]) · scale[i] · scale[j]`` (``W = V·λ``,
    ``scale = 1 / sqrt(C_res[i, i])``, NaN → 0 again). Returns the number of ±inf
    correlations met.
    """
    m = W.shape[1]
    n_inf = 0
    for r in range(block.shape[0]):
        i = row0 + r
        g = G[i]
        j0 = i + 1
        while j0 < n:
            if run_shift == 0:
                j1 = n
            else:
                j1 = min(n, ((j0 >> run_shift) + 1) << run_shift)
            dst = g + F[j0] - j0
            for j in range(j0, j1):
                c = np.float64(block[r, j])
                n_inf += abs(c) == np.inf
                c = 0.0 if c != c else c  # NaN correlation counts as 0
                if m > 0:
                    for k in range(m):
                        c -= W[i, k] * V[j, k]
                    c *= scale[i] * scale[j]
                    c = 0.0 if c != c else c
                arg = 2.0 * (1.0 - c)
                arg = arg if arg > 0.0 else 0.0
                out[dst + j] = math.sqrt(arg)
            j0 = j1
    return n_inf


def _fill(
    corr,
    G,
    F,
    run_shift: int,
    out: np.ndarray,
    working_memory_mb: float,
    modes: MarketModes | None = None,
) -> None:
    """All distances into ``out``, blocks of rows in parallel threads (``_fill_rows`` is nogil),
    with the rank-``m`` correction of ``modes`` applied to each block (none when None).

    Rows ``0 .. N−2`` (the last row has no pair ``j > i``), in :func:`row_blocks` of at most
    1/64 of the rows so the shrinking triangle rows balance out; each thread holds one block of
    ``corr`` (together within ``working_memory_mb``).
    """
    n = corr.shape[0]
    row_bytes = n * corr.dtype.itemsize * available_cores()
    rows = block_rows_for(row_bytes, working_memory_mb, n)
    rows = max(1, min(rows, -(-n // 64)))
    if modes is None or modes.eigenvalues.shape[0] == 0:
        V = W = np.empty((n, 0))
        scale = np.empty(n)
    else:
        V = np.ascontiguousarray(modes.vectors)
        W = np.ascontiguousarray(V * modes.eigenvalues)
        scale = modes.residual_scale()

    def fill_block(rows_range: tuple[int, int]) -> int:
        row0, row1 = rows_range
        block = np.asarray(corr[row0:row1])  # a view for ndarray / memmap
        return int(_fill_rows(block, row0, n, G, F, run_shift, out, W, V, scale))

    with worker_pool() as pool:
        n_inf = sum(pool.map(fill_block, row_blocks(n - 1, row_bytes, block_rows=rows)))
    if n_inf:
        raise ValueError(
            f"corr holds {n_inf} infinite value(s) above the diagonal; correlations must be "
            "finite or NaN (SPEC §3)"
        )


def condensed_distances(
    corr: np.ndarray,
    *,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """scipy-layout condensed float64 Mantegna distance vector of ``corr`` (SPEC §5).

    ``out[N·i − i(i+1)/2 + j − i − 1] = sqrt(max(0, 2·(1 − c)))`` for ``i < j``, with
    ``c = float64(corr[i, j])`` and NaN → 0 — exactly what ``scipy.spatial.distance.squareform``
    of that distance matrix gives. Only the upper triangle of ``corr`` is read (SPEC §3 makes
    ``corr`` exactly symmetric), in blocks of rows, never copied. ``out`` (writeable,
    C-contiguous float64, length ``N(N−1)/2``) may be supplied, e.g. a ``np.memmap``. Argument
    errors as in :func:`hierarchical_clusters`.
    """
    check_square_corr(corr)
    check_working_memory(working_memory_mb)
    n = corr.shape[0]
    G, F, length = _layout(n, 0)
    out = check_output(out, "out", (length,), np.dtype(np.float64), contiguous=True)
    if n >= 2:
        _fill(corr, G, F, 0, out, working_memory_mb)
    return out


# --------------------------------------------------------------------------------------------
# Linkage kernels: scipy/cluster/_hierarchy.pyx, on any G/F layout, in place
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _update(d_xi, d_yi, nx, ny, method):  # pragma: no cover - compiled
    """scipy's distance update (``_hierarchy_distance_update.pxi``), same operation order."""
    if method == 1:  # complete: max(d_xi, d_yi)
        return d_yi if d_yi > d_xi else d_xi
    elif method == 2:  # average
        return (nx * d_xi + ny * d_yi) / (nx + ny)
    else:  # weighted
        return 0.5 * (d_xi + d_yi)


@numba.njit(cache=True, nogil=True, inline="always")
def _position(live, m, x):  # pragma: no cover - compiled
    """Index of ``x`` in the sorted ``live[:m]`` (binary search; ``x`` is present)."""
    lo = 0
    hi = m
    while lo < hi:
        mid = (lo + hi) >> 1
        if live[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def _remove(live, live_g, live_f, m, p):  # pragma: no cover - compiled
    for t in range(p, m - 1):
        live[t] = live[t + 1]
        live_g[t] = live_g[t + 1]
        live_f[t] = live_f[t + 1]


@numba.njit(cache=True, nogil=True)
def _nn_chain(D, n, method, Z, G, F):  # pragma: no cover - compiled
    """scipy's ``nn_chain`` (complete=1, average=2, weighted=3) on ``D`` in place.

    ``live[:m]`` holds the indices of the clusters still alive, ascending — the indices, in the
    order, that scipy's ``for i in range(n): if size[i] == 0 or ...: continue`` visits — with
    their ``G``/``F`` entries alongside, so every loop below compares and updates exactly what
    scipy's does, in the same order.
    """
    size = np.ones(n, dtype=np.int64)
    live = np.arange(n).astype(np.int32)
    live_g = G.copy()
    live_f = F.copy()
    m = n
    chain = np.empty(n, dtype=np.int64)
    chain_length = 0
    y = 0
    for k in range(n - 1):
        if chain_length == 0:
            chain_length = 1
            chain[0] = live[0]
        # Go through the chain of nearest neighbours until two mutual neighbours are found;
        # the previous chain element is preferred on a tie (strict <, scanned first).
        while True:
            x = chain[chain_length - 1]
            if chain_length > 1:
                y = chain[chain_length - 2]
                if x < y:
                    current_min = D[G[x] + F[y]]
                else:
                    current_min = D[G[y] + F[x]]
            else:
                current_min = np.inf
            px = _position(live, m, x)
            fx = F[x]
            for t in range(px):  # live i < x: one cache line each, fetched ahead
                prefetch(D, live_g[min(t + PREFETCH_AHEAD, m - 1)] + fx)
                dist = D[live_g[t] + fx]
                if dist < current_min:
                    current_min = dist
                    y = live[t]
            gx = G[x]
            for t in range(px + 1, m):  # live i > x
                dist = D[gx + live_f[t]]
                if dist < current_min:
                    current_min = dist
                    y = live[t]
            if chain_length > 1 and y == chain[chain_length - 2]:
                break
            chain[chain_length] = y
            chain_length += 1

        # Merge x and y (x < y); the merged cluster takes y's place.
        chain_length -= 2
        if x > y:
            x, y = y, x
        nx = size[x]
        ny = size[y]
        Z[k, 0] = x
        Z[k, 1] = y
        Z[k, 2] = current_min
        Z[k, 3] = nx + ny
        size[x] = 0
        size[y] = nx + ny
        px = _position(live, m, x)
        _remove(live, live_g, live_f, m, px)
        m -= 1
        py = _position(live, m, y)

        # D(i, y) <- update(D(i, x), D(i, y)) for every live i != y
        gx = G[x]
        gy = G[y]
        fx = F[x]
        fy = F[y]
        for t in range(px):  # i < x
            gi = live_g[t]
            ahead = live_g[min(t + PREFETCH_AHEAD, m - 1)]
            prefetch(D, ahead + fx)
            prefetch(D, ahead + fy)
            D[gi + fy] = _update(D[gi + fx], D[gi + fy], nx, ny, method)
        for t in range(px, py):  # x < i < y
            gi = live_g[t]
            prefetch(D, live_g[min(t + PREFETCH_AHEAD, m - 1)] + fy)
            D[gi + fy] = _update(D[gx + live_f[t]], D[gi + fy], nx, ny, method)
        for t in range(py + 1, m):  # i > y
            fi = live_f[t]
            D[gy + fi] = _update(D[gx + fi], D[gy + fi], nx, ny, method)


@numba.njit(cache=True, nogil=True)
def _mst_single(D, n, Z, G, F):  # pragma: no cover - compiled
    """scipy's ``mst_single_linkage`` (Prim) on any G/F layout; reads ``D`` only."""
    dmin = np.full(n, np.inf)
    live = np.arange(n).astype(np.int32)  # not yet merged, ascending
    live_g = G.copy()
    live_f = F.copy()
    m = n
    x = 0
    y = 0
    for k in range(n - 1):
        current_min = np.inf
        px = _position(live, m, x)
        _remove(live, live_g, live_f, m, px)  # merged[x] = 1
        m -= 1
        fx = F[x]
        gx = G[x]
        for t in range(m):
            i = live[t]
            if t < px:
                dist = D[live_g[t] + fx]
            else:
                dist = D[gx + live_f[t]]
            if dmin[i] > dist:
                dmin[i] = dist
            if dmin[i] < current_min:
                y = i
                current_min = dmin[i]
        Z[k, 0] = x
        Z[k, 1] = y
        Z[k, 2] = current_min
        x = y


@numba.njit(cache=True, nogil=True)
def _find(parent, x):  # pragma: no cover - compiled
    p = x
    while parent[x] != x:
        x = parent[x]
    while parent[p] != x:
        q = parent[p]
        parent[p] = x
        p = q
    return x


@numba.njit(cache=True, nogil=True)
def _label(Z, n):  # pragma: no cover - compiled
    """scipy's ``label``: turn a height-sorted merge list into a linkage matrix."""
    parent = np.arange(2 * n - 1, dtype=np.int64)
    size = np.ones(2 * n - 1, dtype=np.int64)
    next_label = n
    for i in range(n - 1):
        xr = _find(parent, np.int64(Z[i, 0]))
        yr = _find(parent, np.int64(Z[i, 1]))
        if xr < yr:
            Z[i, 0] = xr
            Z[i, 1] = yr
        else:
            Z[i, 0] = yr
            Z[i, 1] = xr
        parent[xr] = next_label
        parent[yr] = next_label
        size[next_label] = size[xr] + size[yr]
        Z[i, 3] = size[next_label]
        next_label += 1


def _linkage(D: np.ndarray, n: int, method: str, G: np.ndarray, F: np.ndarray) -> np.ndarray:
    Z = np.empty((max(n - 1, 0), 4), dtype=np.float64)
    if n < 2:
        return Z
    code = LINKAGE_METHODS[method]
    if code == 0:
        _mst_single(D, n, Z, G, F)
    else:
        _nn_chain(D, n, code, Z, G, F)
    Z = Z[np.argsort(Z[:, 2], kind="mergesort")]
    _label(Z, n)
    return Z


def _check_method(method: str) -> None:
    if method not in LINKAGE_METHODS:
        raise ValueError(
            f"unknown linkage method {method!r}; expected one of {sorted(LINKAGE_METHODS)}"
        )


def linkage_matrix(condensed: np.ndarray, method: str = "average") -> np.ndarray:
    """scipy-format linkage matrix ``Z`` ((N−1) × 4) of a scipy-layout condensed vector.

    Equals ``scipy.cluster.hierarchy.linkage(condensed, method)`` bit for bit (module
    docstring). For ``average``, ``complete`` and ``weighted`` ``condensed`` is **overwritten**
    (it is the NN-chain's working matrix, so it must be writeable); ``single`` only reads it.
    ``condensed`` must be a C-contiguous 1-D float64 array of finite values whose length is
    ``N(N−1)/2`` for an integer ``N`` (``TypeError`` for a non-array or another dtype,
    ``ValueError`` otherwise).
    """
    _check_method(method)
    check_array(
        condensed,
        "condensed",
        np.float64,
        ndim=1,
        contiguous=True,
        writeable=method != "single",
    )
    m = condensed.shape[0]
    n = int(math.ceil(math.sqrt(2 * m))) if m else 1
    if n * (n - 1) // 2 != m:
        raise ValueError(f"length {m} of condensed is not N(N-1)/2 for any integer N")
    if not np.isfinite(condensed).all():
        raise ValueError("condensed distances must be finite")
    G, F, _ = _layout(n, 0)
    return _linkage(condensed, n, method, G, F)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber labels ``0..K−1`` by first appearance in column order (SPEC §5)."""
    uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(uniq.shape[0], dtype=np.int32)
    rank[np.argsort(first, kind="stable")] = np.arange(uniq.shape[0], dtype=np.int32)
    return rank[inverse.reshape(-1)]


def _modes_to_remove(corr: np.ndarray, m: int, modes: MarketModes | None) -> MarketModes | None:
    """The ``m`` modes to remove (None for ``m = 0``): the first ``m`` of ``modes`` or, when
    None, :func:`market_modes` of ``corr``."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
        raise TypeError(f"market_modes_removed must be an integer, got {m!r}")
    n = corr.shape[0]
    if not 0 <= m < max(n, 1):
        raise ValueError(
            f"market_modes_removed must be in 0 .. N−1 = {max(n - 1, 0)} for {n} symbols, got {m}"
        )
    if m == 0:
        return None
    if modes is None:
        return market_modes(corr, m)
    if modes.vectors.shape[0] != n or modes.eigenvalues.shape[0] < m:
        raise ValueError(
            f"modes hold {modes.eigenvalues.shape[0]} mode(s) of {modes.vectors.shape[0]} "
            f"symbols; {m} of {n} are needed"
        )
    return modes.leading(m)


def hierarchical_clusters(
    corr: np.ndarray,
    *,
    method: str = "average",
    distance_threshold: float | None = None,
    n_clusters: int | None = None,
    market_modes_removed: int = 0,
    modes: MarketModes | None = None,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    work: np.ndarray | None = None,
) -> np.ndarray:
    """Flat clusters of the symbols from agglomerative linkage on Mantegna distances (SPEC §5).

    ``d[i, j] = sqrt(max(0, 2·(1 − corr[i, j])))`` in float64, a NaN ``corr`` taken as 0
    (``d = sqrt(2)``); linkage ``method`` in ``single``, ``complete``, ``average`` (default),
    ``weighted``, identical to ``scipy.cluster.hierarchy.linkage(condensed d, method)``; then
    exactly ``fcluster(Z, distance_threshold, criterion="distance")`` (merges at height
    ``<= distance_threshold`` are kept) or ``fcluster(Z, n_clusters, criterion="maxclust")``
    (the lowest cut giving at most ``n_clusters`` clusters: fewer when merge heights tie).

    With ``market_modes_removed = m > 0`` the distances are those of ``C_m``, the correlation
    without its ``m`` strongest eigenmodes (:mod:`corr_pipeline.compute.market_modes`), the
    rank-``m`` correction applied to each block of rows as the distances are formed; the
    partition equals scipy's on ``C_m`` from ``numpy.linalg.eigh`` except where a merge height
    lies within 1e-9 of another.

    Parameters
    ----------
    corr : float32 (N, N) array (SPEC §3), possibly a read-only ``np.memmap``. Only the upper
        triangle is read (``corr`` is exactly symmetric by SPEC §3), in blocks of rows sized by
        ``working_memory_mb``; it is never copied.
    method : linkage method; anything else raises ``ValueError``.
    distance_threshold, n_clusters : exactly one must be given (``ValueError`` otherwise);
        ``distance_threshold`` a finite number, ``n_clusters`` a whole number ``>= 1`` (an
        integer, or a float with an integral value).
    market_modes_removed : ``m``, an integer ``0 <= m < N``.
    modes : the modes :func:`~corr_pipeline.compute.market_modes.market_modes` already found
        for this ``corr`` (at least ``m`` of them; the first ``m`` are removed), to save its
        passes; when None and ``m > 0`` they are computed here.
    working_memory_mb : budget in MiB for the per-block temporaries; the result does not
        depend on it.
    work : optional writeable, C-contiguous float64 buffer of :func:`distance_buffer_length`
        ``(N)`` elements (e.g. a ``np.memmap``) to hold the distances instead of a fresh
        8·N²/2-byte allocation; overwritten.

    Returns
    -------
    labels : int32 (N,), ``0..K−1`` numbered by first appearance in column order.

    Raises
    ------
    TypeError : ``corr`` or ``work`` not a numpy array, ``corr`` not float32, ``work`` not
        float64, ``distance_threshold`` / ``n_clusters`` / ``working_memory_mb`` not a number.
    ValueError : ``corr`` not square or holding ±inf above the diagonal, an unknown
        ``method``, not exactly one cut, a non-finite threshold, ``n_clusters`` not a whole
        number ``>= 1``, ``working_memory_mb`` not > 0, ``work`` of the wrong length, not
        C-contiguous or read-only.

    Examples
    --------
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> from corr_pipeline.compute import pairwise_correlation
    >>> corr = pairwise_correlation(R, min_overlap=60).corr
    >>> hierarchical_clusters(corr, distance_threshold=1.2).tolist()  # 0 and 1 together
    [0, 0, 1, 2]
    """
    check_square_corr(corr)
    _check_method(method)
    if (distance_threshold is None) == (n_clusters is None):
        raise ValueError("give exactly one of distance_threshold and n_clusters")
    if distance_threshold is not None:
        t, criterion = check_finite_number(distance_threshold, "distance_threshold"), "distance"
    else:
        count = check_finite_number(n_clusters, "n_clusters")
        if count != int(count) or count < 1:
            raise ValueError(f"n_clusters must be a whole number >= 1, got {n_clusters!r}")
        t, criterion = int(count), "maxclust"
    check_working_memory(working_memory_mb)

    n = corr.shape[0]
    removed = _modes_to_remove(corr, market_modes_removed, modes)
    if n <= 1:
        return np.zeros(n, dtype=np.int32)
    G, F, length = _layout(n, TILE_SHIFT)
    work = check_output(work, "work", (length,), np.dtype(np.float64), contiguous=True)
    _fill(corr, G, F, TILE_SHIFT, work, working_memory_mb, removed)
    Z = _linkage(work, n, method, G, F)
    del work
    return _canonical_labels(fcluster(Z, t, criterion=criterion))
