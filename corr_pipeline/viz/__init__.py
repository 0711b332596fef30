"""Pictures of a snapshot, without Dagster: block-wise reductions of the N x N matrices within a
memory budget (:mod:`~corr_pipeline.viz.reductions`) and their matplotlib PNG rendering
(:mod:`~corr_pipeline.viz.render`, :mod:`~corr_pipeline.viz.network`, :mod:`~corr_pipeline.viz.figures`). The Dagster metadata built from them lives in
:mod:`corr_pipeline.defs.pictures`."""

from corr_pipeline.viz.figures import DEFAULT_MAX_PNG_BYTES, png_data_uri, png_markdown
from corr_pipeline.viz.network import (
    EDGE_LABEL_GID,
    LEGEND_GID,
    NODE_LABEL_GID,
    lead_lag_network_figure,
    lead_lag_network_png,
)
from corr_pipeline.viz.reductions import (
    CorrelationHistogram,
    HeatmapGrid,
    cluster_order,
    correlation_histogram,
    heatmap_grid,
    normalize_pairs,
)
from corr_pipeline.viz.render import clustered_heatmap_png, correlation_histogram_png

__all__ = [
    "DEFAULT_MAX_PNG_BYTES",
    "EDGE_LABEL_GID",
    "LEGEND_GID",
    "NODE_LABEL_GID",
    "CorrelationHistogram",
    "HeatmapGrid",
    "cluster_order",
    "clustered_heatmap_png",
    "correlation_histogram",
    "correlation_histogram_png",
    "heatmap_grid",
    "lead_lag_network_figure",
    "lead_lag_network_png",
    "normalize_pairs",
    "png_data_uri",
    "png_markdown",
]
