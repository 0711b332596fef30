"""The numerical core: pure numpy/scipy/numba, no database, no Dagster, no paths (SPEC §9).

pairwise_correlation   SPEC §3   tiled pairwise-complete correlation and overlap
top_k_neighbors        SPEC §4   per-symbol strongest |corr| neighbors
hierarchical_clusters  SPEC §5   Mantegna distance, agglomerative linkage, canonical labels
find_lead_lag_pairs    SPEC §6   exact best-lag scan and per-symbol selection
"""

from corr_pipeline.compute.correlation import CorrelationResult, pairwise_correlation
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE, find_lead_lag_pairs

__all__ = [
    "LEAD_LAG_DTYPE",
    "CorrelationResult",
    "find_lead_lag_pairs",
    "pairwise_correlation",
]
