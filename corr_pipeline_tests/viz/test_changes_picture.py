"""The picture of the distribution of correlation changes (SPEC §10.1)."""

from __future__ import annotations

import numpy as np
import pytest

from corr_pipeline.compute.changes.drift import FINE_PER_BIN
from corr_pipeline.viz.changes import MAX_BINS, change_histogram_png, picture_bins
from corr_pipeline.viz.figures import fit_lines
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


def _night(n: int = 400_000, outliers: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A night's changes: mean |Δ| 0.0044 (normal, sd 0.0055) and a few price-error outliers
    at ±1.5, counted as the scan counts them (80 × FINE_PER_BIN bins over [−2, 2])."""
    rng = np.random.default_rng(3)
    delta = rng.normal(0.0, 0.0055, n)
    delta[:outliers] = np.where(np.arange(outliers) % 2 == 0, 1.5, -1.5)
    edges = np.linspace(-2.0, 2.0, 80 * FINE_PER_BIN + 1)
    return np.histogram(delta, edges)[0], edges, delta


def test_picture_bins_fit_a_night_of_small_changes_despite_outliers():
    counts, edges, delta = _night()
    assert np.count_nonzero(np.histogram(delta, np.linspace(-2, 2, 81))[0]) <= 4  # 0.05 bins
    bins = picture_bins(counts, edges)
    width = float(bins.edges[1] - bins.edges[0])
    np.testing.assert_allclose(np.diff(bins.edges), width)
    assert np.count_nonzero(bins.counts) >= 60 and bins.counts.size <= MAX_BINS
    # the range: the pairs' central 99.8 %, not the outliers at ±1.5
    assert -0.03 < bins.edges[0] < -0.015 and 0.015 < bins.edges[-1] < 0.03
    assert width < 0.001
    # every pair counted once: drawn, or said to lie beyond the range
    assert int(bins.counts.sum()) + bins.below + bins.above == delta.size
    inside = np.count_nonzero((delta >= bins.edges[0]) & (delta < bins.edges[-1]))
    assert inside == int(bins.counts.sum())
    assert bins.below >= 20 and bins.above >= 20  # the outliers among them
    assert bins.below + bins.above <= 2 * 0.001 * delta.size + 40 + 2


def test_picture_bins_of_a_few_pairs_or_none():
    edges = np.linspace(-2.0, 2.0, 80 * FINE_PER_BIN + 1)
    few = np.histogram(np.array([-0.2, 0.0, 0.1, 0.3]), edges)[0]
    bins = picture_bins(few, edges)
    assert int(bins.counts.sum()) == 4 and (bins.below, bins.above) == (0, 0)
    assert bins.edges[0] <= -0.2 and bins.edges[-1] > 0.3 and bins.counts.size <= MAX_BINS
    single = np.zeros(80, np.int64)
    single[40] = 7
    one = picture_bins(single, np.linspace(-2.0, 2.0, 81))
    assert one.counts.tolist() == [7]
    np.testing.assert_allclose(one.edges, [0.0, 0.05], atol=1e-12)
    empty = picture_bins(np.zeros(80, np.int64), np.linspace(-2.0, 2.0, 81))
    assert empty.counts.size == 80 and (empty.below, empty.above) == (0, 0)


def test_change_histogram_draws_the_fine_bins():
    counts, edges, _ = _night()
    png = change_histogram_png(counts, edges, mean_abs_change=0.0044, title="night")
    pixels = decode(png)
    blue = (pixels[..., 2] > 150) & (pixels[..., 0] < 120)
    columns = np.flatnonzero(blue.any(axis=0))
    # the bars span most of the plot's width, not two bars in the middle
    assert columns.size > 0.5 * pixels.shape[1]


def test_a_long_title_is_broken_into_lines_inside_the_picture():
    """The title of changes across a gap ends in a note that would run past the picture's right
    edge on one line: the note goes to a line of its own, and no title text touches the edge."""
    edges = np.linspace(-0.4, 0.3, 15)
    counts = np.array([1, 0, 7, 24, 160, 1200, 13_000, 1_600_000, 2_200_000, 20_000, 500, 30, 2, 2])
    title = "Correlation changes 2014-07-18 → 2020-03-16 (1,423 sessions between: NOT overnight)"
    pixels = decode(change_histogram_png(counts, edges, mean_abs_change=0.01, title=title))
    rows = pixels.shape[0]
    title_band = pixels[: rows // 6, -6:, :]  # above the axes, at the right edge
    assert title_band.min() > 200  # background only: no glyph cut off by the edge


@pytest.mark.parametrize(
    ("text", "width", "lines"),
    [
        ("short title", 20, ["short title"]),
        (
            "changes A → B (8 sessions between: NOT overnight)",
            40,
            ["changes A → B", "(8 sessions between: NOT overnight)"],
        ),
        (
            "changes A → B (8 sessions between: NOT overnight)",
            20,
            ["changes A → B", "(8 sessions between:", "NOT overnight)"],
        ),
        ("one two three four", 9, ["one two", "three", "four"]),
        ("unbreakableword", 5, ["unbreakableword"]),
    ],
)
def test_fit_lines_breaks_before_a_parenthesis_then_between_words(text, width, lines):
    """A text too wide is broken before its last parenthesis whose head fits, then between
    words; nothing is lost and a word wider than the room stays whole."""
    assert fit_lines(text, lambda line: len(line) <= width) == lines


def test_the_figures_at_the_top_stay_above_the_bars():
    """The figures written at the top of the axes (pairs, mean |Δ|, beyond the range, bin
    width) never lie over the bars: the y axis leaves room above the tallest bar."""
    counts, edges, _ = _night()
    pixels = decode(change_histogram_png(counts, edges, mean_abs_change=0.0044, title="night"))
    dark = pixels.max(axis=2) < 90
    blue = (pixels[..., 2] > 150) & (pixels[..., 0] < 120)
    # the axes' frame: the rows and the columns a dark line runs along
    rows = np.flatnonzero(dark.sum(axis=1) > 0.5 * pixels.shape[1])
    columns = np.flatnonzero(dark.sum(axis=0) > 0.4 * pixels.shape[0])
    inside = np.s_[rows.min() + 2 : rows.max() - 1, columns.min() + 2 : columns.max() - 1]
    text_rows = np.flatnonzero(dark[inside].any(axis=1))
    bar_rows = np.flatnonzero(blue[inside].any(axis=1))
    assert text_rows.size and bar_rows.size
    assert text_rows.max() < bar_rows.min()
