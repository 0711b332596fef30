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
        ("default", lead_lag_pairs(40, 10), 10, 30, False),
        ("one leader", lead_lag_pairs(60, 30, seed=3), 30, 30, None),
        ("dense", lead_lag_pairs(400, 40, seed=2), 40, 120, None),
        ("complete", _complete_pairs(12), 12, 132, True),
    ],
)
def test_lead_lag_network_edge_labels_never_overlap(name, pairs, n_symbols, top, listed):
    """Measured by the renderer, at the picture's resolution and at a lower one (the PNG's
    fallback when it is too large): no two edge labels overlap, none overlaps a symbol name,
    and every pair shown has exactly one label (on its arrow or in the list on the right)."""
    from corr_pipeline.viz.reductions import normalize_pairs
    from corr_pipeline.viz.render import _edge_label

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
    fig.clear()
