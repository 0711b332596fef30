"""Pictures as Dagster metadata: the PNGs of :mod:`corr_pipeline.viz` in ``MetadataValue.md``.

Each picture is a markdown image ``![alt](data:image/png;base64,...)`` (see
:func:`corr_pipeline.viz.png_markdown`), keyed ``picture: <what it shows>``
(:mod:`corr_pipeline.defs.metadata_order`): the Dagster UI opens it in a dialog behind a
"[Show Markdown]" button, so the key is what says it is a picture. The ``*_metadata``
builders return ready-made metadata dicts for the assets. Memory is that of the reductions in
:mod:`corr_pipeline.viz.reductions` (row blocks within ``working_memory_mb``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dagster as dg
import numpy as np

from corr_pipeline import viz
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.defs.metadata_order import picture_key
from corr_pipeline.snapshot import display

__all__ = [
    "change_histogram_metadata",
    "heatmap_metadata",
    "histogram_metadata",
    "lead_lag_network_metadata",
    "png_metadata",
]


def png_metadata(png: bytes, alt: str = "image") -> dg.MarkdownMetadataValue:
    """``MetadataValue.md`` showing the PNG in the Dagster UI."""
    return dg.MetadataValue.md(viz.png_markdown(png, alt))


def heatmap_metadata(
    corr: np.ndarray,
    labels: Sequence[int] | np.ndarray | None = None,
    *,
    order: Sequence[int] | np.ndarray | None = None,
    max_pixels: int = 512,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> dict[str, Any]:
    """``{"picture: clustered heatmap": <clustered heatmap>}`` (:func:`corr_pipeline.viz.clustered_heatmap_png`)."""
    png = viz.clustered_heatmap_png(
        corr, labels, order=order, max_pixels=max_pixels, working_memory_mb=working_memory_mb
    )
    return {picture_key("clustered heatmap"): png_metadata(png, "clustered correlation heatmap")}


def histogram_metadata(
    corr: np.ndarray,
    *,
    max_values: int | None = 20_000_000,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> dict[str, Any]:
    """Histogram picture plus numeric facts (plotted by the UI across partitions):
    ``picture: correlation histogram`` (md), ``corr_mean``, ``corr_median`` (linear inside its bin),
    ``corr_nan_share`` (rounded by :mod:`corr_pipeline.snapshot.display`: correlations to 4
    decimals, the share to 4 significant digits), each left out when not finite."""
    h = viz.correlation_histogram(corr, max_values=max_values, working_memory_mb=working_memory_mb)
    png = viz.correlation_histogram_png(histogram=h)
    out: dict[str, Any] = {
        picture_key("correlation histogram"): png_metadata(png, "correlation histogram")
    }
    for key, value, rule in (
        ("corr_mean", h.mean, display.corr),
        ("corr_median", h.quantile(0.5), display.corr),
        ("corr_nan_share", h.nan_share, display.share),
    ):
        if math.isfinite(value):
            out[key] = dg.MetadataValue.float(rule(value))
    return out


def lead_lag_network_metadata(
    pairs: np.ndarray, symbols: Sequence[str], *, top: int = 30, max_q_value: float = 1.0
) -> dict[str, Any]:
    """``{"picture: lead-lag network": <picture of the top pairs>}``
    (:func:`corr_pipeline.viz.lead_lag_network_png`); ``pairs`` is the structured array of
    :func:`corr_pipeline.compute.find_lead_lag_pairs`; the two-way pairs (SPEC §6 "Direction":
    the reverse pair's q-value is at most ``max_q_value``, the snapshot's parameter) are drawn
    double-headed, as the picture's legend says."""
    png = viz.lead_lag_network_png(pairs, symbols, top=top, max_q_value=max_q_value)
    return {picture_key("lead-lag network"): png_metadata(png, "lead-lag network")}


def change_histogram_metadata(
    counts: np.ndarray, edges: np.ndarray, *, mean_abs_change: float, title: str
) -> dict[str, Any]:
    """``{"picture: correlation changes": <distribution of correlation changes>}``
    (:func:`corr_pipeline.viz.changes.change_histogram_png`, SPEC §10.1): ``counts`` over
    ``edges``, best the scan's fine ones, which the picture re-bins to fit the data."""
    from corr_pipeline.viz.changes import change_histogram_png

    png = change_histogram_png(counts, edges, mean_abs_change=mean_abs_change, title=title)
    return {
        picture_key("correlation changes"): png_metadata(png, "distribution of correlation changes")
    }
