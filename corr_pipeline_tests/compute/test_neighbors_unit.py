"""Quick unit tests of corr_pipeline.compute.neighbors (SPEC §4) against a full sort.

The thorough brute-force reference tests live in test_neighbors.py; these compare with a
plain per-row lexsort on small inputs, with ties, NaN/inf, k > N − 1 and tiny block sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from corr_pipeline.compute.neighbors import Neighbors, top_k_neighbors


def _full_sort(corr: np.ndarray, k: int, overlap: np.ndarray):
    n = corr.shape[0]
    index = np.full((n, k), -1, np.int32)
    value = np.full((n, k), np.nan, np.float32)
    ov = np.zeros((n, k), overlap.dtype)
    for i in range(n):
        j = np.array([j for j in range(n) if j != i and np.isfinite(corr[i, j])], dtype=np.int64)
        if j.size:
            order = np.lexsort((j, -np.abs(corr[i, j].astype(np.float64))))[:k]
            j = j[order]
            index[i, : j.size] = j
            value[i, : j.size] = corr[i, j]
            ov[i, : j.size] = overlap[i, j]
    return index, value, ov


@pytest.mark.parametrize("kind", ["continuous", "ties", "holes"])
def test_matches_full_sort(kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    for _ in range(40):
        n = int(rng.integers(1, 35))
        k = int(rng.integers(1, 40))
        if kind == "continuous":
            corr = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        elif kind == "ties":  # |corr| ties, including +x / -x at the k-th boundary
            corr = (np.round(rng.uniform(-1, 1, (n, n)) * 2) / 2).astype(np.float32)
        else:
            values = np.array([0.0, -0.0, 0.5, -0.5, np.nan, np.inf, -np.inf], np.float32)
            corr = rng.choice(values, (n, n))
        overlap = rng.integers(0, 500, (n, n)).astype(np.int16)
        budget = float(rng.choice([1e-5, 0.01, 64]))
        got = top_k_neighbors(corr, k=k, overlap=overlap, working_memory_mb=budget)
        index, value, ov = _full_sort(corr, k, overlap)
        np.testing.assert_array_equal(got.index, index)
        np.testing.assert_array_equal(got.corr, value)
        np.testing.assert_array_equal(got.overlap, ov)
        assert got.index.dtype == np.int32 and got.corr.dtype == np.float32
        assert got.overlap.dtype == np.int16


@pytest.mark.parametrize("pattern", ["increasing", "decreasing", "constant", "alternating"])
def test_many_buffer_cuts(pattern):
    # rows whose |corr| keeps rising along j force the candidate buffer to be cut many times
    n, k = 300, 3
    ramp = np.linspace(0.01, 0.99, n, dtype=np.float32)
    row = {
        "increasing": ramp,
        "decreasing": ramp[::-1].copy(),
        "constant": np.full(n, 0.5, np.float32),
        "alternating": np.where(np.arange(n) % 2 == 0, ramp, -ramp).astype(np.float32),
    }[pattern]
    corr = np.tile(row, (n, 1))
    overlap = np.arange(n * n, dtype=np.int32).reshape(n, n)
    got = top_k_neighbors(corr, k=k, overlap=overlap)
    index, value, ov = _full_sort(corr, k, overlap)
    np.testing.assert_array_equal(got.index, index)
    np.testing.assert_array_equal(got.corr, value)
    np.testing.assert_array_equal(got.overlap, ov)


def test_tie_goes_to_smaller_column_at_the_boundary():
    corr = np.array(
        [
            [1.0, 0.3, -0.5, 0.5, 0.5, -0.3],
            [0.3, 1.0, 0.0, 0.0, 0.0, 0.0],
            [-0.5, 0.0, 1.0, 0.0, 0.0, 0.0],
            [0.5, 0.0, 0.0, 1.0, 0.0, 0.0],
            [0.5, 0.0, 0.0, 0.0, 1.0, 0.0],
            [-0.3, 0.0, 0.0, 0.0, 0.0, 1.0],
        ],
        dtype=np.float32,
    )
    got = top_k_neighbors(corr, k=4)
    np.testing.assert_array_equal(got.index[0], [2, 3, 4, 1])
    np.testing.assert_array_equal(got.corr[0], np.float32([-0.5, 0.5, 0.5, 0.3]))
    np.testing.assert_array_equal(got.index[1], [0, 2, 3, 4])  # zeros are finite neighbours
    assert got.overlap is None


def test_padding_and_diagonal():
    corr = np.array([[1.0, np.nan, 0.2], [np.nan, 1.0, np.nan], [0.2, np.nan, 1.0]], np.float32)
    got = top_k_neighbors(corr, k=3, overlap=np.full((3, 3), 7, np.int32))
    np.testing.assert_array_equal(got.index, [[2, -1, -1], [-1, -1, -1], [0, -1, -1]])
    np.testing.assert_array_equal(got.overlap, [[7, 0, 0], [0, 0, 0], [7, 0, 0]])
    assert np.isnan(got.corr[:, 1:]).all() and np.isnan(got.corr[1, 0])
    single = top_k_neighbors(np.ones((1, 1), np.float32), k=2)
    np.testing.assert_array_equal(single.index, [[-1, -1]])


def test_memmap_input(tmp_path):
    rng = np.random.default_rng(5)
    corr = rng.uniform(-1, 1, (50, 50)).astype(np.float32)
    overlap = rng.integers(0, 100, (50, 50)).astype(np.int16)
    np.save(tmp_path / "c.npy", corr)
    np.save(tmp_path / "o.npy", overlap)
    got = top_k_neighbors(
        np.load(tmp_path / "c.npy", mmap_mode="r"),
        k=5,
        overlap=np.load(tmp_path / "o.npy", mmap_mode="r"),
        working_memory_mb=0.001,
    )
    assert isinstance(got, Neighbors)
    index, value, ov = _full_sort(corr, 5, overlap)
    np.testing.assert_array_equal(got.index, index)
    np.testing.assert_array_equal(got.overlap, ov)


def test_validation_errors():
    corr = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="k must be >= 1"):
        top_k_neighbors(corr, k=0)
    with pytest.raises(TypeError, match="integer"):
        top_k_neighbors(corr, k=2.5)
    with pytest.raises(ValueError, match="square"):
        top_k_neighbors(np.ones((2, 3), np.float32), k=1)
    with pytest.raises(TypeError, match="float32"):
        top_k_neighbors(np.eye(3, dtype=np.int16), k=1)
    with pytest.raises(ValueError, match="shape"):
        top_k_neighbors(corr, k=1, overlap=np.ones((2, 2), np.int16))
    with pytest.raises(TypeError, match="integer dtype"):
        top_k_neighbors(corr, k=1, overlap=np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="working_memory_mb"):
        top_k_neighbors(corr, k=1, working_memory_mb=0)
