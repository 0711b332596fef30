"""Lead-lag pairs over lags 1..L (SPEC §6) and their significance.

:func:`find_lead_lag_pairs` (``pairs.py``) is the entry point, on threads or on a runner's
stripes of leaders (``striped.py``); ``sweep.py`` is the sweep over every pair's float32
products (its compiled kernels ``sweep_kernels.py``): each pair's robust statistic counted for
the q-values with a proved bound, and the bounds of its improvement; ``scan.py`` the selection
from those bounds, ``kernels.py`` the exact per-pair evaluation and the selections' kernels;
``significance.py`` the Šidák p-values and Benjamini–Hochberg q-values, ``p_values.py`` the
p-value of one lag's statistic and its histogram bin; ``residuals.py`` the market residuals
the pipeline scans (:func:`market_residuals`).
"""

from corr_pipeline.compute.lead_lag.pairs import find_lead_lag_pairs
from corr_pipeline.compute.lead_lag.residuals import market_residuals
from corr_pipeline.compute.lead_lag.scan import LEAD_LAG_DTYPE
from corr_pipeline.compute.lead_lag.significance import Significance, pair_significance

__all__ = [
    "LEAD_LAG_DTYPE",
    "Significance",
    "find_lead_lag_pairs",
    "market_residuals",
    "pair_significance",
]
