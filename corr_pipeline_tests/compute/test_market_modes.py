"""Clusters with the market modes removed, against numpy ``eigh`` + scipy (SPEC §5).

Reference: the dense float64 ``C`` (NaN → 0, unit diagonal) of the pipeline's own float32
``corr``, ``numpy.linalg.eigh``, ``C_m`` from its ``m`` largest eigenpairs, Mantegna distances,
``scipy.cluster.hierarchy.linkage`` and ``fcluster`` with the same cut. Agreement: the identical
partition, except where a merge height of the reference lies within 1e-9 of another (then the
order of the tied merges may differ). The eigenmodes themselves must match ``eigh``'s to 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster import hierarchy

from corr_pipeline.compute import hierarchical_clusters, pairwise_correlation
from corr_pipeline.compute.market_modes import market_modes, residual_correlation
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.compute.universes import adversarial_universe, realistic_universe

CUTS = (
    {"distance_threshold": 1.0},
    {"distance_threshold": 1.2},
    {"distance_threshold": 1.35},
    {"n_clusters": 5},
    {"n_clusters": 12},
)


def _gapped(seed: int, T: int, N: int) -> np.ndarray:
    """A ragged universe where a third of the symbols trade only in the first 40 % of the
    window and a third only in the last 40 %: those pairs never overlap (NaN corr)."""
    R = realistic_universe(seed, T, N, 30).R.copy()
    early, late = np.arange(0, N, 3), np.arange(1, N, 3)
    R[int(0.4 * T) :, early] = np.nan
    R[: int(0.6 * T), late] = np.nan
    return R


UNIVERSES = {  # name: (returns, min_overlap)
    "ragged_N60": lambda: (realistic_universe(31, 252, 60, 60).R, 60),
    "ragged_N257": lambda: (realistic_universe(32, 252, 257, 60).R, 60),
    "gapped_N150": lambda: (_gapped(33, 252, 150), 30),
    "short_N400": lambda: (realistic_universe(34, 120, 400, 40).R, 40),
}


def _corr(name: str) -> np.ndarray:
    R, min_overlap = UNIVERSES[name]()
    return pairwise_correlation(R, min_overlap=min_overlap).corr


def _reference_labels(corr: np.ndarray, m: int, method: str, cut: dict) -> tuple:
    C_m, _, _ = ref.market_modes_removed_reference(corr, m)
    Z = hierarchy.linkage(ref.mantegna_condensed(np.minimum(C_m, 1.0)), method=method)
    if "distance_threshold" in cut:
        labels = hierarchy.fcluster(Z, t=cut["distance_threshold"], criterion="distance")
    else:
        labels = hierarchy.fcluster(Z, t=cut["n_clusters"], criterion="maxclust")
    return ref.canonical_labels(labels), Z


def _near_tie(Z: np.ndarray, tol: float = 1e-9) -> bool:
    heights = np.sort(Z[:, 2])
    return bool(np.any(np.diff(heights) < tol))


@pytest.mark.parametrize("name", list(UNIVERSES))
def test_modes_match_eigh(name) -> None:
    corr = _corr(name)
    _, w, V = ref.market_modes_removed_reference(corr, 3)
    modes = market_modes(corr, 3)
    assert modes.eigenvalues.shape == (3,) and modes.vectors.shape == (corr.shape[0], 3)
    np.testing.assert_allclose(modes.eigenvalues, w, rtol=1e-10, atol=0)
    np.testing.assert_allclose(modes.share, w / corr.shape[0], rtol=1e-10)
    # the rank-3 correction, row block by row block, equals the dense reference
    C_m, _, _ = ref.market_modes_removed_reference(corr, 3)
    for row0 in range(0, corr.shape[0], 37):
        rows = residual_correlation(corr[row0 : row0 + 37], row0, modes)
        finite = np.isfinite(C_m[row0 : row0 + 37])
        assert np.array_equal(np.isfinite(rows), finite)
        np.testing.assert_allclose(rows[finite], C_m[row0 : row0 + 37][finite], atol=1e-10)


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("name", list(UNIVERSES))
def test_clusters_match_eigh_and_scipy(name, m) -> None:
    corr = _corr(name)
    failures = []
    for method in ("average", "single", "complete", "weighted"):
        for cut in CUTS:
            labels = hierarchical_clusters(corr, method=method, market_modes_removed=m, **cut)
            expected, Z = _reference_labels(corr, m, method, cut)
            if not np.array_equal(labels, expected) and not _near_tie(Z):
                failures.append(f"{method} {cut}")
    assert not failures, f"{name} m={m}: partitions differ for {failures}"


def test_removing_the_market_changes_the_partition() -> None:
    """On a one-factor-plus-sectors universe the market mode joins everything at the default
    cut; without it the sectors come apart (the reason for the parameter)."""
    rng = np.random.default_rng(5)
    T, N, sectors = 252, 120, 6
    market, sector = rng.standard_normal((T, 1)), rng.standard_normal((T, sectors))
    of = np.arange(N) % sectors
    R = (1.6 * market + 1.0 * sector[:, of] + rng.standard_normal((T, N))).astype(np.float32)
    corr = pairwise_correlation(R, min_overlap=60).corr
    plain = hierarchical_clusters(corr, distance_threshold=1.2)
    without = hierarchical_clusters(corr, distance_threshold=1.2, market_modes_removed=1)
    assert plain.max() + 1 == 1
    assert without.max() + 1 == sectors
    assert all(len(set(of[without == k])) == 1 for k in range(sectors))


def test_given_modes_equal_computed_and_memmap(tmp_path) -> None:
    R = realistic_universe(36, 252, 90, 60).R
    corr = pairwise_correlation(R, min_overlap=60).corr
    path = tmp_path / "corr.npy"
    np.save(path, corr)
    mapped = np.load(path, mmap_mode="r")
    modes = market_modes(mapped, 3)
    again = market_modes(corr, 3)
    np.testing.assert_array_equal(modes.eigenvalues, again.eigenvalues)  # deterministic
    for m in (1, 2):
        computed = hierarchical_clusters(mapped, distance_threshold=1.1, market_modes_removed=m)
        given = hierarchical_clusters(
            corr, distance_threshold=1.1, market_modes_removed=m, modes=modes
        )
        assert np.array_equal(computed, given)
        small = hierarchical_clusters(
            corr, distance_threshold=1.1, market_modes_removed=m, working_memory_mb=0.05
        )
        assert np.array_equal(computed, small)


def test_small_universes_and_whole_space() -> None:
    """N = 2 .. 6: the Krylov subspace reaches the whole space, and the modes are exact."""
    rng = np.random.default_rng(7)
    for n in range(2, 7):
        R = rng.standard_normal((80, n)).astype(np.float32) + rng.standard_normal((80, 1))
        corr = pairwise_correlation(R.astype(np.float32), min_overlap=30).corr
        _, w, _ = ref.market_modes_removed_reference(corr, n - 1)
        np.testing.assert_allclose(market_modes(corr, n - 1).eigenvalues, w, rtol=1e-12)
        labels = hierarchical_clusters(corr, n_clusters=1, market_modes_removed=n - 1)
        assert labels.tolist() == [0] * n


def test_bad_arguments_say_what() -> None:
    corr = pairwise_correlation(
        np.random.default_rng(8).standard_normal((60, 5)).astype(np.float32), min_overlap=30
    ).corr
    with pytest.raises(ValueError, match=r"market_modes_removed must be in 0 \.\. N−1 = 4"):
        hierarchical_clusters(corr, distance_threshold=1.2, market_modes_removed=5)
    with pytest.raises(ValueError, match="market_modes_removed must be in"):
        hierarchical_clusters(corr, distance_threshold=1.2, market_modes_removed=-1)
    with pytest.raises(TypeError, match="must be an integer"):
        hierarchical_clusters(corr, distance_threshold=1.2, market_modes_removed=1.5)
    with pytest.raises(ValueError, match="1 mode"):
        hierarchical_clusters(
            corr, distance_threshold=1.2, market_modes_removed=2, modes=market_modes(corr, 1)
        )
    bad = corr.copy()
    bad[0, 1] = bad[1, 0] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        market_modes(bad, 1)


def test_adversarial_columns_are_handled() -> None:
    """All-NaN, constant and duplicate columns: an isolated symbol has no residual to remove
    (its row of C is e_i), duplicates stay together; partitions agree up to near ties."""
    u = adversarial_universe(41, 252, 60, 40)
    corr = pairwise_correlation(u.R, min_overlap=u.min_overlap).corr
    for m in (1, 2):
        labels = hierarchical_clusters(corr, distance_threshold=1.2, market_modes_removed=m)
        expected, Z = _reference_labels(corr, m, "average", {"distance_threshold": 1.2})
        assert np.array_equal(labels, expected) or _near_tie(Z)
