"""Pictures of a snapshot as PNG bytes: matplotlib rendering of the reductions in
:mod:`corr_pipeline.viz.reductions`. Pure functions of arrays (no database, no paths, no Dagster).

``clustered_heatmap_png(corr, labels=..., order=...)``
    The correlation matrix (SPEC §3) with rows and columns reordered so that the clusters
    (SPEC §5) sit in diagonal blocks, largest first, drawn from :func:`heatmap_grid` in colours
    that span the data (:func:`heatmap_colour_scale`; blank where no correlation is finite), the
    largest clusters outlined and their ids on top (:func:`cluster_ticks`). Memory: that of
    :func:`heatmap_grid` plus O(P²) RGBA pixels.
``correlation_histogram_png(corr)``
    The distribution of the off-diagonal correlations from :func:`correlation_histogram` as
    filled stairs over the range the data fill (:func:`histogram_range`), the mean marked, with
    the number of pairs, NaN share, median, 5 %/95 % quantiles and standard deviation, and
    whether a row sample was used.
Figures are drawn and encoded by :mod:`corr_pipeline.viz.figures`; the lead-lag network picture
is :mod:`corr_pipeline.viz.network`.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.viz.figures import (
    DEFAULT_MAX_PNG_BYTES,
    figure_png,
    new_figure,
    safe_tick_labels,
    set_title,
)
from corr_pipeline.viz.reductions import (
    CorrelationHistogram,
    check_corr,
    check_order,
    cluster_order,
    correlation_histogram,
    heatmap_grid,
)

__all__ = [
    "ColourScale",
    "cluster_ticks",
    "clustered_heatmap_png",
    "correlation_histogram_png",
    "heatmap_colour_scale",
    "histogram_range",
]

# --------------------------------------------------------------------------------------------
# heatmap
# --------------------------------------------------------------------------------------------


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
    """PNG of the correlation matrix ordered by cluster, block-averaged by :func:`heatmap_grid`.

    Give ``labels`` (cluster id per column, SPEC §5: clusters become diagonal blocks, largest
    first, outlined when at least two pixels wide) and/or an explicit ``order`` (e.g. the
    dendrogram's leaf order; it takes precedence for the ordering). ``symbols`` label the axes
    when N <= 40. Memory: see :func:`heatmap_grid`.
    """
    corr = check_corr(corr)
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
            starts = _runs_of(labels_arr[check_order(order, n)])
    if symbols is not None and len(symbols) != n:
        raise ValueError(f"symbols must have length N = {n}, got {len(symbols)}")
    grid = heatmap_grid(corr, order, max_pixels=max_pixels, working_memory_mb=working_memory_mb)
    n_clusters = None if starts is None else len(starts) - 1

    fig, ax = new_figure(6.4, 5.4)
    # The pixels are painted into the rendered canvas at the axes' exact size in device pixels
    # (_heatmap_painter): imshow would resample through float64 RGBA buffers (~25 MiB at 512²).
    ax.set_xlim(0, grid.pixels)
    ax.set_ylim(grid.pixels, 0)
    ax.set_aspect("equal")
    ax.set_facecolor("none")
    scale = heatmap_colour_scale(grid.values)
    cmap = _colormap(scale.colormap)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig.colorbar(
        ScalarMappable(norm=Normalize(scale.vmin, scale.vmax), cmap=cmap),
        ax=ax,
        fraction=0.046,
        pad=0.03,
        label="correlation",
        extend=scale.extend,
    )
    pixels_rgba = _colour_pixels(grid.values, cmap, scale.vmin, scale.vmax)
    if symbols is not None and 0 < n <= 40:
        ticks = np.arange(n) + 0.5
        names = [str(symbols[i]) for i in grid.order]
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        safe_tick_labels(ax.set_xticklabels(names, rotation=90, fontsize=7))
        safe_tick_labels(ax.set_yticklabels(names, fontsize=7))
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        if starts is not None and labels is not None:
            marks = cluster_ticks(np.asarray(labels)[grid.order], starts, grid.pixels)
            ax.xaxis.tick_top()
            ax.set_xticks([m[0] for m in marks])
            safe_tick_labels(ax.set_xticklabels([m[1] for m in marks], fontsize=6))
            ax.tick_params(axis="x", length=2, pad=1)
    per_pixel = n / grid.pixels if grid.pixels else 0
    head = title or (
        f"Correlation, {n:,} symbols"
        + (f", {n_clusters:,} clusters" if n_clusters is not None else "")
    )
    sub = (
        f"clusters largest first, ids on top; a pixel = mean of ~{per_pixel:.0f} x "
        f"{per_pixel:.0f} correlations"
        if per_pixel > 1.0001
        else ("ordered by cluster (largest first)" if starts is not None else "")
    )
    set_title(ax, head, sub)
    return figure_png(fig, max_bytes=max_bytes, paint=_heatmap_painter(ax, pixels_rgba, n, starts))


@dataclass(frozen=True)
class ColourScale:
    """The heatmap's colours: ``colormap`` over ``[vmin, vmax]`` (values beyond are drawn in
    the end colours; ``extend`` marks that on the colour bar)."""

    colormap: str
    vmin: float
    vmax: float
    extend: str = "neither"


def heatmap_colour_scale(values: np.ndarray) -> ColourScale:
    """A colour range that fits the heatmap's off-diagonal pixels (the diagonal ones average the
    ones of ``corr[i, i]``): ``lo``/``hi`` their minimum and maximum, widened to multiples of
    0.05. Where nearly all of them are positive (``lo >= -0.1·hi``) a sequential white-to-red
    ``Reds`` over ``[lo, hi]``; otherwise the diverging ``RdBu_r`` over ``±max(|lo|, |hi|)``,
    white at 0. With no finite off-diagonal pixel, ``RdBu_r`` over [-1, 1]."""
    off = values[~np.eye(values.shape[0], dtype=bool)] if values.ndim == 2 else values.ravel()
    off = off[np.isfinite(off)]
    if off.size == 0:
        return ColourScale("RdBu_r", -1.0, 1.0)
    lo = max(-1.0, math.floor(float(off.min()) * 20.0 - 1e-9) / 20.0)
    hi = min(1.0, math.ceil(float(off.max()) * 20.0 + 1e-9) / 20.0)
    diagonal_max = float(np.nanmax(values)) if np.isfinite(values).any() else hi
    extend = "max" if diagonal_max > hi else "neither"
    if hi > 0 and lo >= -0.1 * hi:
        return ColourScale("Reds", lo, hi, extend)
    bound = max(abs(lo), abs(hi), 0.05)
    return ColourScale("RdBu_r", -bound, bound, extend)


def cluster_ticks(
    placed_labels: np.ndarray, starts: np.ndarray, pixels: int, *, limit: int = 20
) -> list[tuple[float, str]]:
    """``(position, cluster id)`` marks over the heatmap's columns (in its ``pixels`` units) for
    up to ``limit`` of the largest clusters at least 1/40 of the width wide, so that the ids
    (``symbol_clusters.cluster_id``) do not crowd; ``placed_labels``: the label of every
    position in the heatmap's order, ``starts``: where each placed cluster begins, ending with
    N."""
    n = int(starts[-1]) if starts.size else 0
    if n == 0:
        return []
    sizes = np.diff(starts)
    wide = [c for c in np.argsort(-sizes, kind="stable")[:limit] if sizes[c] * 40 >= n]
    return [
        ((starts[c] + sizes[c] / 2.0) * pixels / n, str(int(placed_labels[starts[c]])))
        for c in sorted(wide)
    ]


def _colour_pixels(values: np.ndarray, cmap: Any, vmin: float, vmax: float) -> np.ndarray:
    """RGBA uint8 pixels of ``values`` over ``[vmin, vmax]`` (clipped) through the colormap's
    256-entry table (NaN -> white); O(P²) bytes, no float64 RGBA intermediate."""
    lut = cmap(np.linspace(0.0, 1.0, 256), bytes=True)  # (256, 4) uint8
    finite = np.isfinite(values)
    scaled = np.where(finite, (values - vmin) * (256.0 / (vmax - vmin)), 0.0)
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
    """Callback for :func:`figure_png`: paint ``rgba`` (P x P heatmap pixels) into the rendered
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
        corr = check_corr(corr)
        histogram = correlation_histogram(
            corr, bins=bins, max_values=max_values, working_memory_mb=working_memory_mb
        )
    h = histogram
    fig, ax = new_figure(6.4, 4.0)
    ax.stairs(h.counts, h.edges, fill=True, color="#4c72b0", alpha=0.85)
    ax.set_xlim(*histogram_range(h))
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
    set_title(ax, head, sub)
    return figure_png(fig, max_bytes=max_bytes)


def histogram_range(h: CorrelationHistogram) -> tuple[float, float]:
    """The x-range of the histogram picture: from the first to the last non-empty bin, widened
    to multiples of 0.05 and to 0 (the zero line is always shown), within [-1, 1]; [-1, 1] when
    every bin is empty."""
    used = np.flatnonzero(h.counts)
    if used.size == 0:
        return -1.0, 1.0
    lo = math.floor(float(h.edges[used[0]]) * 20.0 + 1e-9) / 20.0
    hi = math.ceil(float(h.edges[used[-1] + 1]) * 20.0 - 1e-9) / 20.0
    return max(-1.0, min(lo, 0.0)), min(1.0, max(hi, 0.0))


def _n_from_pairs(h: CorrelationHistogram) -> int | None:
    if h.sampled:
        return h.n_pairs // h.rows_used + 1 if h.rows_used else None
    # n (n - 1) / 2 = pairs
    n = int(round((1 + math.sqrt(1 + 8 * h.n_pairs)) / 2)) if h.n_pairs else None
    return n
