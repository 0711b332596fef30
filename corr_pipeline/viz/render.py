"""Pictures of a snapshot as PNG bytes: matplotlib rendering of the reductions in
:mod:`corr_pipeline.viz.reductions`. Pure functions of arrays (no database, no paths, no Dagster).

``clustered_heatmap_png(corr, labels=..., order=...)``
    The correlation matrix (SPEC §3) with rows and columns reordered so that the clusters
    (SPEC §5) sit in diagonal blocks, largest first, drawn from :func:`heatmap_grid` on a
    diverging colormap over ``[-1, 1]`` (blank where no correlation is finite), the largest
    clusters outlined. Memory: that of :func:`heatmap_grid` plus O(P²) RGBA pixels.
``correlation_histogram_png(corr)``
    The distribution of the off-diagonal correlations from :func:`correlation_histogram` as
    filled stairs, the mean marked, with the number of pairs, NaN share, median, 5 %/95 %
    quantiles and standard deviation, and whether a row sample was used.
``lead_lag_network_png(pairs, symbols)``
    The ``top`` lead-lag pairs (SPEC §6) by improvement as a directed bipartite graph: leaders
    on the left, laggers on the right, an arrow leader → lagger labelled with the lag in days and
    the lagged correlation, red for a positive lagged correlation, blue for a negative one,
    thicker for a larger improvement. O(top).

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
import io
import math
import warnings
from collections.abc import Iterable, Sequence
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
    "clustered_heatmap_png",
    "correlation_histogram_png",
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
    improvements = np.array([finite_or(r.get("improvement"), 0.0) for r in rows])
    low, span = float(improvements.min()), float(improvements.max() - improvements.min())
    fontsize = 8 if n_rows <= 30 else 6
    for r, imp in zip(rows, improvements, strict=True):
        y0, y1 = y_leader[r["leader"]], y_lagger[r["lagger"]]
        positive = finite_or(r.get("lagged_corr"), 0.0) >= 0
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
