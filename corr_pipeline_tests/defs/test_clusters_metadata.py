"""The clusters asset's singletons (SPEC §5): ``n_singletons`` and ``singleton_share`` (clusters
of one symbol, and their share of the symbols) against a count over the labels one symbol at a
time, and the run summary the demo prints, which reads the share back.

The published rows of a real run are checked in ``test_pipeline.py``
(``test_clusters_without_the_market_mode_are_published_and_reported``)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.defs import metadata
from corr_pipeline.defs.run import SnapshotRunSummary
from corr_pipeline.snapshot import display, verify
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.snapshot.params import SnapshotParameters


def _canonical(raw: np.ndarray) -> np.ndarray:
    """``raw`` relabelled 0..K-1 by first appearance (SPEC §5)."""
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(c), len(first)) for c in raw], dtype=np.int32)


def _brute_force_singletons(labels: np.ndarray) -> int:
    """Clusters of exactly one symbol, counted by comparing every pair of symbols."""
    n = len(labels)
    alone = 0
    for i in range(n):
        if all(labels[j] != labels[i] for j in range(n) if j != i):
            alone += 1
    return alone


@pytest.mark.parametrize("seed", range(6))
def test_singleton_share_is_the_share_of_symbols_alone_in_their_cluster(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    labels = _canonical(rng.integers(0, int(rng.integers(1, n + 1)), n))
    symbols = [f"S{j:03d}" for j in range(n)]
    verdict = verify.verify_clusters(labels, n)
    assert verdict.passed, verdict.problems
    modes = MarketModes(np.array([0.3 * n]), np.full((n, 1), 1 / np.sqrt(n)))
    shown = metadata.clusters(labels, symbols, verdict, StageStats(), modes, SnapshotParameters())
    alone = _brute_force_singletons(labels)
    assert shown["n_singletons"].value == alone
    assert isinstance(shown["singleton_share"], dg.FloatMetadataValue)
    assert shown["singleton_share"].value == display.share(alone / n)


def test_singleton_share_of_all_alone_and_of_one_cluster() -> None:
    params = SnapshotParameters()
    for labels, share in (
        (np.arange(5, dtype=np.int32), 1.0),
        (np.zeros(5, dtype=np.int32), 0.0),
        (np.array([0, 1, 1, 2, 2, 2, 3], dtype=np.int32), display.share(2 / 7)),
    ):
        n = len(labels)
        modes = MarketModes(np.array([1.0]), np.full((n, 1), 1 / np.sqrt(n)))
        verdict = verify.verify_clusters(labels, n)
        shown = metadata.clusters(labels, list("ABCDEFG"[:n]), verdict, StageStats(), modes, params)
        assert shown["singleton_share"].value == share


def test_run_summary_names_the_singleton_share(tmp_path: Path) -> None:
    """'<K> clusters (largest <size>, singleton share <share>)' from the clusters
    materialization's metadata; '?' for what the run did not record."""
    summary = SnapshotRunSummary("2026-11-27", "run", True, tmp_path, tmp_path)
    summary.metadata["clusters"] = {
        "n_clusters": 108,
        "largest_cluster_size": 168,
        "singleton_share": 0.01423,
    }
    assert "108 clusters (largest 168, singleton share 0.0142)" in str(summary)
    summary.metadata["clusters"] = {"n_clusters": 3}
    assert "3 clusters (largest ?, singleton share ?)" in str(summary)
