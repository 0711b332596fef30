"""The picture of the changes against the previous session (SPEC §10): PNG bytes, pure numpy.

``change_histogram_png(counts, edges)``
    The histogram of ``Δ = corr_today − corr_previous`` over the compared pairs (SPEC §10.1) as
    filled stairs on a log scale (the tails are the interesting part), zero marked, with the
    number of pairs and the mean ``|Δ|``.
"""

from __future__ import annotations

import numpy as np

from corr_pipeline.viz.figures import (
    DEFAULT_MAX_PNG_BYTES,
    figure_png,
    new_figure,
    set_title,
)

__all__ = ["change_histogram_png"]


def change_histogram_png(
    counts: np.ndarray,
    edges: np.ndarray,
    *,
    mean_abs_change: float,
    title: str,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
) -> bytes:
    """PNG of the distribution of correlation changes; ``counts`` (bins) over ``edges``
    (bins + 1, ascending)."""
    counts = np.asarray(counts)
    edges = np.asarray(edges, dtype=np.float64)
    if counts.ndim != 1 or edges.shape != (counts.size + 1,):
        raise ValueError(f"edges must have len(counts) + 1 = {counts.size + 1} values")
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
    n = int(counts.sum())
    ax.text(
        0.99,
        0.97,
        f"pairs {n:,}\nmean |Δ| {mean_abs_change:.4f}" if n else "no pairs",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        parse_math=False,
    )
    set_title(ax, title, "pairs present on both days with enough overlap")
    return figure_png(fig, max_bytes=max_bytes)
