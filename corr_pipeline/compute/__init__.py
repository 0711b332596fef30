"""The numerical core: pure numpy/scipy/numba, no database, no Dagster, no paths (SPEC §9).

One subpackage per algorithm, each owning its entry point, its kernels and (where a cluster can
share the work) its striped variant; the entry points take ``runner=None`` (this process's
threads) or a :class:`~corr_pipeline.compute.parallel.runners.StripeRunner`:

pairwise_correlation   correlation/   SPEC §3   tiled pairwise-complete correlation and overlap
top_k_neighbors        neighbors/     SPEC §4   per-symbol strongest |corr| neighbors
hierarchical_clusters  clusters/      SPEC §5   Mantegna distance, linkage, canonical labels
find_lead_lag_pairs    lead_lag/      SPEC §6   exact best-lag scan and per-symbol selection
pair_significance      lead_lag/      SPEC §6   robust Šidák p-values, Benjamini–Hochberg q-values
market_residuals       lead_lag/      SPEC §6   returns less their strongest eigenportfolios
market_modes           market_modes   SPEC §5   the strongest eigenmodes of corr (block Lanczos)
correlation_changes    changes/       SPEC §10  drift and largest moves between two sessions

Shared at the root: validation, tiling (the one chunking helper), the standardised window,
the worker threads, the register transposes, the running top-k (``top_k.py``) and the market
modes the clusters and the lead-lag's residuals share (``market_modes.py``).
"""

from corr_pipeline.compute.clusters import hierarchical_clusters
from corr_pipeline.compute.correlation import CorrelationResult, pairwise_correlation
from corr_pipeline.compute.lead_lag import (
    LEAD_LAG_DTYPE,
    Significance,
    find_lead_lag_pairs,
    market_residuals,
    pair_significance,
)
from corr_pipeline.compute.market_modes import MarketModes, market_modes
from corr_pipeline.compute.neighbors import Neighbors, top_k_neighbors

__all__ = [
    "LEAD_LAG_DTYPE",
    "CorrelationResult",
    "MarketModes",
    "Neighbors",
    "Significance",
    "find_lead_lag_pairs",
    "hierarchical_clusters",
    "market_modes",
    "market_residuals",
    "pair_significance",
    "pairwise_correlation",
    "top_k_neighbors",
]
