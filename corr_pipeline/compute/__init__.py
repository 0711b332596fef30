"""The numerical core: pure numpy/scipy/numba, no database, no Dagster, no paths (SPEC §9).

pairwise_correlation   SPEC §3   tiled pairwise-complete correlation and overlap
top_k_neighbors        SPEC §4   per-symbol strongest |corr| neighbors
hierarchical_clusters  SPEC §5   Mantegna distance, agglomerative linkage, canonical labels
find_lead_lag_pairs    SPEC §6   exact best-lag scan and per-symbol selection
pair_significance      SPEC §6   Šidák p-values and Benjamini–Hochberg q-values of pairs
"""

from corr_pipeline.compute.clusters import hierarchical_clusters
from corr_pipeline.compute.correlation import CorrelationResult, pairwise_correlation
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE, find_lead_lag_pairs
from corr_pipeline.compute.lead_lag.significance import Significance, pair_significance
from corr_pipeline.compute.neighbors import Neighbors, top_k_neighbors

__all__ = [
    "LEAD_LAG_DTYPE",
    "CorrelationResult",
    "Neighbors",
    "Significance",
    "find_lead_lag_pairs",
    "hierarchical_clusters",
    "pair_significance",
    "pairwise_correlation",
    "top_k_neighbors",
]
