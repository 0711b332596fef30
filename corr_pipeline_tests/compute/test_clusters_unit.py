"""Quick unit tests of corr_pipeline.compute.clusters against scipy (SPEC §5).

The thorough brute-force reference tests live in test_clusters.py; these check the kernels
bit for bit against scipy's linkage on small inputs, including tied distances, several tile
sizes (so tile boundaries are crossed many times) and the argument validation.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from corr_pipeline.compute.clusters import linkage as C

METHODS = ["single", "complete", "average", "weighted"]


def _reference_condensed(corr: np.ndarray) -> np.ndarray:
    c = np.nan_to_num(corr.astype(np.float64), nan=0.0)
    d = np.sqrt(np.clip(2.0 * (1.0 - c), 0.0, None))
    np.fill_diagonal(d, 0.0)
    return squareform(d, checks=False)


def _reference_labels(corr: np.ndarray, method: str, t, criterion: str) -> np.ndarray:
    labels = fcluster(linkage(_reference_condensed(corr), method), t, criterion=criterion)
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    remap = {labels[first[o]]: k for k, o in enumerate(order)}
    return np.array([remap[v] for v in labels], dtype=np.int32)


def _corr_case(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "continuous":
        x = rng.standard_normal((15, n)).astype(np.float32)
        corr = np.corrcoef(x, rowvar=False).astype(np.float32)
    elif kind == "quantised":  # many exactly tied distances
        corr = np.round(rng.uniform(-1, 1, (n, n)) * 3) / 3
        corr = np.triu(corr, 1)
        corr = (corr + corr.T).astype(np.float32)
    else:  # "nan": few distinct values and NaN (-> d = sqrt 2)
        corr = rng.choice(np.array([0.0, 0.5, 1.0, np.nan], dtype=np.float32), size=(n, n))
        corr = np.triu(corr, 1)
        corr = corr + corr.T
    np.fill_diagonal(corr, 1.0)
    return corr


@pytest.mark.parametrize("kind", ["continuous", "quantised", "nan"])
@pytest.mark.parametrize("tile_shift", [0, 1, 2, 3, C.TILE_SHIFT])
def test_linkage_matches_scipy_bit_for_bit(kind, tile_shift):
    rng = np.random.default_rng([sum(map(ord, kind)), tile_shift])
    for n in (2, 3, 5, 17, 40, 71):
        corr = _corr_case(kind, n, rng)
        ref_condensed = _reference_condensed(corr)
        G, F, length = C._layout(n, tile_shift)
        for method in METHODS:
            work = np.full(length, np.nan)
            C._fill(corr, G, F, tile_shift, work, working_memory_mb=1e-4)
            Z = C._linkage(work, n, method, G, F)
            np.testing.assert_array_equal(Z, linkage(ref_condensed, method), err_msg=method)


def test_condensed_distances_match_formula():
    rng = np.random.default_rng(1)
    corr = _corr_case("continuous", 30, rng)
    corr[3, 7] = corr[7, 3] = np.nan
    corr[1, 2] = corr[2, 1] = np.nextafter(np.float32(1), np.float32(2))  # a rounding step > 1
    got = C.condensed_distances(corr, working_memory_mb=1e-4)
    np.testing.assert_array_equal(got, _reference_condensed(corr))
    assert got[C._layout(30, 0)[0][1] + 2] == 0.0  # clipped, not NaN
    assert got[C._layout(30, 0)[0][3] + 7] == np.sqrt(2.0)


def test_linkage_matrix_public_matches_scipy_and_works_in_place():
    rng = np.random.default_rng(2)
    corr = _corr_case("quantised", 25, rng)
    for method in METHODS:
        cond = C.condensed_distances(corr)
        np.testing.assert_array_equal(
            C.linkage_matrix(cond, method), linkage(_reference_condensed(corr), method)
        )


@pytest.mark.parametrize("method", METHODS)
def test_hierarchical_clusters_equals_scipy_fcluster(method):
    rng = np.random.default_rng(3)
    for kind in ("continuous", "quantised", "nan"):
        corr = _corr_case(kind, 60, rng)
        for t in (0.0, 0.7, 1.0, 1.2, np.sqrt(2.0), 3.0):
            got = C.hierarchical_clusters(corr, method=method, distance_threshold=t)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, _reference_labels(corr, method, t, "distance"))
        for k in (1, 2, 5, 60, 100):
            got = C.hierarchical_clusters(corr, method=method, n_clusters=k)
            np.testing.assert_array_equal(got, _reference_labels(corr, method, k, "maxclust"))


def test_labels_are_canonical():
    # two perfect blocks {1, 3} and {0, 2, 4}: first appearance gives 0 to symbol 0's cluster
    corr = np.full((5, 5), -0.2, dtype=np.float32)
    for group in ([0, 2, 4], [1, 3]):
        corr[np.ix_(group, group)] = 0.9
    np.fill_diagonal(corr, 1.0)
    labels = C.hierarchical_clusters(corr, distance_threshold=0.5)
    np.testing.assert_array_equal(labels, [0, 1, 0, 1, 0])


def test_memmap_input_and_work_buffer(tmp_path):
    rng = np.random.default_rng(4)
    corr = _corr_case("continuous", 90, rng)
    path = tmp_path / "corr.npy"
    np.save(path, corr)
    mm = np.load(path, mmap_mode="r")
    work = np.memmap(
        tmp_path / "work.f64", dtype=np.float64, mode="w+", shape=(C.distance_buffer_length(90),)
    )
    got = C.hierarchical_clusters(mm, n_clusters=7, working_memory_mb=0.01, work=work)
    np.testing.assert_array_equal(got, _reference_labels(corr, "average", 7, "maxclust"))


def test_small_sizes():
    assert C.hierarchical_clusters(np.ones((0, 0), np.float32), n_clusters=1).shape == (0,)
    np.testing.assert_array_equal(
        C.hierarchical_clusters(np.ones((1, 1), np.float32), n_clusters=3), [0]
    )
    two = np.array([[1, 0.9], [0.9, 1]], dtype=np.float32)
    np.testing.assert_array_equal(C.hierarchical_clusters(two, distance_threshold=0.1), [0, 1])
    np.testing.assert_array_equal(C.hierarchical_clusters(two, distance_threshold=0.5), [0, 0])


def test_validation_errors():
    corr = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="unknown linkage method"):
        C.hierarchical_clusters(corr, method="ward", n_clusters=2)
    with pytest.raises(ValueError, match="exactly one"):
        C.hierarchical_clusters(corr)
    with pytest.raises(ValueError, match="exactly one"):
        C.hierarchical_clusters(corr, n_clusters=2, distance_threshold=1.0)
    with pytest.raises(ValueError, match="n_clusters"):
        C.hierarchical_clusters(corr, n_clusters=0)
    with pytest.raises(ValueError, match="distance_threshold"):
        C.hierarchical_clusters(corr, distance_threshold=float("nan"))
    with pytest.raises(ValueError, match="square"):
        C.hierarchical_clusters(np.ones((3, 4), np.float32), n_clusters=2)
    with pytest.raises(TypeError, match="float32"):
        C.hierarchical_clusters(np.eye(3, dtype=np.int32), n_clusters=2)
    with pytest.raises(ValueError, match="work"):
        C.hierarchical_clusters(corr, n_clusters=2, work=np.empty(3))
    bad = corr.copy()
    bad[0, 1] = -np.inf
    with pytest.raises(ValueError, match="infinite"):
        C.hierarchical_clusters(bad, n_clusters=2)
