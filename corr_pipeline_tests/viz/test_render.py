"""Rendering (corr_pipeline.viz.render): valid PNGs under the size cap, odd symbol names drawn
verbatim."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from corr_pipeline import viz
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline_tests.viz.helpers import corr_with_clusters, decode, lead_lag_pairs, memmap_of


def test_clustered_heatmap_png_is_a_valid_bounded_png(tmp_path):
    corr, groups = corr_with_clusters(400, 6, seed=2)
    png = viz.clustered_heatmap_png(memmap_of(tmp_path, corr), groups, max_pixels=128)
    pixels = decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    assert 300 <= pixels.shape[0] <= 800 and 300 <= pixels.shape[1] <= 800
    # the picture holds the diverging colormap: strong reds (within-cluster) and near-white
    red = (pixels[..., 0] > 150) & (pixels[..., 2] < 110)
    assert red.sum() > 1000


def test_heatmap_with_odd_symbol_names_and_explicit_order():
    corr, groups = corr_with_clusters(12, 3, seed=4)
    symbols = ["A'B", "C;D", "E F", "$x$", "Ünï", "日本", "a\\b", "_u_", "{b}", "%", "#1", "-"]
    order = np.argsort(groups, kind="stable")
    png = viz.clustered_heatmap_png(corr, groups, order=order, symbols=symbols)
    decode(png)


def test_png_size_limit_lowers_the_resolution_or_fails_clearly():
    corr, groups = corr_with_clusters(300, 5, seed=5)
    big = viz.clustered_heatmap_png(corr, groups)
    small = viz.clustered_heatmap_png(corr, groups, max_bytes=len(big) // 2)
    assert len(small) <= len(big) // 2
    assert decode(small).shape[0] < decode(big).shape[0]
    with pytest.raises(ValueError, match="max_bytes"):
        viz.clustered_heatmap_png(corr, groups, max_bytes=500)


def test_correlation_histogram_png_valid():
    corr, _ = corr_with_clusters(200, 4, seed=8)
    png = viz.correlation_histogram_png(corr)
    decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    h = viz.correlation_histogram(corr)
    assert viz.correlation_histogram_png(histogram=h) == png
    with pytest.raises(ValueError, match="give corr or histogram"):
        viz.correlation_histogram_png()


def test_lead_lag_network_png_valid_with_odd_symbols_and_empty():
    symbols = ["A'B", "C;D", "E F", "$x^2$", "Ünï", "日本", "a\\b", "_u_", "{b}", "%"]
    png = viz.lead_lag_network_png(lead_lag_pairs(40, 10), symbols, top=30)
    decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    empty = viz.lead_lag_network_png(np.zeros(0, dtype=LEAD_LAG_DTYPE), symbols)
    decode(empty)


def _with_reverse(pairs: np.ndarray, q_values: list[float]) -> np.ndarray:
    """``pairs`` with a reverse direction: pair ``k`` has reverse q-value ``q_values[k]``
    (lag 2, correlation -0.2), NaN meaning no reverse best lag (lag 0)."""
    q = np.asarray(q_values, dtype=np.float64)
    pairs["reverse_lag"] = np.where(np.isnan(q), 0, 2)
    pairs["reverse_lagged_corr"] = np.where(np.isnan(q), np.nan, -0.2)
    pairs["reverse_q_value"] = q
    return pairs


def test_lead_lag_network_draws_two_way_pairs_double_headed_with_a_legend():
    """A two-way pair (its reverse pair's q-value at most max_q_value, the bound included) is
    drawn with a head at both ends and labelled ``⇄ <lag>d <corr>``; a one-way pair (reverse
    not significant, or none) with one head. The legend under the network names both, with the
    threshold, and overlaps neither a label nor a symbol name."""
    symbols = [f"S{i}" for i in range(10)]
    pairs = np.sort(lead_lag_pairs(8, 10, seed=4), order="improvement")[::-1]
    pairs = _with_reverse(pairs, [0.01, 0.05, 0.06, np.nan, 0.5, 1e-9, np.nan, 0.05])
    two_way = [True, True, False, False, False, True, False, True]
    fig = viz.lead_lag_network_figure(pairs, symbols, max_q_value=0.05)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    styles = [type(t.arrow_patch.get_arrowstyle()).__name__ for t in arrows]
    assert styles == ["CurveFilledAB" if w else "CurveFilledB" for w in two_way]
    labels = [t.get_text() for t in _texts(fig, viz.EDGE_LABEL_GID)]
    assert sum("⇄ " in label for label in labels) == sum(two_way)  # on arrows or listed
    (legend,) = fig.legends
    assert legend.get_gid() == viz.LEGEND_GID
    entries = [t.get_text() for t in legend.get_texts()]
    assert entries[0].startswith("one-way") and entries[1].startswith("⇄ two-way")
    assert "q ≤ 0.05" in entries[1]
    box = legend.get_window_extent(renderer)
    for text in _texts(fig, viz.EDGE_LABEL_GID) + _texts(fig, viz.NODE_LABEL_GID):
        assert not _intersect(box, text.get_window_extent(renderer)), text.get_text()
    fig.clear()

    strict = viz.lead_lag_network_figure(pairs, symbols, max_q_value=1e-9)
    styles = [
        type(t.arrow_patch.get_arrowstyle()).__name__
        for t in strict.axes[0].texts
        if getattr(t, "arrow_patch", None) is not None
    ]
    assert styles.count("CurveFilledAB") == 1
    assert "q ≤ 1e-09" in strict.legends[0].get_texts()[1].get_text()
    png = viz.lead_lag_network_png(pairs, symbols, max_q_value=0.05)
    assert decode(png).shape[0] > 0 and png != viz.lead_lag_network_png(pairs, symbols)


def _complete_pairs(n: int, seed: int = 1) -> np.ndarray:
    """Every ordered pair of ``n`` symbols: each leader has n - 1 arrows, labels must crowd."""
    rng = np.random.default_rng(seed)
    i, j = np.nonzero(~np.eye(n, dtype=bool))
    pairs = np.zeros(i.size, dtype=LEAD_LAG_DTYPE)
    pairs["leader"], pairs["lagger"] = i, j
    pairs["lag"] = rng.integers(1, 6, i.size)
    pairs["lagged_corr"] = rng.uniform(-0.6, 0.6, i.size)
    pairs["improvement"] = rng.uniform(0, 0.5, i.size)
    pairs["overlap"] = 100
    return pairs


def _texts(fig, gid: str) -> list:
    return [a for a in fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == gid)]


def _intersect(a, b) -> bool:
    """Positive-area intersection of two display-space boxes."""
    return max(a.x0, b.x0) < min(a.x1, b.x1) and max(a.y0, b.y0) < min(a.y1, b.y1)


@pytest.mark.parametrize(
    ("name", "pairs", "n_symbols", "top", "listed"),
    [
        ("sparse", lead_lag_pairs(5, 50), 50, 30, False),
        ("default", lead_lag_pairs(40, 10), 10, 30, None),
        ("one leader", lead_lag_pairs(60, 30, seed=3), 30, 30, None),
        ("dense", lead_lag_pairs(400, 40, seed=2), 40, 120, None),
        ("complete", _complete_pairs(12), 12, 132, True),
    ],
)
def test_lead_lag_network_edge_labels_never_overlap(name, pairs, n_symbols, top, listed):
    """Measured by the renderer, at the picture's resolution and at a lower one (the PNG's
    fallback when it is too large): no two edge labels overlap, none overlaps a symbol name,
    and every pair shown has exactly one label (on its arrow or in the list on the right)."""
    from corr_pipeline.viz.network import _edge_label
    from corr_pipeline.viz.reductions import normalize_pairs

    symbols = [f"S{i:05d}" for i in range(n_symbols)]
    if name == "one leader":
        pairs["leader"] = 0
        pairs["lagger"] = np.arange(1, pairs.size + 1) % n_symbols
        pairs = pairs[pairs["lagger"] != 0][: n_symbols - 1]
    rows = normalize_pairs(pairs, symbols, top=top)
    fig = viz.lead_lag_network_figure(pairs, symbols, top=top)
    for dpi in (100, 64):
        fig.set_dpi(dpi)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        labels = _texts(fig, viz.EDGE_LABEL_GID)
        names = _texts(fig, viz.NODE_LABEL_GID)
        assert len(labels) == len(rows)
        on_arrows = sorted(t.get_text() for t in labels if "→" not in t.get_text())
        in_list = sorted(t.get_text().split("  ")[-1] for t in labels if "→" in t.get_text())
        assert sorted(on_arrows + in_list) == sorted(_edge_label(r) for r in rows)
        if listed is not None:
            assert bool(in_list) is listed, (name, len(in_list))
        boxes = [t.get_window_extent(renderer) for t in labels]
        name_boxes = [t.get_window_extent(renderer) for t in names]
        for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
            assert not _intersect(a, b), (name, dpi, labels[i].get_text(), labels[j].get_text())
        for a, label in zip(boxes, labels, strict=True):
            assert not any(_intersect(a, b) for b in name_boxes), (name, dpi, label.get_text())
        # a label on an arrow is crossed by no other arrow: it reads as its own arrow's
        arrows = _arrow_segments(fig, renderer)
        for label, box in zip(labels, boxes, strict=True):
            if "→" in label.get_text():
                continue
            crossing = [a for a in arrows if _segment_hits(a, box) and not _segment_hits(a, box, 0)]
            own = [a for a in arrows if _segment_hits(a, box, 0)]
            assert own, (name, dpi, label.get_text())
            assert not crossing, (name, dpi, label.get_text())
    assert fig.get_figheight() <= 7.0  # 700 pixels at 100 dpi: the UI's dialog shows it whole
    fig.clear()


def _arrow_segments(fig, renderer) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every arrow of the network as its (start, end) in display pixels."""
    out = []
    for ax in fig.axes:
        for text in ax.texts:
            if getattr(text, "arrow_patch", None) is None:
                continue
            start = ax.transData.transform(text.xyann)
            end = ax.transData.transform(text.xy)
            out.append((start, end))
    return out


def _segment_hits(segment, box, shrink: float = 0.5) -> bool:
    """Does ``segment`` pass through ``box`` (its inner part: ``shrink`` pixels in from each
    side, so a line touching the edge does not count), sampled every fifth of a pixel? With
    ``shrink=0``: does it pass through the box's centre line, which only the label's own
    arrow does."""
    (x0, y0), (x1, y1) = segment
    n = int(max(abs(x1 - x0), abs(y1 - y0)) * 5) + 2
    xs, ys = np.linspace(x0, x1, n), np.linspace(y0, y1, n)
    if shrink == 0:
        cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        near = np.abs(xs - cx) <= 1.0
        return bool(np.any(np.abs(ys[near] - cy) <= 1.0))
    inside = (xs > box.x0 + shrink) & (xs < box.x1 - shrink) & (ys > box.y0 + shrink)
    return bool(np.any(inside & (ys < box.y1 - shrink)))


def test_heatmap_colours_span_the_data():
    """Mostly positive correlations get a white-to-red scale over their own range (not half of
    [-1, 1]); correlations of both signs a diverging scale, symmetric, white at 0."""
    from corr_pipeline.viz.render import heatmap_colour_scale

    rng = np.random.default_rng(3)
    groups = rng.integers(0, 4, 300)
    noise = rng.normal(0.0, 0.03, (300, 300))
    corr = 0.15 + 0.4 * (groups[:, None] == groups[None, :]) + (noise + noise.T) / 2
    np.fill_diagonal(corr, 1.0)
    corr = corr.astype(np.float32)
    grid = viz.heatmap_grid(corr, viz.cluster_order(groups)[0])
    off = grid.values[~np.eye(grid.pixels, dtype=bool)]
    off = off[np.isfinite(off)]
    scale = heatmap_colour_scale(grid.values)
    assert off.min() > 0.0
    assert scale.colormap == "Reds"
    assert (
        scale.vmin <= off.min() < scale.vmin + 0.05 and scale.vmax - 0.05 < off.max() <= scale.vmax
    )
    assert scale.vmax - scale.vmin < 1.5  # the old scale spanned 2

    mixed = np.array([[1.0, -0.42, 0.13], [-0.42, 1.0, 0.3], [0.13, 0.3, 1.0]], dtype=np.float32)
    scale = heatmap_colour_scale(mixed)
    assert (scale.colormap, scale.vmin, scale.vmax) == ("RdBu_r", -0.45, 0.45)
    empty = heatmap_colour_scale(np.full((3, 3), np.nan, dtype=np.float32))
    assert (empty.colormap, empty.vmin, empty.vmax) == ("RdBu_r", -1.0, 1.0)


def test_heatmap_labels_the_largest_clusters_with_their_ids():
    """Marks at the centre of each wide cluster's block, carrying its published id, largest
    clusters first (brute force over the labels)."""
    from corr_pipeline.viz.render import cluster_ticks

    labels = np.array([7] * 50 + [3] * 30 + [9] * 17 + [1] * 1 + [4] * 2)
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(labels.size)]
    order, starts = viz.cluster_order(labels)
    marks = cluster_ticks(labels[order], starts, pixels=100)
    # blocks: 7 at [0, 50), 3 at [50, 80), 9 at [80, 97); 1 and 4 are narrower than 1/40 of N
    assert marks == [(25.0, "7"), (65.0, "3"), (88.5, "9")]
    assert cluster_ticks(labels[order], starts, pixels=100, limit=2) == marks[:2]


def test_histogram_x_range_fits_the_data():
    """From the first to the last non-empty bin, to multiples of 0.05, always showing 0."""
    from corr_pipeline.viz.reductions import correlation_histogram
    from corr_pipeline.viz.render import histogram_range

    corr, _ = corr_with_clusters(200, 3, seed=5)
    h = correlation_histogram(corr)
    lo, hi = histogram_range(h)
    off = corr[~np.eye(corr.shape[0], dtype=bool)]
    off = off[np.isfinite(off)]
    assert lo <= min(off.min(), 0.0) < lo + 0.05 + 0.01  # a bin is 0.01 wide
    assert hi - 0.05 - 0.01 < off.max() <= hi
    assert (lo, hi) != (-1.0, 1.0)
    empty = correlation_histogram(np.full((3, 3), np.nan, dtype=np.float32))
    assert histogram_range(empty) == (-1.0, 1.0)
