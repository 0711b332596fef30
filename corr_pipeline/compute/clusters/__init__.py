"""Hierarchical clusters of the universe (SPEC §5), optionally beyond its market modes.

:func:`hierarchical_clusters` (``linkage.py``) is the entry point: Mantegna distances formed in
row tiles, agglomerative linkage, canonical labels; the strongest eigenmodes whose rank-m
correction the distances may remove come from :mod:`corr_pipeline.compute.market_modes`, which
the lead-lag's market residuals share.
"""

from corr_pipeline.compute.clusters.linkage import (
    condensed_distances,
    distance_buffer_length,
    hierarchical_clusters,
    linkage_matrix,
)

__all__ = [
    "condensed_distances",
    "distance_buffer_length",
    "hierarchical_clusters",
    "linkage_matrix",
]
