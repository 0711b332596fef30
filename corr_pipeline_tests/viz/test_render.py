"""Rendering (corr_pipeline.viz.render): valid PNGs under the size cap, odd symbol names drawn
verbatim."""

from __future__ import annotations

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
