"""hierarchical_clusters against scipy linkage + fcluster (SPEC §5).

Reference: ``d = sqrt(2 (1 − corr))`` in float64 on the same float32 ``corr`` (NaN → 0, so
``d = sqrt(2)``), ``scipy.cluster.hierarchy.linkage(method)``, ``fcluster`` with the same cut.
Agreement: the identical partition — no tie excuse in SPEC §5, so tied distances (quantised
matrices, all-NaN rows at exactly sqrt(2), duplicate symbols at 0) are compared strictly too. The
implementation's labels must already be canonical: int32 ``0..K−1`` by first appearance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.cluster import hierarchy

try:  # SPEC §9 names the package; test_api_errors checks the export itself.
    from corr_pipeline.compute import hierarchical_clusters
except ImportError:  # pragma: no cover - reported by test_api_errors
    from corr_pipeline.compute.clusters import hierarchical_clusters

from corr_pipeline.compute import pairwise_correlation
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.compute.universes import adversarial_universe, realistic_universe

THRESHOLDS = (0.2, 0.6, 0.9, 1.1, 1.25, 1.35, math.sqrt(2.0), 1.45, 1.7, 2.0, 2.1)


def assert_canonical(labels: np.ndarray, N: int) -> None:
    assert labels.shape == (N,), labels.shape
    assert labels.dtype == np.int32, labels.dtype
    assert np.array_equal(labels, ref.canonical_labels(labels)), (
        "labels not 0..K-1 by first appearance"
    )


def _n_cluster_cuts(N: int) -> list[int]:
    return sorted({n for n in (1, 2, 3, 7, N // 4, N // 2, N - 1, N) if 1 <= n <= N})


def check_all_cuts(corr: np.ndarray, label: str) -> None:
    """Every method, every threshold and cluster count, against the scipy reference."""
    N = corr.shape[0]
    condensed = ref.mantegna_condensed(corr)
    failures = []
    for method in ref.LINKAGE_METHODS:
        Z = hierarchy.linkage(condensed, method=method)
        cuts = [("distance_threshold", t) for t in THRESHOLDS]
        cuts += [("n_clusters", n) for n in _n_cluster_cuts(N)]
        for kind, value in cuts:
            if kind == "distance_threshold":
                expected = hierarchy.fcluster(Z, t=value, criterion="distance")
            else:
                expected = hierarchy.fcluster(Z, t=value, criterion="maxclust")
            expected = ref.canonical_labels(expected)
            labels = hierarchical_clusters(corr, method=method, **{kind: value})
            assert_canonical(labels, N)
            if not np.array_equal(labels, expected):
                failures.append(
                    f"{method} {kind}={value}: {labels.max() + 1} clusters vs "
                    f"{expected.max() + 1}, first difference at symbol "
                    f"{int(np.flatnonzero(labels != expected)[0])}"
                )
    assert not failures, f"{label}: {len(failures)} cuts differ: " + "; ".join(failures[:6])


def _corr_sources():
    universes = [
        realistic_universe(80, 252, 180, 60),
        adversarial_universe(81, 252, 60, 40),  # all-NaN, constant, disjoint, duplicate columns
        adversarial_universe(82, 40, 25, 10),
    ]
    for u in universes:
        yield (
            f"{u.name}-reference",
            ref.reference_correlation(u.R, u.min_overlap)[0].astype(np.float32),
        )
        yield f"{u.name}-kernel", pairwise_correlation(u.R, min_overlap=u.min_overlap).corr


@pytest.mark.parametrize("source", list(_corr_sources()), ids=lambda s: s[0])
def test_matches_scipy(source) -> None:
    label, corr = source
    check_all_cuts(corr, label)


def _quantised_corr(seed: int, N: int, levels: int) -> np.ndarray:
    """A valid-looking symmetric float32 corr with only a few distinct values: many exact ties."""
    rng = np.random.default_rng(seed)
    values = np.linspace(-0.6, 0.9, levels).astype(np.float32)
    upper = values[rng.integers(0, levels, size=(N, N))]
    corr = np.triu(upper, 1)
    corr = corr + corr.T
    np.fill_diagonal(corr, 1.0)
    return corr.astype(np.float32)


@pytest.mark.parametrize(("seed", "levels"), [(0, 3), (1, 5), (2, 12)])
def test_ties(seed: int, levels: int) -> None:
    check_all_cuts(_quantised_corr(seed, 47, levels), f"quantised seed={seed} levels={levels}")


def test_nan_rows_and_duplicates() -> None:
    """NaN rows sit at exactly sqrt(2) from everyone; duplicates at exactly 0."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 12))
    R = np.column_stack([x, x[:, :3], x[:, :1], np.full((120, 4), np.nan)]).astype(np.float32)
    R = R[:, rng.permutation(R.shape[1])]
    corr = ref.reference_correlation(R, 20)[0].astype(np.float32)
    check_all_cuts(corr, "nan rows and duplicates")


def test_all_nan_matrix() -> None:
    corr = np.full((9, 9), np.nan, dtype=np.float32)
    check_all_cuts(corr, "all NaN")
    labels = hierarchical_clusters(corr, distance_threshold=1.0)
    assert labels.tolist() == list(range(9))
    assert hierarchical_clusters(corr, distance_threshold=1.5).tolist() == [0] * 9


def test_one_and_two_symbols() -> None:
    one = np.ones((1, 1), dtype=np.float32)
    for method in ref.LINKAGE_METHODS:
        assert hierarchical_clusters(one, method=method, distance_threshold=0.5).tolist() == [0]
        assert hierarchical_clusters(one, method=method, n_clusters=1).tolist() == [0]
    two = np.array([[1.0, 0.5], [0.5, 1.0]], dtype=np.float32)  # d = 1
    check_all_cuts(two, "N=2")
    assert hierarchical_clusters(two, distance_threshold=0.99).tolist() == [0, 1]
    assert hierarchical_clusters(two, distance_threshold=1.01).tolist() == [0, 0]
    assert hierarchical_clusters(two, n_clusters=2).tolist() == [0, 1]


def test_default_method_is_average() -> None:
    corr = _quantised_corr(4, 30, 20)
    for t in (0.8, 1.2):
        assert np.array_equal(
            hierarchical_clusters(corr, distance_threshold=t),
            hierarchical_clusters(corr, method="average", distance_threshold=t),
        )


def test_working_memory_and_read_only_input(tmp_path) -> None:
    label, corr = next(iter(_corr_sources()))
    np.save(tmp_path / "corr.npy", corr)
    mapped = np.load(tmp_path / "corr.npy", mmap_mode="r")
    baseline = hierarchical_clusters(corr, method="average", distance_threshold=1.1)
    for budget in (0.01, 0.5, 64.0):
        labels = hierarchical_clusters(
            mapped, method="average", distance_threshold=1.1, working_memory_mb=budget
        )
        assert np.array_equal(labels, baseline), budget
    assert np.array_equal(np.load(tmp_path / "corr.npy"), corr, equal_nan=True), "input modified"
