"""Pairwise-complete correlation and overlap (SPEC §3).

:func:`pairwise_correlation` is the entry point, on threads or on a runner's stripes;
``correlator.py`` issues the products, ``kernels.py`` turns them into ``corr`` and ``overlap``,
``striped.py`` is the variant in stripes of rows.
"""

from corr_pipeline.compute.correlation.correlator import PairCorrelator
from corr_pipeline.compute.correlation.pairwise import CorrelationResult, pairwise_correlation

__all__ = ["CorrelationResult", "PairCorrelator", "pairwise_correlation"]
