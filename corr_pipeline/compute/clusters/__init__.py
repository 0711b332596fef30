"""Hierarchical clusters of the universe (SPEC §5), optionally beyond its market modes.

:func:`hierarchical_clusters` (``linkage.py``) is the entry point: Mantegna distances formed in
row tiles, agglomerative linkage, canonical labels; ``market_modes.py`` finds the strongest
eigenmodes whose rank-m correction the distances may remove.
"""

from corr_pipeline.compute.clusters.linkage import (
    condensed_distances,
    distance_buffer_length,
    hierarchical_clusters,
    linkage_matrix,
)
from corr_pipeline.compute.clusters.market_modes import MarketModes, market_modes

__all__ = [
    "MarketModes",
    "condensed_distances",
    "distance_buffer_length",
    "hierarchical_clusters",
    "linkage_matrix",
    "market_modes",
]
