"""The picture of the distribution of correlation changes (SPEC §10.1)."""

from __future__ import annotations

import numpy as np
import pytest

from corr_pipeline.viz.changes import change_histogram_png
from corr_pipeline_tests.viz.helpers import decode


def test_change_histogram_is_a_small_png_with_the_bars_drawn():
    edges = np.linspace(-2.0, 2.0, 81)
    counts = np.zeros(80, np.int64)
    counts[38:42] = [10, 5000, 4800, 12]  # the mass near 0, tails on a log scale
    png = change_histogram_png(counts, edges, mean_abs_change=0.01, title="changes")
    pixels = decode(png)
    assert len(png) <= 200_000 and pixels.shape[2] == 3
    blue = (pixels[..., 2] > 150) & (pixels[..., 0] < 120)
    assert blue.sum() > 100  # the stairs are drawn
    empty = change_histogram_png(np.zeros(80, np.int64), edges, mean_abs_change=0.0, title="x")
    assert decode(empty).shape == pixels.shape
    with pytest.raises(ValueError, match="edges must have"):
        change_histogram_png(counts, edges[:-1], mean_abs_change=0.0, title="x")
