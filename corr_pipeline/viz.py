"""Pictures of a snapshot for the Dagster UI: PNG bytes, computed within a memory budget.

Three pictures, each a pure function of arrays (no database, no paths), returning PNG bytes:

``clustered_heatmap_png(corr, labels=..., order=...)``
    The correlation matrix (SPEC §3) with rows and columns reordered so that the clusters
    (SPEC §5) sit in diagonal blocks, **block-averaged** down to at most ``max_pixels`` per side:
    pixel ``(a, b)`` is the mean of the finite ``corr[order[p], order[q]]`` over the positions
    ``p`` in row bin ``a`` and ``q`` in column bin ``b`` (bins split ``0..N`` as evenly as
    possible; NaN correlations are left out of the mean, a pixel with no finite value is blank).
``correlation_histogram_png(corr)``
    The distribution of the off-diagonal correlations ``corr[i, j], i < j`` (each unordered pair
    once), accumulated block by block with ``np.histogram`` on fixed bins over ``[-1, 1]``;
    NaN pairs are counted and reported, not binned. Above ``max_values`` pairs a deterministic
    sample of evenly spaced whole rows is used instead (stated on the picture).
``lead_lag_network_png(pairs, symbols)``
    The ``top`` lead-lag pairs (SPEC §6) by improvement as a directed bipartite graph: leaders
    on the left, laggers on the right, an arrow leader → lagger labelled with the lag in days and
    the lagged correlation, red for a positive lagged correlation, blue for a negative one,
    thicker for a larger improvement.

Memory. ``corr`` may be a read-only ``np.memmap`` of N × N float32 (2.3 GB at N = 24,000); it
is only ever read in blocks of whole rows sized from ``working_memory_mb``, so no N × N
temporary (nor any ``N × N`` image) exists:

* heatmap: per chunk of ``c = working_memory_mb·2^20 / (18·N)`` rows (whole pixel rows of the
  ordering, each read in increasing index order) the rows (``4·c·N`` bytes), their finite mask
  and its int32 widening (``5·c·N``) and the per-pixel-row sums (``<= 8·c·N``); plus the
  ``P × P`` float64 sums and counts (``P = max_pixels``: 4 MiB at 512). Rows are gathered
  through the ordering *chunk by chunk* and columns are never permuted (``np.bincount`` over
  each column's pixel index) — never ``corr[order][:, order]``, which would copy N × N twice.
* histogram: per block of ``c = working_memory_mb·2^20 / (8·N)`` contiguous rows the block
  (``c·N·4`` bytes) and one flattened copy of its upper part (``<= c·N·4``), then chunks of
  262,144 values (float64 sums, ``np.histogram``): about ``8·c·N`` bytes + 4 MiB.
* network: O(top).

Images are rendered with matplotlib's Agg canvas (no pyplot, no display, thread-safe per
figure), reduced to a 256-colour palette with Pillow and kept under ``max_bytes`` (default
200 kB) by lowering the resolution if needed.

Embedding in Dagster. The UI renders ``MetadataValue.md`` with images allowed from ``data:``
URIs (the ``dagster-webserver`` markdown sanitizer adds ``data`` to the allowed ``src``
protocols), so :func:`png_markdown` / :func:`png_metadata` produce
``![alt](data:image/png;base64,...)``. The ``*_metadata`` helpers return ready-made metadata
dicts for the assets.
"""

from __future__ import annotations

import base64
import io
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MAX_PNG_BYTES",
    "CorrelationHistogram",
    "HeatmapGrid",
    "cluster_order",
    "clustered_heatmap_png",
    "correlation_histogram",
    "correlation_histogram_png",
    "heatmap_grid",
    "heatmap_metadata",
    "histogram_metadata",
    "lead_lag_markdown_table",
    "lead_lag_metadata",
    "lead_lag_network_png",
    "normalize_pairs",
    "png_data_uri",
    "png_markdown",
    "png_metadata",
]

DEFAULT_MAX_PNG_BYTES = 200_000
"""Upper bound on each picture's PNG size (it travels base64-encoded in run metadata)."""

DEFAULT_WORKING_MEMORY_MB = 64.0
"""Budget for the row-block temporaries when reading ``corr`` (see the module docstring)."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_HISTOGRAM_CHUNK = 1 << 18  # values per np.histogram call / float64 conversion (2 MiB)


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------


def _check_corr(corr: Any) -> np.ndarray:
    if not isinstance(corr, np.ndarray):
        raise TypeError(f"corr must be a numpy array or memmap, got {type(corr).__name__}")
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"corr must be a square N x N matrix, got shape {corr.shape}")
    if corr.dtype.kind != "f":
        raise ValueError(f"corr must be floating point (float32 per SPEC §3), got {corr.dtype}")
    return corr


def _rows_per_block(bytes_per_element: float, n: int, working_memory_mb: float) -> int:
    if not (working_memory_mb > 0):
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb!r}")
    rows = int(working_memory_mb * 2**20 / (bytes_per_element * max(n, 1)))
    return max(1, min(n, rows))


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


def _check_order(order: Any, n: int) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 1 or order.size != n or order.dtype.kind not in "iu":
        raise ValueError(f"order must be a permutation of 0..{n - 1} (integer array of length {n})")
    order = order.astype(np.int64, copy=False)
    if n and (order.min() < 0 or order.max() >= n or np.bincount(order, minlength=n).max() != 1):
        raise ValueError(f"order must be a permutation of 0..{n - 1} (each index exactly once)")
    return order


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
    whole row bins, at most ``c = working_memory_mb·2^20 / (18·N)`` rows at a time, each bin's
    rows fetched in increasing index order (a sum does not depend on the order within a bin).
    NaN entries are zeroed and counted; the rows of each bin are summed (float32, at most
    ``ceil(N/P)`` rows) into one length-N row, which ``np.bincount`` over the columns' pixel
    index (``colbin[order[q]] = bin of position q``) reduces to P float64 sums and counts. Memory
    per chunk: the rows (``4·c·N`` bytes), the finite mask and its int32 widening (``5·c·N``),
    the per-bin sums and counts (``<= 8·c·N``); plus ``16·P²`` for the accumulators.
    """
    corr = _check_corr(corr)
    n = corr.shape[0]
    if int(max_pixels) < 1:
        raise ValueError(f"max_pixels must be >= 1, got {max_pixels!r}")
    order_arr = np.arange(n, dtype=np.int64) if order is None else _check_order(order, n)
    p = min(n, int(max_pixels))
    edges = np.rint(np.linspace(0, n, p + 1)).astype(np.int64)
    sums = np.zeros((p, p), dtype=np.float64)
    counts = np.zeros((p, p), dtype=np.float64)  # exact integers (< 2^53)
    if n == 0:
        return HeatmapGrid(sums.astype(np.float32), counts.astype(np.int64), edges, order_arr)
    # pixel column of each original column: the bin of its position in the ordering
    column_bin = np.empty(n, dtype=np.int64)
    column_bin[order_arr] = np.repeat(np.arange(p, dtype=np.int64), np.diff(edges))
    rows_per_chunk = _rows_per_block(18.0, n, working_memory_mb)

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


def clustered_heatmap_png(
    corr: np.ndarray,
    labels: Sequence[int] | np.ndarray | None = None,
    *,
    order: Sequence[int] | np.ndarray | None = None,
    symbols: Sequence[str] | None = None,
    max_pixels: int = 512,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    title: str | None = None,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the correlation matrix ordered by cluster, block-averaged (module docstring).

    Give ``labels`` (cluster id per column, SPEC §5: clusters become diagonal blocks, largest
    first, outlined when at least two pixels wide) and/or an explicit ``order`` (e.g. the
    dendrogram's leaf order; it takes precedence for the ordering). ``symbols`` label the axes
    when N <= 40. Memory: see :func:`heatmap_grid`.
    """
    corr = _check_corr(corr)
    n = corr.shape[0]
    starts: np.ndarray | None = None
    if labels is not None:
        labels_arr = np.asarray(labels)
        if labels_arr.shape != (n,):
            raise ValueError(f"labels must have length N = {n}, got shape {labels_arr.shape}")
        label_order, starts = cluster_order(labels_arr)
        if order is None:
            order = label_order
        else:
            starts = _runs_of(labels_arr[_check_order(order, n)])
    if symbols is not None and len(symbols) != n:
        raise ValueError(f"symbols must have length N = {n}, got {len(symbols)}")
    grid = heatmap_grid(corr, order, max_pixels=max_pixels, working_memory_mb=working_memory_mb)
    n_clusters = None if starts is None else len(starts) - 1

    fig, ax = _new_figure(6.4, 5.4)
    # The pixels are painted into the rendered canvas at the axes' exact size in device pixels
    # (_heatmap_painter): imshow would resample through float64 RGBA buffers (~25 MiB at 512²).
    ax.set_xlim(0, grid.pixels)
    ax.set_ylim(grid.pixels, 0)
    ax.set_aspect("equal")
    ax.set_facecolor("none")
    cmap = _colormap("RdBu_r")
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig.colorbar(
        ScalarMappable(norm=Normalize(-1.0, 1.0), cmap=cmap),
        ax=ax,
        fraction=0.046,
        pad=0.03,
        label="correlation",
    )
    pixels_rgba = _colour_pixels(grid.values, cmap)
    if symbols is not None and 0 < n <= 40:
        ticks = np.arange(n) + 0.5
        names = [str(symbols[i]) for i in grid.order]
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        _safe_tick_labels(ax.set_xticklabels(names, rotation=90, fontsize=7))
        _safe_tick_labels(ax.set_yticklabels(names, fontsize=7))
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    per_pixel = n / grid.pixels if grid.pixels else 0
    head = title or (
        f"Correlation, {n:,} symbols"
        + (f", {n_clusters:,} clusters" if n_clusters is not None else "")
    )
    sub = (
        f"ordered by cluster (largest first); one pixel = mean of ~{per_pixel:.0f} x "
        f"{per_pixel:.0f} correlations"
        if per_pixel > 1.0001
        else ("ordered by cluster (largest first)" if starts is not None else "")
    )
    _set_title(ax, head, sub)
    return _figure_png(fig, max_bytes=max_bytes, paint=_heatmap_painter(ax, pixels_rgba, n, starts))


def _colour_pixels(values: np.ndarray, cmap: Any) -> np.ndarray:
    """RGBA uint8 pixels of ``values`` in [-1, 1] through the colormap's 256-entry table
    (NaN -> white); O(P²) bytes, no float64 RGBA intermediate."""
    lut = cmap(np.linspace(0.0, 1.0, 256), bytes=True)  # (256, 4) uint8
    finite = np.isfinite(values)
    scaled = np.where(finite, (values + 1.0) * 128.0, 0.0)
    index = np.clip(scaled, 0, 255).astype(np.uint8)
    pixels = lut[index]
    pixels[~finite] = (255, 255, 255, 255)
    return pixels


def _colormap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]


def _heatmap_painter(
    ax: Any, rgba: np.ndarray, n: int, starts: np.ndarray | None, limit: int = 60
) -> Any:
    """Callback for :func:`_figure_png`: paint ``rgba`` (P x P heatmap pixels) into the rendered
    canvas over ``ax``, resized with nearest-neighbour to the axes' size in device pixels, then
    outline the ``limit`` largest clusters at least two pixels wide (``starts``: cluster start
    positions, ending with N) and the axes frame."""
    from PIL import Image, ImageDraw

    def paint(fig: Any, image: Any) -> None:
        box = ax.get_window_extent(fig.canvas.get_renderer())
        height = image.size[1]
        left, right = int(round(box.x0)), int(round(box.x1))
        top, bottom = height - int(round(box.y1)), height - int(round(box.y0))
        width_px, height_px = max(1, right - left), max(1, bottom - top)
        pixels = Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB")
        image.paste(pixels.resize((width_px, height_px), Image.Resampling.NEAREST), (left, top))
        draw = ImageDraw.Draw(image)
        if starts is not None and n:
            sizes = np.diff(starts)
            sx, sy = width_px / n, height_px / n
            for c in np.argsort(-sizes, kind="stable")[:limit]:
                if sizes[c] < 2 or sizes[c] * sx < 2:
                    continue
                a, b = int(starts[c]), int(starts[c] + sizes[c])
                draw.rectangle(
                    (left + a * sx, top + a * sy, left + b * sx - 1, top + b * sy - 1),
                    outline=(0, 0, 0),
                )
        draw.rectangle((left, top, right - 1, bottom - 1), outline=(0, 0, 0))

    return paint


def _runs_of(values: np.ndarray) -> np.ndarray:
    """Start positions of the runs of equal consecutive values, ending with len(values)."""
    if values.size == 0:
        return np.zeros(1, dtype=np.int64)
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    return np.concatenate([[0], change, [values.size]]).astype(np.int64)


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


def correlation_histogram(
    corr: np.ndarray,
    *,
    bins: int = 200,
    max_values: int | None = 20_000_000,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> CorrelationHistogram:
    """Histogram of ``corr[i, j]`` for ``i < j`` over ``bins`` equal bins on ``[-1, 1]``.

    Exact over all ``N(N−1)/2`` pairs when that is ``<= max_values`` (or ``max_values`` is
    None): the upper triangle is read in blocks of contiguous rows and each block's values are
    added with ``np.histogram``. Otherwise ``m = max(1, max_values // (N − 1))`` rows at
    ``round(linspace(0, N − 1, m))`` (deterministic) each contribute their ``N − 1``
    off-diagonal values. Sums for the mean and standard deviation are float64.
    """
    corr = _check_corr(corr)
    n = corr.shape[0]
    if int(bins) < 1:
        raise ValueError(f"bins must be >= 1, got {bins!r}")
    edges = np.linspace(-1.0, 1.0, int(bins) + 1)
    counts = np.zeros(int(bins), dtype=np.int64)
    acc = {"pairs": 0, "nan": 0, "out": 0, "sum": 0.0, "sq": 0.0}

    def add(values: np.ndarray) -> None:
        flat = np.ravel(values)
        acc["pairs"] += flat.size
        for start in range(0, flat.size, _HISTOGRAM_CHUNK):
            chunk = flat[start : start + _HISTOGRAM_CHUNK]
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

    total_pairs = n * (n - 1) // 2
    sampled = max_values is not None and total_pairs > int(max_values)
    rows_per_block = _rows_per_block(8.0, n, working_memory_mb)
    if not sampled:
        rows_used = n
        for r0 in range(0, n, rows_per_block):
            r1 = min(n, r0 + rows_per_block)
            block = np.asarray(corr[r0:r1])
            square = block[:, r0:r1]
            add(square[np.triu(np.ones(square.shape, dtype=bool), k=1)])
            if r1 < n:
                add(block[:, r1:])
            del block, square
    else:
        assert max_values is not None  # sampled implies a limit
        m = max(1, int(max_values) // max(n - 1, 1))
        rows = np.unique(np.rint(np.linspace(0, n - 1, min(m, n))).astype(np.int64))
        rows_used = int(rows.size)
        for b0 in range(0, rows.size, rows_per_block):
            chosen = rows[b0 : b0 + rows_per_block]
            block = np.asarray(corr[chosen])
            off_diagonal = np.ones(block.shape, dtype=bool)
            off_diagonal[np.arange(chosen.size), chosen] = False
            add(block[off_diagonal])
            del block, off_diagonal
    return CorrelationHistogram(
        edges=edges,
        counts=counts,
        n_pairs=int(acc["pairs"]),
        n_nan=int(acc["nan"]),
        n_out_of_range=int(acc["out"]),
        sampled=bool(sampled),
        rows_used=rows_used,
        value_sum=float(acc["sum"]),
        value_sq_sum=float(acc["sq"]),
    )


def correlation_histogram_png(
    corr: np.ndarray | None = None,
    *,
    histogram: CorrelationHistogram | None = None,
    bins: int = 200,
    max_values: int | None = 20_000_000,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    title: str | None = None,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the distribution of off-diagonal correlations (see :func:`correlation_histogram`).

    Pass ``corr`` (computed here) or a precomputed ``histogram``. The picture states N, the
    number of pairs, the NaN share, mean, median and 5 %/95 % quantiles, and whether a row
    sample was used.
    """
    if histogram is None:
        if corr is None:
            raise ValueError("give corr or histogram")
        corr = _check_corr(corr)
        histogram = correlation_histogram(
            corr, bins=bins, max_values=max_values, working_memory_mb=working_memory_mb
        )
    h = histogram
    fig, ax = _new_figure(6.4, 4.0)
    ax.stairs(h.counts, h.edges, fill=True, color="#4c72b0", alpha=0.85)
    ax.set_xlim(-1.0, 1.0)
    ax.set_xlabel("correlation")
    ax.set_ylabel("pairs" + (" (row sample)" if h.sampled else ""))
    ax.axvline(0.0, color="grey", linewidth=0.6)
    if h.n_finite:
        ax.axvline(h.mean, color="#c44e52", linewidth=1.0, label=f"mean {h.mean:+.3f}")
        ax.legend(loc="upper left", fontsize=8, frameon=False)
    stats = (
        f"pairs {h.n_pairs:,}\nNaN {100 * h.nan_share:.2f}%\nmedian {h.quantile(0.5):+.3f}\n"
        f"5% {h.quantile(0.05):+.3f}, 95% {h.quantile(0.95):+.3f}\nsd {h.std:.3f}"
        if h.n_pairs
        else "no pairs"
    )
    ax.text(
        0.99,
        0.97,
        stats,
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        parse_math=False,
    )
    n_symbols = _n_from_pairs(h)
    head = title or (
        f"Distribution of correlations, {n_symbols:,} symbols"
        if n_symbols is not None
        else "Distribution of correlations"
    )
    sub = f"sample of {h.rows_used:,} evenly spaced rows" if h.sampled else "all pairs i < j"
    _set_title(ax, head, sub)
    return _figure_png(fig, max_bytes=max_bytes)


def _n_from_pairs(h: CorrelationHistogram) -> int | None:
    if h.sampled:
        return h.n_pairs // h.rows_used + 1 if h.rows_used else None
    # n (n - 1) / 2 = pairs
    n = int(round((1 + math.sqrt(1 + 8 * h.n_pairs)) / 2)) if h.n_pairs else None
    return n


# --------------------------------------------------------------------------------------------
# lead-lag network
# --------------------------------------------------------------------------------------------

_PAIR_FIELDS = ("leader", "lagger", "lag", "lagged_corr", "sync_corr", "improvement", "overlap")


def normalize_pairs(
    pairs: Any, symbols: Sequence[str] | None = None, *, top: int | None = None
) -> list[dict[str, Any]]:
    """Lead-lag pairs as dicts ``{leader, lagger, lag, lagged_corr, sync_corr, improvement,
    overlap}`` with leader/lagger as symbol names, sorted by improvement descending (then
    leader, lagger), at most ``top`` of them.

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
        for key in ("lagged_corr", "sync_corr", "improvement"):
            if key in r and r[key] is not None:
                r[key] = float(r[key])
        for key in ("lag", "overlap"):
            if key in r and r[key] is not None:
                r[key] = int(r[key])
    rows.sort(
        key=lambda r: (-_finite_or(r.get("improvement"), -math.inf), r["leader"], r["lagger"])
    )
    return rows if top is None else rows[: max(0, int(top))]


def _finite_or(value: Any, default: float) -> float:
    if value is None:
        return default
    value = float(value)
    return value if math.isfinite(value) else default


def lead_lag_network_png(
    pairs: Any,
    symbols: Sequence[str] | None = None,
    *,
    top: int = 30,
    title: str | None = None,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the ``top`` lead-lag pairs by improvement as a directed bipartite graph.

    Leaders form the left column (strongest pair first), laggers the right column (ordered by
    the mean row of their leaders, which keeps arrows short and mostly horizontal); a symbol
    that both leads and lags appears in both columns. Each arrow goes leader → lagger and is
    labelled ``<lag>d <lagged corr>``: red for a positive lagged correlation, blue for a
    negative one, thicker for a larger improvement. Symbol names are drawn verbatim (no
    mathtext), shortened to 18 characters.
    """
    rows = normalize_pairs(pairs, symbols, top=top)
    height = 2.0 + 0.24 * max(len(rows), 4)
    fig, ax = _new_figure(6.4, min(height, 9.5))
    ax.axis("off")
    if not rows:
        ax.text(0.5, 0.5, "no lead-lag pairs", ha="center", va="center", parse_math=False)
        _set_title(ax, title or "Lead-lag pairs", "")
        return _figure_png(fig, max_bytes=max_bytes)
    leaders: list[str] = []
    for r in rows:
        if r["leader"] not in leaders:
            leaders.append(r["leader"])
    leader_row = {name: i for i, name in enumerate(leaders)}
    first_seen: dict[str, int] = {}
    rows_of: dict[str, list[int]] = {}
    for k, r in enumerate(rows):
        first_seen.setdefault(r["lagger"], k)
        rows_of.setdefault(r["lagger"], []).append(leader_row[r["leader"]])
    laggers = sorted(rows_of, key=lambda name: (np.mean(rows_of[name]), first_seen[name]))

    def y_of(index: int, count: int) -> float:
        """Rows of one column spread evenly over the full height."""
        return 1.0 - (index + 0.5) / count

    n_rows = max(len(leaders), len(laggers))
    y_leader = {name: y_of(i, len(leaders)) for i, name in enumerate(leaders)}
    y_lagger = {name: y_of(i, len(laggers)) for i, name in enumerate(laggers)}
    out_degree = {name: sum(1 for r in rows if r["leader"] == name) for name in leaders}
    in_degree = {name: len(rows_of[name]) for name in laggers}
    improvements = np.array([_finite_or(r.get("improvement"), 0.0) for r in rows])
    low, span = float(improvements.min()), float(improvements.max() - improvements.min())
    fontsize = 8 if n_rows <= 30 else 6
    for r, imp in zip(rows, improvements, strict=True):
        y0, y1 = y_leader[r["leader"]], y_lagger[r["lagger"]]
        positive = _finite_or(r.get("lagged_corr"), 0.0) >= 0
        color = "#c44e52" if positive else "#4c72b0"
        width = 0.8 + (2.4 * (imp - low) / span if span > 0 else 1.2)
        ax.annotate(
            "",
            xy=(0.78, y1),
            xytext=(0.22, y0),
            arrowprops={
                "arrowstyle": "-|>",
                "color": color,
                "lw": width,
                "shrinkA": 2,
                "shrinkB": 2,
                "mutation_scale": 10,
            },
        )
        label = f"{r['lag']}d" if r.get("lag") is not None else ""
        if r.get("lagged_corr") is not None:
            label += f" {_fmt_float(r['lagged_corr'], '+.2f')}"
        # label where the arrow is alone: near its leader (one outgoing arrow), else near its
        # lagger (one incoming arrow), else in the middle
        t = 0.2 if out_degree[r["leader"]] == 1 else (0.8 if in_degree[r["lagger"]] == 1 else 0.5)
        ax.text(
            0.22 + t * 0.56,
            y0 + t * (y1 - y0) + 0.004,
            label.strip(),
            fontsize=fontsize - 1,
            ha="center",
            va="bottom",
            color=color,
            parse_math=False,
        )
    for name, y in y_leader.items():
        ax.text(
            0.2, y, _shorten(name, 18), fontsize=fontsize, ha="right", va="center", parse_math=False
        )
    for name, y in y_lagger.items():
        ax.text(
            0.8, y, _shorten(name, 18), fontsize=fontsize, ha="left", va="center", parse_math=False
        )
    ax.text(0.2, 1.0, "leader", fontsize=8, ha="right", va="bottom", weight="bold")
    ax.text(0.8, 1.0, "lagger", fontsize=8, ha="left", va="bottom", weight="bold")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.01, 1.04)
    head = title or f"Strongest {len(rows)} lead-lag pairs by improvement"
    _set_title(
        ax,
        head,
        "arrows: lag in days and lagged corr (red +, blue -), width ~ improvement",
    )
    return _figure_png(fig, max_bytes=max_bytes)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_{}[]<>()#+-.!|~"})


def _md_escape(text: str) -> str:
    """Escape markdown punctuation so a symbol shows verbatim in a table cell."""
    return str(text).replace("\r", " ").replace("\n", " ").translate(_MD_SPECIAL)


def _fmt_float(value: Any, spec: str) -> str:
    if value is None:
        return "NaN"
    value = float(value)
    return "NaN" if math.isnan(value) else format(value, spec)


def lead_lag_markdown_table(
    pairs: Any, symbols: Sequence[str] | None = None, *, top: int = 20
) -> str:
    """The ``top`` pairs as a markdown table (leader, lagger, lag, lagged corr, sync corr,
    improvement, overlap); symbol names escaped so they show verbatim."""
    rows = normalize_pairs(pairs, symbols, top=top)
    lines = [
        "| leader | lagger | lag | lagged corr | sync corr | improvement | overlap |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {_md_escape(r['leader'])} | {_md_escape(r['lagger'])} | {r.get('lag', '')} | "
            f"{_fmt_float(r.get('lagged_corr'), '+.3f')} | {_fmt_float(r.get('sync_corr'), '+.3f')} | "
            f"{_fmt_float(r.get('improvement'), '.3f')} | {r.get('overlap', '')} |"
        )
    if not rows:
        lines.append("| (no pairs) | | | | | | |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Dagster metadata helpers
# --------------------------------------------------------------------------------------------


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for PNG bytes (checks the PNG signature)."""
    if not isinstance(png, bytes | bytearray) or not bytes(png[:8]) == _PNG_MAGIC:
        raise ValueError("not PNG bytes (missing the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(bytes(png)).decode("ascii")


def png_markdown(png: bytes, alt: str = "image") -> str:
    """Markdown image ``![alt](data:image/png;base64,...)`` (alt text sanitised)."""
    safe_alt = " ".join(str(alt).replace("[", "(").replace("]", ")").split())
    return f"![{safe_alt}]({png_data_uri(png)})"


def png_metadata(png: bytes, alt: str = "image") -> Any:
    """``dagster.MetadataValue.md`` showing the PNG in the Dagster UI."""
    import dagster as dg

    return dg.MetadataValue.md(png_markdown(png, alt))


def heatmap_metadata(
    corr: np.ndarray,
    labels: Sequence[int] | np.ndarray | None = None,
    *,
    order: Sequence[int] | np.ndarray | None = None,
    max_pixels: int = 512,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> dict[str, Any]:
    """``{"heatmap": MetadataValue.md(<clustered heatmap>)}`` for an asset's metadata."""
    png = clustered_heatmap_png(
        corr, labels, order=order, max_pixels=max_pixels, working_memory_mb=working_memory_mb
    )
    return {"heatmap": png_metadata(png, "clustered correlation heatmap")}


def histogram_metadata(
    corr: np.ndarray,
    *,
    max_values: int | None = 20_000_000,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> dict[str, Any]:
    """Histogram picture plus numeric facts (plotted by the UI across partitions):
    ``correlation_histogram`` (md), ``corr_mean``, ``corr_median``, ``corr_nan_share``."""
    h = correlation_histogram(corr, max_values=max_values, working_memory_mb=working_memory_mb)
    png = correlation_histogram_png(histogram=h)
    out: dict[str, Any] = {"correlation_histogram": png_metadata(png, "correlation histogram")}
    for key, value in (
        ("corr_mean", h.mean),
        ("corr_median", h.quantile(0.5)),
        ("corr_nan_share", h.nan_share),
    ):
        if math.isfinite(value):
            out[key] = float(round(value, 6))
    return out


def lead_lag_metadata(
    pairs: Any, symbols: Sequence[str] | None = None, *, top: int = 30, table_rows: int = 20
) -> dict[str, Any]:
    """``lead_lag_network`` (md picture) and ``lead_lag_top_pairs`` (md table)."""
    import dagster as dg

    png = lead_lag_network_png(pairs, symbols, top=top)
    return {
        "lead_lag_network": png_metadata(png, "lead-lag network"),
        "lead_lag_top_pairs": dg.MetadataValue.md(
            lead_lag_markdown_table(pairs, symbols, top=table_rows)
        ),
    }


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------


def _new_figure(width_in: float, height_in: float, dpi: int = 100) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    return fig, ax


def _set_title(ax: Any, head: str, sub: str) -> None:
    ax.set_title(head + ("\n" + sub if sub else ""), fontsize=10, loc="left")
    ax.title.set_parse_math(False)


def _safe_tick_labels(labels: Iterable[Any]) -> None:
    for label in labels:
        label.set_parse_math(False)


def _figure_png(fig: Any, *, max_bytes: int = DEFAULT_MAX_PNG_BYTES, paint: Any = None) -> bytes:
    """Render ``fig`` to a palette PNG no larger than ``max_bytes`` (lowering dpi if needed).

    ``paint(fig, image)`` may draw into the rendered RGB ``PIL.Image`` before it is encoded
    (called at each resolution tried).
    """
    from PIL import Image

    dpi = float(fig.dpi)
    png = b""
    try:
        for _ in range(6):
            fig.set_dpi(dpi)
            with warnings.catch_warnings():
                # fonts without a glyph for some symbol characters: drawn as boxes, not errors
                warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing.*")
                warnings.filterwarnings("ignore", message=r".*tight_layout.*")
                fig.tight_layout()
                fig.canvas.draw()
            rgba = np.asarray(fig.canvas.buffer_rgba())
            image = Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB")
            if paint is not None:
                paint(fig, image)
            image = image.quantize(
                colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
            )
            buf = io.BytesIO()
            image.save(buf, format="PNG", optimize=True)
            png = buf.getvalue()
            if len(png) <= max_bytes:
                return png
            dpi *= 0.8
        raise ValueError(
            f"picture still {len(png):,} bytes at {dpi / 0.8:.0f} dpi, over max_bytes={max_bytes:,}"
        )
    finally:
        fig.clear()
