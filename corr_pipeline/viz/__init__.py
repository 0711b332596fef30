"""Pictures of a snapshot, without Dagster: block-wise reductions of the N x N matrices within a
memory budget (:mod:`~corr_pipeline.viz.reductions`) and their matplotlib PNG rendering
(:mod:`~corr_pipeline.viz.render`). The Dagster metadata built from them lives in
:mod:`corr_pipeline.defs.pictures`."""

from corr_pipeline.viz.reductions import (
    CorrelationHistogram,
    HeatmapGrid,
    cluster_order,
    correlation_histogram,
    heatmap_grid,
    normalize_pairs,
)
from corr_pipeline.viz.render import (
    DEFAULT_MAX_PNG_BYTES,
    EDGE_LABEL_GID,
    NODE_LABEL_GID,
    clustered_heatmap_png,
    correlation_histogram_png,
    lead_lag_network_figure,
    lead_lag_network_png,
    png_data_uri,
    png_markdown,
)

__all__ = [
    "DEFAULT_MAX_PNG_BYTES",
    "EDGE_LABEL_GID",
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
