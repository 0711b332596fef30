"""The Examples of the public compute functions (numpydoc sections), run as doctests: what a
reader copies from the docstrings works and prints what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "corr_pipeline.compute.correlation.pairwise",
    "corr_pipeline.compute.neighbors.top_k",
    "corr_pipeline.compute.clusters.linkage",
    "corr_pipeline.compute.lead_lag.pairs",
    "corr_pipeline.compute.lead_lag.residuals",
    "corr_pipeline.compute.market_modes",
    "corr_pipeline.compute.lead_lag.significance",
    "corr_pipeline.compute.changes.drift",
]


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run_as_written(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
