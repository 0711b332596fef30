"""Block-wise reductions of a snapshot for its pictures: small arrays, computed within a budget.

``corr`` is the N x N float32 correlation matrix (SPEC §3), possibly a read-only ``np.memmap``
(2.3 GB at N = 24,000). It is only ever read in blocks of whole rows whose height comes from
:mod:`corr_pipeline.compute.tiling` (``working_memory_mb``, default
:data:`~corr_pipeline.compute.tiling.DEFAULT_WORKING_MEMORY_MB`), so no N x N temporary exists.

``cluster_order(labels)``
    A permutation that puts each cluster (SPEC §5) in one contiguous run, largest first.
``heatmap_grid(corr, order)`` -> :class:`HeatmapGrid`
    ``corr`` reordered by ``order`` and block-averaged to ``P = min(N, max_pixels)`` pixels per
    side: pixel ``(a, b)`` is the mean of the finite ``corr[order[p], order[q]]`` over the
    positions ``p`` in row bin ``a`` and ``q`` in column bin ``b``
    (``edges = round(linspace(0, N, P + 1))``); NaN where none is finite. Read in chunks of whole
    pixel rows, ``c = block_rows_for(18·N, working_memory_mb, N)`` rows per chunk: the rows
    (``4·c·N`` bytes), their finite mask and its int32 widening (``5·c·N``) and the per-pixel-row
    sums (``<= 8·c·N``); plus the ``P x P`` float64 sums and counts (4 MiB at P = 512). Rows are
    gathered through the ordering chunk by chunk and columns are never permuted (``np.bincount``
    over each column's pixel index): never ``corr[order][:, order]``.
``correlation_histogram(corr)`` -> :class:`CorrelationHistogram`
    Counts of the off-diagonal ``corr[i, j], i < j`` on fixed bins over ``[-1, 1]`` (NaN counted
    apart), with float64 sums for the mean and standard deviation; above ``max_values`` pairs a
    deterministic sample of evenly spaced whole rows. The values are read in blocks of
    ``c = block_rows_for(4·N, working_memory_mb, ·)`` rows (``4·c·N`` bytes, a view for contiguous
    rows of an array or memory map, a copy for sampled rows) and reduced in a stream of fixed
    chunks of 262,144 values (about 4 MiB of float64 and histogram temporaries).
``normalize_pairs(pairs, symbols)``
    Lead-lag pairs (SPEC §6) as named dicts, strongest improvement first; O(pairs).

Results do not depend on the budget: the histogram's counts and sums come from the same
262,144-value chunks of the same value stream whatever the block height; the heatmap sums each
pixel row in one piece whenever a chunk holds a whole pixel row (``c >= ceil(N / P)``), otherwise
(a budget below one pixel row) the pieces of a pixel row are summed apart in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, block_rows_for, row_blocks

__all__ = [
    "CorrelationHistogram",
    "HeatmapGrid",
    "cluster_order",
    "correlation_histogram",
    "heatmap_grid",
    "normalize_pairs",
]

HISTOGRAM_CHUNK = 1 << 18
"""Values per ``np.histogram`` call and float64 sum: the fixed chunks of the histogram's value
stream (2 MiB of float64)."""


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------


def check_corr(corr: Any) -> np.ndarray:
    """``corr`` itself if it is a square floating-point numpy array (or memmap), else raise."""
    if not isinstance(corr, np.ndarray):
        raise TypeError(f"corr must be a numpy array or memmap, got {type(corr).__name__}")
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"corr must be a square N x N matrix, got shape {corr.shape}")
    if corr.dtype.kind != "f":
        raise ValueError(f"corr must be floating point (float32 per SPEC §3), got {corr.dtype}")
    return corr


def check_order(order: Any, n: int) -> np.ndarray:
    """``order`` as int64 if it is a permutation of ``0..n-1``, else raise."""
    order = np.asarray(order)
    if order.ndim != 1 or order.size != n or order.dtype.kind not in "iu":
        raise ValueError(f"order must be a permutation of 0..{n - 1} (integer array of length {n})")
    order = order.astype(np.int64, copy=False)
    if n and (order.min() < 0 or order.max() >= n or np.bincount(order, minlength=n).max() != 1):
        raise ValueError(f"order must be a permutation of 0..{n - 1} (each index exactly once)")
    return order


# --------------------------------------------------------------------------------------------
# ordering
# --------------------------------------------------------------------------------------------


def cluster_order(labels: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order the symbols so that each cluster is one contiguous run.

    Clusters are placed largest first (ties: smaller label first); inside a cluster the
    symbols keep their column order. Returns ``(order, starts)``: ``order`` (int64, length N)
    lists column indices, ``starts`` (int64, length K + 1) the position where each placed
    cluster begins, ending with N.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    uniq, inverse, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    # rank clusters: size descending, then label ascending (np.unique sorted the labels)
    cluster_rank = np.empty(uniq.size, dtype=np.int64)
    cluster_rank[np.lexsort((np.arange(uniq.size), -sizes))] = np.arange(uniq.size)
    order = np.argsort(cluster_rank[inverse.reshape(-1)], kind="stable").astype(np.int64)
    placed_sizes = sizes[np.argsort(cluster_rank)]
    starts = np.concatenate([[0], np.cumsum(placed_sizes)]).astype(np.int64)
    return order, starts


# --------------------------------------------------------------------------------------------
# heatmap
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeatmapGrid:
    """Block-averaged, reordered correlation matrix (see :func:`heatmap_grid`).

    ``values[a, b]`` = mean of the finite ``corr[order[p], order[q]]`` for ``edges[a] <= p <
    edges[a+1]`` and ``edges[b] <= q < edges[b+1]``; NaN where none is finite. ``counts`` holds
    how many finite values each pixel averages.
    """

    values: np.ndarray  # float32 (P, P)
    counts: np.ndarray  # int64 (P, P)
    edges: np.ndarray  # int64 (P + 1,), bin boundaries over positions 0..N
    order: np.ndarray  # int64 (N,)

    @property
    def n(self) -> int:
        return int(self.edges[-1])

    @property
    def pixels(self) -> int:
        return int(self.values.shape[0])


def heatmap_grid(
    corr: np.ndarray,
    order: Sequence[int] | np.ndarray | None = None,
    *,
    max_pixels: int = 512,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> HeatmapGrid:
    """Reorder ``corr`` by ``order`` and block-average it to ``P = min(N, max_pixels)`` pixels.

    Bins: ``edges = round(linspace(0, N, P + 1))`` over positions of the ordered index, so every
    bin holds ``floor(N/P)`` or ``ceil(N/P)`` positions; ``order=None`` keeps the column order.

    Method (no column permutation of the data, no N x N temporary): ``corr`` is read in chunks of
    whole row bins, at most ``c = block_rows_for(18·N, working_memory_mb, N)`` rows at a time
    (a bin larger than ``c`` rows is split), each bin's rows fetched in increasing index order.
    NaN entries are zeroed and counted; the rows of each bin are summed (float32, at most
    ``ceil(N/P)`` rows) into one length-N row, which ``np.bincount`` over the columns' pixel
    index (``colbin[order[q]] = bin of position q``) reduces to P float64 sums and counts. Memory
    per chunk: the rows (``4·c·N`` bytes), the finite mask and its int32 widening (``5·c·N``),
    the per-bin sums and counts (``<= 8·c·N``); plus ``16·P²`` for the accumulators.
    """
    corr = check_corr(corr)
    n = corr.shape[0]
    if int(max_pixels) < 1:
        raise ValueError(f"max_pixels must be >= 1, got {max_pixels!r}")
    order_arr = np.arange(n, dtype=np.int64) if order is None else check_order(order, n)
    p = min(n, int(max_pixels))
    edges = np.rint(np.linspace(0, n, p + 1)).astype(np.int64)
    sums = np.zeros((p, p), dtype=np.float64)
    counts = np.zeros((p, p), dtype=np.float64)  # exact integers (< 2^53)
    if n == 0:
        return HeatmapGrid(sums.astype(np.float32), counts.astype(np.int64), edges, order_arr)
    # pixel column of each original column: the bin of its position in the ordering
    column_bin = np.empty(n, dtype=np.int64)
    column_bin[order_arr] = np.repeat(np.arange(p, dtype=np.int64), np.diff(edges))
    rows_per_chunk = block_rows_for(18 * n, working_memory_mb, n)

    # pieces: (bin, first position, end position), a bin split only if it exceeds the budget
    pieces = [
        (a, start, min(int(edges[a + 1]), start + rows_per_chunk))
        for a in range(p)
        for start in range(int(edges[a]), int(edges[a + 1]), rows_per_chunk)
    ]

    def flush(chunk: list[tuple[int, int, int]]) -> None:
        rows = np.concatenate([np.sort(order_arr[lo:hi]) for _, lo, hi in chunk])
        starts = np.cumsum([0] + [hi - lo for _, lo, hi in chunk[:-1]])
        block = np.asarray(corr[rows])  # c x N copy of the chunk's rows
        finite = np.isfinite(block)
        np.copyto(block, 0, where=~finite)
        bin_sums = np.add.reduceat(block, starts, axis=0)  # one summed row per piece
        del block
        bin_counts = np.add.reduceat(finite.view(np.uint8), starts, axis=0, dtype=np.int32)
        del finite
        for k, (a, _, _) in enumerate(chunk):
            sums[a] += np.bincount(column_bin, weights=bin_sums[k], minlength=p)
            counts[a] += np.bincount(column_bin, weights=bin_counts[k], minlength=p)

    chunk: list[tuple[int, int, int]] = []
    in_chunk = 0
    for piece in pieces:
        size = piece[2] - piece[1]
        if chunk and in_chunk + size > rows_per_chunk:
            flush(chunk)
            chunk, in_chunk = [], 0
        chunk.append(piece)
        in_chunk += size
    if chunk:
        flush(chunk)
    empty = counts == 0
    np.divide(sums, counts, out=sums, where=~empty)
    sums[empty] = np.nan
    return HeatmapGrid(
        values=sums.astype(np.float32), counts=counts.astype(np.int64), edges=edges, order=order_arr
    )


# --------------------------------------------------------------------------------------------
# histogram
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorrelationHistogram:
    """Histogram of off-diagonal correlations (see :func:`correlation_histogram`).

    ``counts[b]`` counts the finite values in ``[edges[b], edges[b+1])`` (the last bin also
    holds 1.0). ``n_pairs`` values were examined, ``n_nan`` of them NaN; ``n_out_of_range``
    finite values fell outside ``[-1, 1]`` (a SPEC §3 violation, normally 0). ``sampled``: only
    ``rows_used`` evenly spaced rows were scanned (their full rows minus the diagonal), not
    every pair.
    """

    edges: np.ndarray
    counts: np.ndarray
    n_pairs: int
    n_nan: int
    n_out_of_range: int
    sampled: bool
    rows_used: int
    value_sum: float
    value_sq_sum: float

    @property
    def n_finite(self) -> int:
        return self.n_pairs - self.n_nan

    @property
    def mean(self) -> float:
        return self.value_sum / self.n_finite if self.n_finite else math.nan

    @property
    def std(self) -> float:
        if self.n_finite < 2:
            return math.nan
        var = self.value_sq_sum / self.n_finite - self.mean**2
        return math.sqrt(max(var, 0.0))

    @property
    def nan_share(self) -> float:
        return self.n_nan / self.n_pairs if self.n_pairs else math.nan

    def quantile(self, q: float) -> float:
        """Approximate quantile of the finite values (linear inside the histogram bin)."""
        total = int(self.counts.sum())
        if total == 0:
            return math.nan
        target = q * total
        cum = np.cumsum(self.counts)
        b = int(np.searchsorted(cum, target, side="left"))
        b = min(b, len(self.counts) - 1)
        before = cum[b - 1] if b else 0
        inside = self.counts[b]
        frac = (target - before) / inside if inside else 0.0
        return float(self.edges[b] + frac * (self.edges[b + 1] - self.edges[b]))


class _FixedChunks:
    """Regroups a stream of 1-D pieces into consecutive chunks of exactly ``size`` values (the
    last one shorter) for ``consume``, whatever the pieces' lengths: the chunk boundaries depend
    only on the position in the stream. At most ``size`` pending values are held."""

    def __init__(self, size: int, consume: Callable[[np.ndarray], None]) -> None:
        self.size = size
        self.consume = consume
        self.parts: list[np.ndarray] = []
        self.filled = 0

    def feed(self, values: np.ndarray) -> None:
        while values.size:
            take = min(self.size - self.filled, values.size)
            self.parts.append(values[:take])
            self.filled += take
            values = values[take:]
            if self.filled == self.size:
                self.flush()

    def detach(self) -> None:
        """Copy the pending values, so they no longer keep the block they came from alive."""
        if len(self.parts) > 0:
            self.parts = [np.concatenate(self.parts)]

    def flush(self) -> None:
        if self.filled:
            chunk = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
            self.parts, self.filled = [], 0
            self.consume(chunk)


def correlation_histogram(
    corr: np.ndarray,
    *,
    bins: int = 200,
    max_values: int | None = 20_000_000,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> CorrelationHistogram:
    """Histogram of ``corr[i, j]`` for ``i < j`` over ``bins`` equal bins on ``[-1, 1]``.

    Exact over all ``N(N−1)/2`` pairs when that is ``<= max_values`` (or ``max_values`` is
    None): the value stream is each row's ``corr[i, i+1:]`` in row order. Otherwise
    ``m = max(1, max_values // (N − 1))`` rows at ``round(linspace(0, N − 1, m))``
    (deterministic) each contribute their ``N − 1`` off-diagonal values, in row order. The
    stream is cut into fixed chunks of :data:`HISTOGRAM_CHUNK` values; each chunk is counted
    with ``np.histogram`` and its finite values summed (and their squares, by a dot product) in
    float64, chunk sums added in stream order — so the result does not depend on the block
    height. Rows are read ``c = block_rows_for(4·N, working_memory_mb, ·)`` at a time.
    """
    corr = check_corr(corr)
    n = corr.shape[0]
    if int(bins) < 1:
        raise ValueError(f"bins must be >= 1, got {bins!r}")
    edges = np.linspace(-1.0, 1.0, int(bins) + 1)
    counts = np.zeros(int(bins), dtype=np.int64)
    acc = {"pairs": 0, "nan": 0, "out": 0, "sum": 0.0, "sq": 0.0}

    def add(chunk: np.ndarray) -> None:
        acc["pairs"] += chunk.size
        finite = np.isfinite(chunk)
        n_finite = int(np.count_nonzero(finite))
        acc["nan"] += chunk.size - n_finite
        h, _ = np.histogram(chunk, bins=int(bins), range=(-1.0, 1.0))
        counts[:] += h
        acc["out"] += n_finite - int(h.sum())
        if n_finite:
            vals = (chunk[finite] if n_finite < chunk.size else chunk).astype(np.float64)
            acc["sum"] += float(vals.sum())
            acc["sq"] += float(vals @ vals)

    stream = _FixedChunks(HISTOGRAM_CHUNK, add)
    total_pairs = n * (n - 1) // 2
    sampled = max_values is not None and total_pairs > int(max_values)
    if not sampled:
        rows = np.arange(n, dtype=np.int64)
    else:
        assert max_values is not None  # sampled implies a limit
        m = max(1, int(max_values) // max(n - 1, 1))
        rows = np.unique(np.rint(np.linspace(0, n - 1, min(m, n))).astype(np.int64))
    for b0, b1 in row_blocks(rows.size, 4 * n, working_memory_mb):
        if sampled:
            block = np.asarray(corr[rows[b0:b1]])  # copy of the sampled rows
        else:
            block = np.asarray(corr[b0:b1])  # contiguous rows: a view
        for k, i in enumerate(rows[b0:b1].tolist()):
            if sampled:
                stream.feed(block[k, :i])
            stream.feed(block[k, i + 1 :])
        stream.detach()
        del block
    stream.flush()
    return CorrelationHistogram(
        edges=edges,
        counts=counts,
        n_pairs=int(acc["pairs"]),
        n_nan=int(acc["nan"]),
        n_out_of_range=int(acc["out"]),
        sampled=bool(sampled),
        rows_used=int(rows.size),
        value_sum=float(acc["sum"]),
        value_sq_sum=float(acc["sq"]),
    )


# --------------------------------------------------------------------------------------------
# lead-lag pairs
# --------------------------------------------------------------------------------------------

_PAIR_FIELDS: tuple[str, ...] = LEAD_LAG_DTYPE.names or ()
_FLOAT_FIELDS = (
    "lagged_corr",
    "sync_corr",
    "improvement",
    "p_value",
    "q_value",
    "reverse_lagged_corr",
    "reverse_q_value",
)


def normalize_pairs(
    pairs: Any, symbols: Sequence[str] | None = None, *, top: int | None = None
) -> list[dict[str, Any]]:
    """Lead-lag pairs as dicts of the fields of
    :data:`~corr_pipeline.compute.lead_lag.LEAD_LAG_DTYPE` the input has (``leader``,
    ``lagger``, ``lag``, ``lagged_corr``, ``sync_corr``, ``improvement``, ``overlap``,
    ``p_value``, ``q_value`` and the reverse direction ``reverse_lag``, ``reverse_lagged_corr``,
    ``reverse_q_value``; numbers as Python ``int``/``float``, None kept) with leader/lagger as
    symbol names, sorted by improvement descending (then leader, lagger; a missing or non-finite
    improvement last), at most ``top`` of them.

    ``pairs``: the structured array of :func:`corr_pipeline.compute.find_lead_lag_pairs`
    (leader/lagger are column indices, translated through ``symbols``), a mapping of columns,
    or an iterable of mappings / rows with those fields (names or indices).
    """
    rows: list[dict[str, Any]] = []
    if isinstance(pairs, np.ndarray) and pairs.dtype.names:
        names = pairs.dtype.names
        cols = {f: pairs[f] for f in _PAIR_FIELDS if f in names}
        length = pairs.shape[0]
        rows = [{f: cols[f][i].item() for f in cols} for i in range(length)]
    elif isinstance(pairs, Mapping):
        cols = {f: np.asarray(pairs[f]) for f in _PAIR_FIELDS if f in pairs}
        length = len(next(iter(cols.values()))) if cols else 0
        rows = [{f: cols[f][i].item() for f in cols} for i in range(length)]
    else:
        for row in pairs:
            if isinstance(row, Mapping):
                rows.append({f: row[f] for f in _PAIR_FIELDS if f in row})
            elif hasattr(row, "_mapping"):  # SQLAlchemy Row
                m = row._mapping
                rows.append({f: m[f] for f in _PAIR_FIELDS if f in m})
            else:
                rows.append(dict(zip(_PAIR_FIELDS, row, strict=False)))
    for r in rows:
        for key in ("leader", "lagger"):
            if key not in r:
                raise ValueError(f"lead-lag pairs need a {key!r} field")
            value = r[key]
            if isinstance(value, int | np.integer) and not isinstance(value, bool):
                if symbols is None:
                    raise ValueError("pairs hold column indices: pass symbols to name them")
                r[key] = str(symbols[int(value)])
            else:
                r[key] = str(value)
        for key in _FLOAT_FIELDS:
            if key in r and r[key] is not None:
                r[key] = float(r[key])
        for key in ("lag", "overlap", "reverse_lag"):
            if key in r and r[key] is not None:
                r[key] = int(r[key])
    rows.sort(key=lambda r: (-finite_or(r.get("improvement"), -math.inf), r["leader"], r["lagger"]))
    return rows if top is None else rows[: max(0, int(top))]


def finite_or(value: Any, default: float) -> float:
    """``float(value)`` if it is a finite number, else ``default`` (also for None)."""
    if value is None:
        return default
    value = float(value)
    return value if math.isfinite(value) else default
