"""The store versions a publication pins (``steps.matrix_versions``, SPEC §8): the bundles it
publishes from, and the correlation / overlap / returns versions those were computed from."""

from __future__ import annotations

import os

import numpy as np
import pytest

from corr_pipeline.snapshot import steps
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore, sources

P = "2026-10-30"


def _bundle(store: MatrixStore, asset: str, arrays: dict, inputs=None) -> MatrixBundle:
    store.save_bundle(asset, P, MatrixBundle(arrays, inputs=inputs or {}))
    return store.load_bundle(asset, P)


def _chain(store: MatrixStore, corr_value: float = 0.5):
    returns = _bundle(store, "returns_matrix", {"returns": np.ones((4, 3), np.float32)})
    corr = _bundle(
        store,
        "correlation_matrix",
        {"corr": np.full((3, 3), corr_value, np.float32)},
        sources(returns),
    )
    overlap = _bundle(store, "overlap_matrix", {"overlap": np.full((3, 3), 4, np.int16)})
    return returns, corr, overlap


def _consumers(store, returns, corr, overlap, clusters_corr=None):
    neighbors = _bundle(
        store, "top_k_neighbors", {"index": np.zeros((3, 2), np.int32)}, sources(corr, overlap)
    )
    clusters = _bundle(
        store, "clusters", {"labels": np.zeros(3, np.int32)}, sources(clusters_corr or corr)
    )
    lead_lag = _bundle(
        store, "lead_lag_pairs", {"pairs": np.zeros(2, np.int64)}, sources(returns, corr)
    )
    return neighbors, clusters, lead_lag


def test_pins_what_the_published_bundles_were_computed_from(tmp_path):
    store = MatrixStore(tmp_path)
    returns, corr, overlap = _chain(store)
    neighbors, clusters, lead_lag = _consumers(store, returns, corr, overlap)
    # a re-run has committed a newer correlation since: the pins stay on what was read
    _bundle(store, "correlation_matrix", {"corr": np.zeros((3, 3), np.float32)})
    versions = steps.matrix_versions(
        store, P, returns=returns, neighbors=neighbors, clusters=clusters, lead_lag=lead_lag
    )
    assert versions == {
        "returns_matrix": returns.versions,
        "correlation_matrix": corr.versions,
        "overlap_matrix": overlap.versions,
        "top_k_neighbors": neighbors.versions,
        "clusters": clusters.versions,
        "lead_lag_pairs": lead_lag.versions,
    }


def test_two_correlation_versions_are_accepted_only_with_identical_contents(tmp_path):
    """Two runs of one partition at once: neighbors and clusters may have read two versions of
    the correlation matrix. Identical contents (same inputs): fine, one is pinned. Different
    contents: refused, nothing consistent could be published."""
    store = MatrixStore(tmp_path)
    returns, corr, overlap = _chain(store)
    twin = _bundle(
        store,
        "correlation_matrix",
        {"corr": np.full((3, 3), 0.5, np.float32)},
        sources(returns),
    )
    assert twin.versions != corr.versions
    neighbors, clusters, lead_lag = _consumers(store, returns, corr, overlap, clusters_corr=twin)
    versions = steps.matrix_versions(
        store, P, returns=returns, neighbors=neighbors, clusters=clusters, lead_lag=lead_lag
    )
    assert versions["correlation_matrix"] == corr.versions  # what the neighbors read

    other = _bundle(
        store,
        "correlation_matrix",
        {"corr": np.full((3, 3), 0.25, np.float32)},
        sources(returns),
    )
    neighbors, clusters, lead_lag = _consumers(store, returns, corr, overlap, clusters_corr=other)
    with pytest.raises(steps.InconsistentInputsError, match="re-materialize the whole partition"):
        steps.matrix_versions(
            store, P, returns=returns, neighbors=neighbors, clusters=clusters, lead_lag=lead_lag
        )


def test_a_pinned_version_must_still_be_there(tmp_path):
    store = MatrixStore(tmp_path)
    returns, corr, overlap = _chain(store)
    neighbors, clusters, lead_lag = _consumers(store, returns, corr, overlap)
    os.unlink(corr.stored("corr").path)
    with pytest.raises(steps.InconsistentInputsError, match="no longer in the store"):
        steps.matrix_versions(
            store, P, returns=returns, neighbors=neighbors, clusters=clusters, lead_lag=lead_lag
        )
