"""The numerical core: pure numpy/scipy/numba, no database, no Dagster, no paths (SPEC §9)."""

from corr_pipeline.compute.correlation import CorrelationResult, pairwise_correlation

__all__ = ["CorrelationResult", "pairwise_correlation"]
