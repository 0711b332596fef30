"""The picture of the changes against the previous session (SPEC §10): PNG bytes, pure numpy.

``change_histogram_png(counts, edges)``
    The histogram of ``Δ = corr_today − corr_previous`` over the compared pairs (SPEC §10.1) as
    filled stairs on a log scale (the tails are the interesting part), zero marked, with the
    number of pairs and the mean ``|Δ|``. Its bins are chosen from the data
    (:func:`picture_bins`): a night's changes are typically a few thousandths wide, which the
    recorded 0.05-wide bins would put into two bars.

``picture_bins(counts, edges)``
    Re-bins a fine histogram (:data:`corr_pipeline.compute.changes.drift.FINE_PER_BIN` bins per
    recorded bin) to the range its pairs fill, the 0.1 % in each tail left out (outliers do not
    stretch the picture; their count is shown), at the Freedman–Diaconis width
    ``2 · IQR / n^(1/3)``, between :data:`MIN_BINS` and :data:`MAX_BINS` bins over that range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from corr_pipeline.viz.figures import (
    DEFAULT_MAX_PNG_BYTES,
    figure_png,
    new_figure,
    quiet_drawing,
    set_title,
)

__all__ = ["MAX_BINS", "MIN_BINS", "TAIL", "PictureBins", "change_histogram_png", "picture_bins"]

#: The share of pairs in each tail left out of the range the picture shows.
TAIL = 0.001
#: The fewest and the most bins the picture draws over its range (when the input is that fine).
MIN_BINS = 10
MAX_BINS = 120


@dataclass(frozen=True)
class PictureBins:
    """The bins a picture draws: ``counts`` over ``edges`` (``len(counts) + 1``, ascending,
    equally spaced), and the pairs ``below`` and ``above`` the range they cover."""

    counts: np.ndarray
    edges: np.ndarray
    below: int
    above: int


def _check(counts: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(counts)
    edges = np.asarray(edges, dtype=np.float64)
    if counts.ndim != 1 or edges.shape != (counts.size + 1,):
        raise ValueError(f"edges must have len(counts) + 1 = {counts.size + 1} values")
    return counts.astype(np.int64), edges


def picture_bins(
    counts: np.ndarray, edges: np.ndarray, *, min_bins: int = MIN_BINS, max_bins: int = MAX_BINS
) -> PictureBins:
    """The bins of the picture of a histogram ``counts`` over equally spaced ``edges``: whole
    runs of its bins (so every count stays exact), over the bins from the one holding the
    :data:`TAIL` quantile to the one holding the ``1 − TAIL`` quantile, each run as close to the
    Freedman–Diaconis width ``2 · IQR / n^(1/3)`` as keeps the bins over that range between
    ``min_bins`` and ``max_bins`` (one input bin at the finest). With no pair, the input as is."""
    counts, edges = _check(counts, edges)
    n = int(counts.sum())
    if n == 0:
        return PictureBins(counts, edges, 0, 0)
    cumulative = np.cumsum(counts)

    def holding(share: float) -> int:
        """The bin holding the pair of rank ``ceil(share · n)`` (at least the first)."""
        rank = max(1, math.ceil(share * n))
        return int(np.searchsorted(cumulative, rank))

    first, last = holding(TAIL), holding(1.0 - TAIL)
    width = float(edges[1] - edges[0])
    span = last - first + 1  # input bins in the range shown
    iqr = max(float(edges[holding(0.75) + 1] - edges[holding(0.25)]), width)
    fd_bins = math.ceil(span * width / (2.0 * iqr / n ** (1.0 / 3.0)))
    wanted = min(max(fd_bins, min_bins), max_bins)
    per_bin = max(1, round(span / wanted))
    groups = math.ceil(span / per_bin)
    taken = counts[first : first + groups * per_bin]  # the last run may reach past ``last``
    padded = np.zeros(groups * per_bin, np.int64)  # zeros only beyond the input's last bin
    padded[: taken.size] = taken
    grouped = padded.reshape(groups, per_bin).sum(axis=1)
    grouped_edges = edges[first] + width * per_bin * np.arange(groups + 1, dtype=np.float64)
    below = int(cumulative[first - 1]) if first else 0
    return PictureBins(grouped, grouped_edges, below, n - below - int(grouped.sum()))


def change_histogram_png(
    counts: np.ndarray,
    edges: np.ndarray,
    *,
    mean_abs_change: float,
    title: str,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the distribution of correlation changes; ``counts`` (bins) over ``edges``
    (bins + 1, ascending, equally spaced), drawn in the bins :func:`picture_bins` chooses."""
    bins = picture_bins(counts, edges)
    counts, edges = bins.counts, bins.edges
    fig, ax = new_figure(6.4, 4.0)
    shown = np.where(counts > 0, counts, np.nan)  # empty bins are not drawn on the log scale
    ax.stairs(shown, edges, fill=True, color="#4c72b0", alpha=0.85)
    used = np.flatnonzero(counts)
    if used.size:  # nothing to put on a log scale otherwise
        ax.set_yscale("log")
        ax.set_xlim(edges[used[0]], edges[used[-1] + 1])
    ax.axvline(0.0, color="grey", linewidth=0.6)
    ax.set_xlabel("corr today − corr previous session")
    ax.set_ylabel("pairs (log scale)")
    n = int(counts.sum()) + bins.below + bins.above
    text = f"pairs {n:,}\nmean |Δ| {mean_abs_change:.4f}" if n else "no pairs"
    if bins.below or bins.above:
        text += f"\nbeyond the range shown: {bins.below:,} below, {bins.above:,} above"
    if n:
        text += f"\nbin width {float(edges[1] - edges[0]):.2g}"
    note = ax.text(
        0.99,
        0.97,
        text,
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        parse_math=False,
    )
    set_title(ax, title, "pairs present on both days with enough overlap")
    if used.size:
        _room_above_bars(fig, ax, note, float(counts.max()))
    return figure_png(fig, max_bytes=max_bytes)


def _room_above_bars(fig: Any, ax: Any, note: Any, tallest: float) -> None:
    """Raise the top of the log y axis so that the tallest bar (``tallest`` pairs) ends below
    ``note``, the figures at the top of the axes: the share of the axes' height the note takes
    (measured once the figure is laid out, plus a small gap) is left above the bars."""
    with quiet_drawing():
        fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    share = min(0.6, (box.y1 - note.get_window_extent(renderer).y0 + 4.0) / box.height)
    low, high = (math.log10(v) for v in ax.get_ylim())
    top = low + (math.log10(tallest) - low) / (1.0 - share)
    if top > high:
        ax.set_ylim(top=10.0**top)
