"""Lead-lag pairs over lags 1..L (SPEC §6) and their significance.

:func:`find_lead_lag_pairs` (``pairs.py``) is the entry point, on threads or on a runner's
stripes of leaders; ``scan.py`` is the screened scan (bounds, pools, per-block selection),
``kernels.py`` its compiled kernels, ``striped.py`` the variant in stripes, and
``significance.py`` the Šidák p-values and Benjamini–Hochberg q-values of pairs (the exact
count of every pair's p-value the scan's q-values and ``max_q_value`` need), ``p_values.py``
the p-value of one lag's correlation, compiled.
"""

from corr_pipeline.compute.lead_lag.pairs import find_lead_lag_pairs
from corr_pipeline.compute.lead_lag.scan import LEAD_LAG_DTYPE
from corr_pipeline.compute.lead_lag.significance import Significance, pair_significance

__all__ = ["LEAD_LAG_DTYPE", "Significance", "find_lead_lag_pairs", "pair_significance"]
