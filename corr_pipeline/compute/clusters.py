"""Hierarchical clustering of the correlation matrix (SPEC §5).

Distance (Mantegna)::

    d[i, j] = sqrt(2 · (1 − c[i, j])),   c = corr[i, j] cast to float64, NaN → 0 (d = sqrt(2)),

with a negative argument (``corr`` a rounding step above 1) clipped to 0. Agglomerative linkage
(``average`` by default; ``single``, ``complete``, ``weighted``), cut at a distance threshold or
into a requested number of clusters, labels ``0..K−1`` numbered by first appearance.

Exactness. SPEC §5's reference is ``scipy.cluster.hierarchy.linkage(condensed, method)`` then
``fcluster``. The linkage kernels below are a line-by-line port of scipy's own algorithms
(``scipy/cluster/_hierarchy.pyx``: ``nn_chain`` for average/complete/weighted,
``mst_single_linkage`` for single; the same distance-update formulas, the same strict ``<``
comparisons in the same index order, the same stable sort by height and union-find relabelling),
so they produce scipy's linkage matrix ``Z`` bit for bit, ties included; the cut is scipy's own
``fcluster``. fastcluster is *not* used: its average update ``s·a + t·b`` (with
``s = n_x/(n_x+n_y)``) rounds differently from scipy's ``(n_x·a + n_y·b)/(n_x+n_y)`` and its
NN-chain restarts differently, so on near-ties it can merge in another order.

Memory (N = 24,000, ``M = N(N−1)/2`` = 287,988,000): the only large array is the float64
condensed distance vector, ``8·M`` bytes = 2.30 GB, built row by row from the (possibly
memory-mapped) float32 ``corr`` and then consumed *in place* by the NN-chain (scipy's ``linkage``
copies it — another 2.30 GB — and fastcluster's public ``linkage`` copies it too). ``corr`` is
only read. Everything else is O(N). A caller who wants the 2.30 GB off the anonymous heap can pass
``work=`` a float64 ``np.memmap`` of length ``M`` (it is then backed by the page cache instead).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from scipy.cluster.hierarchy import fcluster

__all__ = ["LINKAGE_METHODS", "condensed_distances", "linkage_matrix", "hierarchical_clusters"]

#: Accepted linkage methods and the code used by the kernels below.
LINKAGE_METHODS: dict[str, int] = {"single": 0, "complete": 1, "average": 2, "weighted": 3}

_SQRT2 = math.sqrt(2.0)


# --------------------------------------------------------------------------------------------
# Condensed distance vector
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _fill_condensed_rows(block, row0, n, out):  # pragma: no cover - compiled
    """Write the condensed entries of rows ``row0 .. row0+len(block)-1`` into ``out``.

    Returns the number of non-finite distances produced (±inf in ``corr``).
    """
    n_bad = 0
    for r in range(block.shape[0]):
        i = row0 + r
        pos = n * i - (i * (i + 1)) // 2  # condensed index of (i, i+1)
        for j in range(i + 1, n):
            c = np.float64(block[r, j])
            if c != c:  # NaN correlation counts as 0
                c = 0.0
            arg = 2.0 * (1.0 - c)
            if arg < 0.0:  # corr a rounding step above 1
                arg = 0.0
            d = math.sqrt(arg)
            if not math.isfinite(d):
                n_bad += 1
            out[pos] = d
            pos += 1
    return n_bad


def _chunk_rows(row_bytes: int, working_memory_mb: float) -> int:
    """Rows per block for a working-memory budget (as scikit-learn's ``get_chunk_n_rows``)."""
    budget = int(working_memory_mb * 2**20)
    return max(1, budget // max(1, row_bytes))


def condensed_distances(
    corr: np.ndarray, *, working_memory_mb: float = 256, out: np.ndarray | None = None
) -> np.ndarray:
    """Condensed float64 Mantegna distance vector of ``corr`` (SPEC §5).

    ``out[k]`` for the pair ``i < j`` (scipy's condensed order, ``k = N·i − i(i+1)/2 + j − i − 1``)
    is ``sqrt(max(0, 2·(1 − c)))`` with ``c = float64(corr[i, j])`` and NaN → 0. Only the upper
    triangle of ``corr`` is read (SPEC §3 makes it exactly symmetric), block of rows by block of
    rows, so a memory-mapped ``corr`` is never materialised. ``out`` (float64, length
    ``N(N−1)/2``) may be supplied, e.g. a ``np.memmap``; otherwise it is allocated.
    """
    corr = _check_square(corr, "corr")
    n = corr.shape[0]
    m = n * (n - 1) // 2
    if out is None:
        out = np.empty(m, dtype=np.float64)
    elif out.dtype != np.float64 or out.ndim != 1 or out.shape[0] != m:
        raise ValueError(
            f"out must be a 1-D float64 array of length N(N-1)/2 = {m}; "
            f"got dtype {out.dtype}, shape {out.shape}"
        )
    rows = _chunk_rows(n * corr.dtype.itemsize, working_memory_mb)
    n_bad = 0
    for row0 in range(0, max(n - 1, 0), rows):
        block = np.asarray(corr[row0 : min(row0 + rows, n - 1)])  # a view for ndarray/memmap
        n_bad += _fill_condensed_rows(block, row0, n, out)
    if n_bad:
        raise ValueError(
            f"corr holds {n_bad} infinite off-diagonal value(s); correlations must be finite "
            "or NaN (SPEC §3)"
        )
    return out


# --------------------------------------------------------------------------------------------
# Linkage kernels (port of scipy/cluster/_hierarchy.pyx, in place)
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _row_base(n, i):  # pragma: no cover - compiled
    """``_row_base(n, i) + j`` is scipy's condensed index of the pair ``i < j``."""
    return n * i - ((i * (i + 1)) >> 1) - i - 1


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
def _live_position(live, m, x):  # pragma: no cover - compiled
    """Index of ``x`` in the sorted prefix ``live[:m]`` (binary search; ``x`` is present)."""
    lo = 0
    hi = m
    while lo < hi:
        mid = (lo + hi) >> 1
        if live[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _nn_chain_inplace(D, n, method, Z):  # pragma: no cover - compiled
    """scipy's ``nn_chain`` (average/complete/weighted) working on ``D`` in place.

    Identical arithmetic and comparison order to scipy. The only changes are in how the loops
    over "clusters still alive" are run: over a sorted array ``live[:m]`` of the live indices
    (exactly the indices, in the same ascending order, that scipy's
    ``for i in range(n): if size[i] == 0: continue`` visits), split at ``x`` / ``y`` so the
    condensed index needs no branch. A dense array rather than a linked list keeps the loads of
    ``D`` independent of each other, so the CPU can overlap their cache misses.
    """
    size = np.ones(n, dtype=np.int64)
    live = np.arange(n).astype(np.int32)
    m = n
    chain = np.empty(n, dtype=np.int64)
    chain_length = 0
    y = 0
    for k in range(n - 1):
        if chain_length == 0:
            chain_length = 1
            chain[0] = live[0]
        while True:
            x = chain[chain_length - 1]
            if chain_length > 1:
                y = chain[chain_length - 2]
                if x < y:
                    current_min = D[_row_base(n, x) + y]
                else:
                    current_min = D[_row_base(n, y) + x]
            else:
                current_min = np.inf
            px = _live_position(live, m, x)
            for t in range(px):
                i = np.int64(live[t])
                dist = D[_row_base(n, i) + x]
                if dist < current_min:
                    current_min = dist
                    y = i
            base_x = _row_base(n, x)
            for t in range(px + 1, m):
                i = np.int64(live[t])
                dist = D[base_x + i]
                if dist < current_min:
                    current_min = dist
                    y = i
            if chain_length > 1 and y == chain[chain_length - 2]:
                break
            chain[chain_length] = y
            chain_length += 1

        chain_length -= 2
        if x > y:
            x, y = y, x
        nx = size[x]
        ny = size[y]
        Z[k, 0] = x
        Z[k, 1] = y
        Z[k, 2] = current_min
        Z[k, 3] = nx + ny
        size[x] = 0  # cluster x is dropped, y becomes the merged cluster
        size[y] = nx + ny
        px = _live_position(live, m, x)
        for t in range(px, m - 1):
            live[t] = live[t + 1]
        m -= 1
        py = _live_position(live, m, y)

        # D[(i, y)] = update(D[(i, x)], D[(i, y)]) for every live i != y (x < y)
        base_x = _row_base(n, x)
        base_y = _row_base(n, y)
        t = 0
        while t < px:  # i < x
            i = np.int64(live[t])
            base_i = _row_base(n, i)
            D[base_i + y] = _update(D[base_i + x], D[base_i + y], nx, ny, method)
            t += 1
        while t < py:  # x < i < y
            i = np.int64(live[t])
            base_i = _row_base(n, i)
            D[base_i + y] = _update(D[base_x + i], D[base_i + y], nx, ny, method)
            t += 1
        for t in range(py + 1, m):  # i > y
            i = np.int64(live[t])
            D[base_y + i] = _update(D[base_x + i], D[base_y + i], nx, ny, method)


@numba.njit(cache=True, nogil=True)
def _mst_single(D, n, Z):  # pragma: no cover - compiled
    """scipy's ``mst_single_linkage``; reads ``D`` only."""
    dmin = np.full(n, np.inf)
    succ = np.arange(1, n + 1, dtype=np.int64)
    pred = np.arange(-1, n - 1, dtype=np.int64)
    start = 0
    x = 0
    y = 0
    for k in range(n - 1):
        current_min = np.inf
        # merged[x] = 1: unlink x
        if pred[x] >= 0:
            succ[pred[x]] = succ[x]
        else:
            start = succ[x]
        if succ[x] < n:
            pred[succ[x]] = pred[x]
        i = start
        while i < n:
            if i < x:
                dist = D[_row_base(n, i) + x]
            else:
                dist = D[_row_base(n, x) + i]
            if dmin[i] > dist:
                dmin[i] = dist
            if dmin[i] < current_min:
                y = i
                current_min = dmin[i]
            i = succ[i]
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
    """scipy's ``label``: relabel a height-sorted merge list into a linkage matrix."""
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


def linkage_matrix(condensed: np.ndarray, method: str = "average") -> np.ndarray:
    """scipy-format linkage matrix ``Z`` ((N−1) × 4) of a condensed float64 distance vector.

    Equals ``scipy.cluster.hierarchy.linkage(condensed, method)`` bit for bit (see the module
    docstring). For ``average``, ``complete`` and ``weighted`` the vector is **overwritten**
    (used as the NN-chain's working matrix); ``single`` only reads it.
    """
    if method not in LINKAGE_METHODS:
        raise ValueError(
            f"unknown linkage method {method!r}; expected one of {sorted(LINKAGE_METHODS)}"
        )
    if condensed.ndim != 1 or condensed.dtype != np.float64:
        raise ValueError(
            f"condensed must be a 1-D float64 array; got dtype {condensed.dtype}, "
            f"shape {condensed.shape}"
        )
    if not condensed.flags.c_contiguous or (method != "single" and not condensed.flags.writeable):
        raise ValueError("condensed must be C-contiguous (and writeable except for 'single')")
    m = condensed.shape[0]
    n = int(math.ceil(math.sqrt(2 * m)))
    if n * (n - 1) // 2 != m:
        raise ValueError(f"length {m} of condensed is not N(N-1)/2 for any integer N")
    n = max(n, 1)
    Z = np.empty((n - 1, 4), dtype=np.float64)
    if n < 2:
        return Z
    code = LINKAGE_METHODS[method]
    if code == 0:
        _mst_single(condensed, n, Z)
    else:
        _nn_chain_inplace(condensed, n, code, Z)
    Z = Z[np.argsort(Z[:, 2], kind="mergesort")]
    _label(Z, n)
    return Z


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def _check_square(corr, name: str):
    if not hasattr(corr, "ndim") or not hasattr(corr, "dtype"):
        corr = np.asarray(corr)
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"{name} must be a square 2-D array (N × N); got shape {corr.shape}")
    if not np.issubdtype(corr.dtype, np.floating):
        raise ValueError(
            f"{name} must have a floating dtype (float32 per SPEC §3); got {corr.dtype}"
        )
    return corr


def _canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber labels ``0..K−1`` by first appearance in column order (SPEC §5)."""
    uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(uniq.shape[0], dtype=np.int32)
    rank[np.argsort(first, kind="stable")] = np.arange(uniq.shape[0], dtype=np.int32)
    return rank[inverse.reshape(-1)]


def hierarchical_clusters(
    corr: np.ndarray,
    *,
    method: str = "average",
    distance_threshold: float | None = None,
    n_clusters: int | None = None,
    working_memory_mb: float = 256,
    work: np.ndarray | None = None,
) -> np.ndarray:
    """Flat clusters of the symbols from agglomerative linkage on Mantegna distances (SPEC §5).

    ``d[i, j] = sqrt(2·(1 − corr[i, j]))`` in float64 (NaN corr → 0, i.e. ``d = sqrt(2)``; a
    negative argument from rounding clipped to 0), linkage ``method`` in ``single``,
    ``complete``, ``average`` (default), ``weighted`` — identical to
    ``scipy.cluster.hierarchy.linkage(condensed, method)`` — then cut exactly as
    ``fcluster(Z, distance_threshold, criterion="distance")`` (clusters whose cophenetic
    distance is ``<= distance_threshold``) or ``fcluster(Z, n_clusters, criterion="maxclust")``
    (the lowest cut giving at most ``n_clusters`` clusters; fewer when merge heights tie).

    Parameters
    ----------
    corr : (N, N) floating array, typically float32 and possibly a read-only ``np.memmap``.
        Only its upper triangle is read, ``working_memory_mb`` worth of rows at a time.
    method : linkage method; anything else raises ``ValueError``.
    distance_threshold, n_clusters : exactly one must be given.
    work : optional float64 buffer of length ``N(N−1)/2`` (e.g. a ``np.memmap``) used for the
        condensed distances instead of a fresh allocation; overwritten.

    Returns
    -------
    labels : int32 (N,), ``0..K−1`` numbered by first appearance in column order.
    """
    corr = _check_square(corr, "corr")
    if method not in LINKAGE_METHODS:
        raise ValueError(
            f"unknown linkage method {method!r}; expected one of {sorted(LINKAGE_METHODS)}"
        )
    if (distance_threshold is None) == (n_clusters is None):
        raise ValueError("give exactly one of distance_threshold and n_clusters")
    if distance_threshold is not None:
        if isinstance(distance_threshold, bool) or not np.isfinite(float(distance_threshold)):
            raise ValueError(
                f"distance_threshold must be a finite number; got {distance_threshold!r}"
            )
        t, criterion = float(distance_threshold), "distance"
    else:
        if isinstance(n_clusters, bool) or int(n_clusters) != n_clusters or n_clusters < 1:
            raise ValueError(f"n_clusters must be an integer >= 1; got {n_clusters!r}")
        t, criterion = int(n_clusters), "maxclust"
    if working_memory_mb <= 0:
        raise ValueError(f"working_memory_mb must be > 0; got {working_memory_mb!r}")

    n = corr.shape[0]
    if n <= 1:
        return np.zeros(n, dtype=np.int32)
    condensed = condensed_distances(corr, working_memory_mb=working_memory_mb, out=work)
    Z = linkage_matrix(condensed, method)
    del condensed
    return _canonical_labels(fcluster(Z, t, criterion=criterion))
