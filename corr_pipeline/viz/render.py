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
``lead_lag_network_png(pairs, symbols)``
    The ``top`` lead-lag pairs (SPEC §6) by improvement as a directed bipartite graph: leaders
    on the left, laggers on the right, an arrow leader → lagger labelled with the lag in days and
    the lagged correlation, red for a positive lagged correlation, blue for a negative one,
    thicker for a larger improvement; labels placed along their arrows, measured so that none
    overlaps another or is crossed by another arrow (a pair with no room on its arrow is listed
    on the right). At most 7 inches high, so that the UI's picture dialog shows it whole.
    O(top²).

Figures are drawn on matplotlib's Agg canvas (no pyplot, no display, thread-safe per figure),
reduced to a 256-colour palette with Pillow and kept under ``max_bytes`` (default
:data:`DEFAULT_MAX_PNG_BYTES`) by lowering the resolution if needed. Symbol names are drawn
verbatim (no mathtext).

``png_data_uri`` / ``png_markdown`` embed PNG bytes in markdown as
``![alt](data:image/png;base64,...)``, the form the Dagster UI shows (its markdown sanitizer
allows ``data:`` image sources); the Dagster metadata itself is built in
:mod:`corr_pipeline.defs.pictures`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.viz.reductions import (
    CorrelationHistogram,
    check_corr,
    check_order,
    cluster_order,
    correlation_histogram,
    finite_or,
    heatmap_grid,
    normalize_pairs,
)

__all__ = [
    "DEFAULT_MAX_PNG_BYTES",
    "ColourScale",
    "cluster_ticks",
    "heatmap_colour_scale",
    "histogram_range",
    "clustered_heatmap_png",
    "correlation_histogram_png",
    "EDGE_LABEL_GID",
    "NODE_LABEL_GID",
    "lead_lag_network_figure",
    "lead_lag_network_png",
    "png_data_uri",
    "png_markdown",
]

DEFAULT_MAX_PNG_BYTES = 200_000
"""Upper bound on each picture's PNG size (it travels base64-encoded in run metadata)."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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

    fig, ax = _new_figure(6.4, 5.4)
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
        _safe_tick_labels(ax.set_xticklabels(names, rotation=90, fontsize=7))
        _safe_tick_labels(ax.set_yticklabels(names, fontsize=7))
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        if starts is not None and labels is not None:
            marks = cluster_ticks(np.asarray(labels)[grid.order], starts, grid.pixels)
            ax.xaxis.tick_top()
            ax.set_xticks([m[0] for m in marks])
            _safe_tick_labels(ax.set_xticklabels([m[1] for m in marks], fontsize=6))
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
    _set_title(ax, head, sub)
    return _figure_png(fig, max_bytes=max_bytes, paint=_heatmap_painter(ax, pixels_rgba, n, starts))


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
    fig, ax = _new_figure(6.4, 4.0)
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
    _set_title(ax, head, sub)
    return _figure_png(fig, max_bytes=max_bytes)


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


# --------------------------------------------------------------------------------------------
# lead-lag network
# --------------------------------------------------------------------------------------------


#: ``gid`` of the texts that label an edge of the lead-lag network (on its arrow, or a line of
#: the side list), and of its symbol names: what the layout keeps apart (and the tests measure).
EDGE_LABEL_GID = "lead-lag-edge-label"
NODE_LABEL_GID = "lead-lag-node-label"

_NETWORK_WIDTH_IN = 6.4
_LIST_WIDTH_IN = 3.0
_TITLE_IN = 0.8
_NETWORK_MAX_HEIGHT_IN = 7.0
"""The network's height at most (700 pixels at 100 dpi): it fits the UI's picture dialog."""
_LABEL_PAD_PX = 2.0
_X_LEADER, _X_LAGGER = 0.22, 0.78


def _edge_label(row: dict[str, Any]) -> str:
    label = f"{row['lag']}d" if row.get("lag") is not None else ""
    if row.get("lagged_corr") is not None:
        label += f" {_fmt_float(row['lagged_corr'], '+.2f')}"
    return label.strip()


def _apart(box: Any, others: list[Any], pad: float) -> bool:
    """True when ``box`` (display pixels) is at least ``pad`` pixels from every box of
    ``others`` on one axis."""
    return all(
        box.x1 + pad <= o.x0 or o.x1 + pad <= box.x0 or box.y1 + pad <= o.y0 or o.y1 + pad <= box.y0
        for o in others
    )


def _crosses_other_arrow(corners: np.ndarray, own: int, lines: list[tuple[float, float]]) -> bool:
    """True when an arrow other than ``lines[own]`` passes through the box whose data-space
    corners are ``corners`` (``[[x0, y0], [x1, y1]]``); arrows are the straight segments from
    ``(_X_LEADER, y0)`` to ``(_X_LAGGER, y1)``."""
    (bx0, by0), (bx1, by1) = corners
    lo, hi = max(bx0, _X_LEADER), min(bx1, _X_LAGGER)
    if lo > hi:
        return False
    for k, (y0, y1) in enumerate(lines):
        if k == own:
            continue
        ya = y0 + (lo - _X_LEADER) / (_X_LAGGER - _X_LEADER) * (y1 - y0)
        yb = y0 + (hi - _X_LEADER) / (_X_LAGGER - _X_LEADER) * (y1 - y0)
        if min(ya, yb) <= by1 and max(ya, yb) >= by0:
            return True
    return False


def _label_candidates(preferred: float) -> list[float]:
    """Positions along an arrow (0 = leader end, 1 = lagger end), nearest ``preferred`` first."""
    grid = [0.12 + 0.04 * i for i in range(20)]  # 0.12 .. 0.88
    return sorted(grid, key=lambda t: (abs(t - preferred), t))


def lead_lag_network_figure(
    pairs: Any,
    symbols: Sequence[str] | None = None,
    *,
    top: int = 30,
    title: str | None = None,
) -> Any:
    """The matplotlib figure of :func:`lead_lag_network_png` (Agg canvas, fixed layout: render
    it with ``tight_layout`` off, as that function does).

    Edge labels never overlap one another nor a symbol name, and no other arrow crosses them.
    Each label is placed along its arrow, strongest pair first: at the first of the positions
    ``0.12, 0.16, ..., 0.88`` of the arrow (nearest its preferred one first: near the leader
    when the leader has one arrow, near the lagger when the lagger has one, else the middle)
    where its text, measured by the renderer, stays :data:`_LABEL_PAD_PX` pixels clear of every
    label already placed and of every symbol name and no other arrow passes within that distance
    of it. A pair
    whose label fits nowhere on its arrow is listed instead in a column to
    the right (``leader → lagger  <lag>d <lagged corr>``), one line each, spaced by more than the
    text's height, and the whole layout is drawn again with that column reserved (the arrows'
    room changes, so every label is placed anew). Sizes scale with the resolution together, so
    the PNG's lower-resolution retries keep the labels apart.
    """
    rows = normalize_pairs(pairs, symbols, top=top)
    height = min(2.0 + 0.17 * max(len(rows), 4), _NETWORK_MAX_HEIGHT_IN)
    if not rows:
        fig, ax = _new_figure(_NETWORK_WIDTH_IN, height)
        ax.axis("off")
        ax.text(0.5, 0.5, "no lead-lag pairs", ha="center", va="center", parse_math=False)
        _set_title(ax, title or "Lead-lag pairs", "")
        return fig
    with _quiet_drawing():
        fig, unplaced = _draw_network(rows, height, title, with_list=False)
        if unplaced:  # the arrows keep their size in inches: the same labels are placed again
            fig.clear()
            fig, unplaced = _draw_network(rows, height, title, with_list=True)
    return fig


def _draw_network(
    rows: list[dict[str, Any]], height: float, title: str | None, *, with_list: bool
) -> tuple[Any, list[int]]:
    """Draw the network of ``rows``; ``with_list``: widen the figure by a right-hand column and
    list there the pairs whose label fits on no position of its arrow. Returns the figure and
    the indices of the pairs not labelled on their arrow."""
    width = _NETWORK_WIDTH_IN + (_LIST_WIDTH_IN if with_list else 0.0)
    fig, ax = _new_figure(width, height)
    top_frac = 1.0 - _TITLE_IN / height
    bottom_frac = 0.1 / height
    ax.set_position((0.01, bottom_frac, (_NETWORK_WIDTH_IN - 0.13) / width, top_frac - bottom_frac))
    ax.axis("off")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.01, 1.04)

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
    improvements = np.array([finite_or(r.get("improvement"), 0.0) for r in rows])
    low, span = float(improvements.min()), float(improvements.max() - improvements.min())
    fontsize = 8 if n_rows <= 30 else 6
    colors = []
    for r, imp in zip(rows, improvements, strict=True):
        y0, y1 = y_leader[r["leader"]], y_lagger[r["lagger"]]
        color = "#c44e52" if finite_or(r.get("lagged_corr"), 0.0) >= 0 else "#4c72b0"
        colors.append(color)
        ax.annotate(
            "",
            xy=(_X_LAGGER, y1),
            xytext=(_X_LEADER, y0),
            arrowprops={
                "arrowstyle": "-|>",
                "color": color,
                "lw": 0.8 + (2.4 * (imp - low) / span if span > 0 else 1.2),
                "shrinkA": 2,
                "shrinkB": 2,
                "mutation_scale": 10,
            },
        )
    names = [
        ax.text(_X_LEADER - 0.02, y, _shorten(n, 18), fontsize=fontsize, ha="right", va="center")
        for n, y in y_leader.items()
    ] + [
        ax.text(_X_LAGGER + 0.02, y, _shorten(n, 18), fontsize=fontsize, ha="left", va="center")
        for n, y in y_lagger.items()
    ]
    names.append(ax.text(0.2, 1.0, "leader", fontsize=8, ha="right", va="bottom", weight="bold"))
    names.append(ax.text(0.8, 1.0, "lagger", fontsize=8, ha="left", va="bottom", weight="bold"))
    for text in names:
        text.set_parse_math(False)
        text.set_gid(NODE_LABEL_GID)
    sub = "arrows: lag in days and lagged corr (red +, blue -), width ~ improvement"
    if with_list:
        sub += "\npairs listed on the right: no room for their label on the arrow"
    _set_title(ax, title or f"Strongest {len(rows)} lead-lag pairs by improvement", sub)

    renderer = fig.canvas.get_renderer()
    taken = [t.get_window_extent(renderer) for t in names]
    lines = [(y_leader[r["leader"]], y_lagger[r["lagger"]]) for r in rows]
    unplaced: list[int] = []
    for k, r in enumerate(rows):
        y0, y1 = y_leader[r["leader"]], y_lagger[r["lagger"]]
        preferred = (
            0.2 if out_degree[r["leader"]] == 1 else (0.8 if in_degree[r["lagger"]] == 1 else 0.5)
        )
        label = ax.text(
            0,
            0,
            _edge_label(r),
            fontsize=fontsize - 1,
            ha="center",
            va="center",
            color=colors[k],
            parse_math=False,
            gid=EDGE_LABEL_GID,
            bbox={"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none"},
        )
        # a position clear of the other labels where no other arrow crosses the label (so it
        # reads as its own arrow's); none: the pair goes to the list
        spot = None
        for t in _label_candidates(preferred):
            label.set_position((_X_LEADER + t * (_X_LAGGER - _X_LEADER), y0 + t * (y1 - y0)))
            box = label.get_window_extent(renderer)
            if _apart(box, taken, _LABEL_PAD_PX) and not _crosses_other_arrow(
                ax.transData.inverted().transform(box.padded(_LABEL_PAD_PX)), k, lines
            ):
                spot = (t, box)
                break
        if spot is None:
            label.remove()
            unplaced.append(k)
        else:
            t, box = spot
            label.set_position((_X_LEADER + t * (_X_LAGGER - _X_LEADER), y0 + t * (y1 - y0)))
            taken.append(box)
    if with_list and unplaced:
        _list_pairs(fig, rows, unplaced, colors, bottom_frac, top_frac, width)
    return fig, unplaced


def _list_pairs(
    fig: Any,
    rows: list[dict[str, Any]],
    which: list[int],
    colors: list[str],
    bottom_frac: float,
    top_frac: float,
    width: float,
) -> None:
    """The pairs ``which`` as lines ``leader → lagger  <lag>d <corr>`` in the right-hand column,
    spaced 1.4 times the font size (more than a line of text is high), the font shrunk until
    they all fit, in two sub-columns (names shortened to 10 characters) when one would need a font below 4.5
    points."""
    axes = fig.add_axes(
        (
            _NETWORK_WIDTH_IN / width,
            bottom_frac,
            (_LIST_WIDTH_IN - 0.1) / width,
            top_frac - bottom_frac,
        )
    )
    axes.axis("off")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    height_pt = (top_frac - bottom_frac) * fig.get_figheight() * 72.0
    columns = 1 if height_pt / (1.4 * (len(which) + 1)) >= 4.5 else 2
    limit = 12 if columns == 1 else 10
    per_column = -(-len(which) // columns)
    size = min(7.0, height_pt / (1.4 * (per_column + 1)))
    step = 1.4 * size / height_pt
    head = axes.text(0, 1, "pairs labelled here", fontsize=size, weight="bold", va="top")
    head.set_gid(NODE_LABEL_GID)
    for i, k in enumerate(which):
        r = rows[k]
        axes.text(
            (i // per_column) / columns,
            1 - (i % per_column + 1) * step,
            f"{_shorten(r['leader'], limit)} → {_shorten(r['lagger'], limit)}  {_edge_label(r)}",
            fontsize=size,
            va="top",
            color=colors[k],
            parse_math=False,
            gid=EDGE_LABEL_GID,
        )


def lead_lag_network_png(
    pairs: Any,
    symbols: Sequence[str] | None = None,
    *,
    top: int = 30,
    title: str | None = None,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the ``top`` lead-lag pairs by improvement as a directed bipartite graph
    (:func:`lead_lag_network_figure`).

    Leaders form the left column (strongest pair first), laggers the right column (ordered by
    the mean row of their leaders, which keeps arrows short and mostly horizontal); a symbol
    that both leads and lags appears in both columns. Each arrow goes leader → lagger and is
    labelled ``<lag>d <lagged corr>``: red for a positive lagged correlation, blue for a
    negative one, thicker for a larger improvement. No two labels overlap: a label with no room
    on its arrow goes to a list on the right. Symbol names are drawn verbatim (no mathtext),
    shortened to 18 characters.
    """
    fig = lead_lag_network_figure(pairs, symbols, top=top, title=title)
    return _figure_png(fig, max_bytes=max_bytes, tight=False)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fmt_float(value: Any, spec: str) -> str:
    if value is None:
        return "NaN"
    value = float(value)
    return "NaN" if math.isnan(value) else format(value, spec)


# --------------------------------------------------------------------------------------------
# markdown embedding
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


@contextlib.contextmanager
def _quiet_drawing() -> Iterator[None]:
    """Drawing or measuring text without the warnings that are no errors: fonts without a glyph
    for some symbol characters (drawn as boxes), ``tight_layout`` giving up."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing.*")
        warnings.filterwarnings("ignore", message=r".*tight_layout.*")
        yield


def _figure_png(
    fig: Any, *, max_bytes: int = DEFAULT_MAX_PNG_BYTES, paint: Any = None, tight: bool = True
) -> bytes:
    """Render ``fig`` to a palette PNG no larger than ``max_bytes`` (lowering dpi if needed),
    after ``tight_layout`` unless ``tight`` is false (a figure laid out by hand).

    ``paint(fig, image)`` may draw into the rendered RGB ``PIL.Image`` before it is encoded
    (called at each resolution tried).
    """
    from PIL import Image

    dpi = float(fig.dpi)
    png = b""
    try:
        for _ in range(6):
            fig.set_dpi(dpi)
            with _quiet_drawing():
                if tight:
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
