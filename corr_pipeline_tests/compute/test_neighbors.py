"""top_k_neighbors against the full-sort reference (SPEC §4).

Both sides read the same float32 ``corr``, so agreement is exact: identical indices (ties to the
smaller ``j``), identical signed float32 values, overlap gathered at the selected positions,
padding with index −1 and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # SPEC §9 names the package; test_api_errors checks the export itself.
    from corr_pipeline.compute import top_k_neighbors
except ImportError:  # pragma: no cover - reported by test_api_errors
    from corr_pipeline.compute.neighbors import top_k_neighbors

from corr_pipeline.compute import pairwise_correlation
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.compute.universes import adversarial_universe, realistic_universe


def assert_neighbors_match(
    result, corr: np.ndarray, k: int, overlap=None, label: str = "", full_sort=None
) -> None:
    """``full_sort``: a reference computed once with a larger k (its first k columns are the
    reference for k, a stable sort being prefix-consistent)."""
    if full_sort is None:
        expected = ref.reference_top_k(corr, k, overlap)
    else:
        expected = ref.ReferenceNeighbors(
            full_sort.index[:, :k],
            full_sort.corr[:, :k],
            None if full_sort.overlap is None else full_sort.overlap[:, :k],
        )
    N = corr.shape[0]
    assert result.index.shape == (N, k) and result.corr.shape == (N, k)
    assert result.index.dtype == np.int32, result.index.dtype
    assert result.corr.dtype == np.float32, result.corr.dtype
    bad_rows = np.flatnonzero(np.any(result.index != expected.index, axis=1))
    assert bad_rows.size == 0, (
        f"{label}: index differs in {bad_rows.size} rows, e.g. row {bad_rows[0]}: "
        f"got {result.index[bad_rows[0]].tolist()} expected {expected.index[bad_rows[0]].tolist()}"
    )
    assert np.array_equal(result.corr, expected.corr.astype(np.float32), equal_nan=True), label
    assert np.all(np.isnan(result.corr[result.index < 0]))
    if overlap is None:
        assert result.overlap is None
    else:
        assert result.overlap.shape == (N, k)
        filled = expected.index >= 0
        assert np.array_equal(result.overlap[filled], expected.overlap[filled]), label


def _corr_sources():
    """(label, float32 corr, overlap) from the reference and from the kernel."""
    universes = [
        realistic_universe(70, 252, 157, 60),
        adversarial_universe(71, 60, 40, 15),
        adversarial_universe(72, 252, 90, 40),
    ]
    for u in universes:
        ref_corr, ref_overlap = ref.reference_correlation(u.R, u.min_overlap)
        yield f"{u.name}-reference", ref_corr.astype(np.float32), ref_overlap
        result = pairwise_correlation(u.R, min_overlap=u.min_overlap)
        yield f"{u.name}-kernel", result.corr, result.overlap


SOURCES = list(_corr_sources())


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s[0])
def test_matches_reference(source) -> None:
    label, corr, overlap = source
    N = corr.shape[0]
    full_sort = ref.reference_top_k(corr, N + 2, overlap)
    for k in sorted({1, 3, 10, N - 1, N, N + 2}):
        result = top_k_neighbors(corr, k=k, overlap=overlap)
        assert_neighbors_match(result, corr, k, overlap, f"{label} k={k}", full_sort)
    result = top_k_neighbors(corr, k=5)
    assert_neighbors_match(result, corr, 5, None, f"{label} without overlap")


def _tied_corr(seed: int, N: int) -> np.ndarray:
    """Symmetric float32 matrix of a few levels with both signs (|+0.5| == |-0.5|), NaN rows."""
    rng = np.random.default_rng(seed)
    levels = np.array([-0.5, -0.25, 0.0, 0.25, 0.5, 0.75, -0.75], dtype=np.float32)
    upper = levels[rng.integers(0, len(levels), size=(N, N))]
    corr = np.triu(upper, 1)
    corr = corr + corr.T
    np.fill_diagonal(corr, 1.0)
    corr[rng.random((N, N)) < 0.05] = np.nan
    corr = np.where(np.isnan(corr) | np.isnan(corr.T), np.nan, corr).astype(np.float32)
    nan_rows = rng.choice(N, size=max(1, N // 10), replace=False)
    corr[nan_rows, :] = np.nan
    corr[:, nan_rows] = np.nan
    return corr


@pytest.mark.parametrize("seed", range(3))
def test_ties_go_to_the_smaller_index(seed: int) -> None:
    corr = _tied_corr(seed, 61)
    overlap = np.arange(61 * 61, dtype=np.int32).reshape(61, 61) % 250
    full_sort = ref.reference_top_k(corr, 64, overlap)
    for k in (1, 4, 17, 60, 64):
        result = top_k_neighbors(corr, k=k, overlap=overlap)
        assert_neighbors_match(result, corr, k, overlap, f"k={k}", full_sort)


def test_rows_without_finite_entries_are_padded() -> None:
    corr = np.full((4, 4), np.nan, dtype=np.float32)
    corr[0, 1] = corr[1, 0] = -0.3
    result = top_k_neighbors(corr, k=2)
    assert result.index.tolist() == [[1, -1], [0, -1], [-1, -1], [-1, -1]]
    assert result.corr[0, 0] == np.float32(-0.3) and np.isnan(result.corr[:, 1]).all()


def test_one_and_two_symbols() -> None:
    one = np.ones((1, 1), dtype=np.float32)
    result = top_k_neighbors(one, k=3)
    assert result.index.tolist() == [[-1, -1, -1]] and np.isnan(result.corr).all()
    two = np.array([[1.0, -0.9], [-0.9, 1.0]], dtype=np.float32)
    overlap = np.array([[50, 42], [42, 50]], dtype=np.int16)
    for k in (1, 2):
        assert_neighbors_match(top_k_neighbors(two, k=k, overlap=overlap), two, k, overlap)


def test_diagonal_is_never_a_neighbor() -> None:
    """Even a diagonal larger than every off-diagonal |corr| (or NaN) is skipped."""
    corr = _tied_corr(5, 20)
    np.fill_diagonal(corr, 1.0)
    result = top_k_neighbors(corr, k=19)
    assert not np.any(result.index == np.arange(20)[:, None])


def test_working_memory_invariance() -> None:
    label, corr, overlap = SOURCES[1]
    baseline = top_k_neighbors(corr, k=7, overlap=overlap)
    for budget in (0.0005, 0.004, 0.05, 1.0):
        other = top_k_neighbors(corr, k=7, overlap=overlap, working_memory_mb=budget)
        assert np.array_equal(baseline.index, other.index), budget
        assert np.array_equal(baseline.corr, other.corr, equal_nan=True), budget
        assert np.array_equal(baseline.overlap, other.overlap), budget


def test_read_only_memory_mapped_input(tmp_path) -> None:
    label, corr, overlap = SOURCES[0]
    np.save(tmp_path / "corr.npy", corr)
    np.save(tmp_path / "overlap.npy", overlap)
    mapped_corr = np.load(tmp_path / "corr.npy", mmap_mode="r")
    mapped_overlap = np.load(tmp_path / "overlap.npy", mmap_mode="r")
    result = top_k_neighbors(mapped_corr, k=6, overlap=mapped_overlap, working_memory_mb=0.2)
    assert_neighbors_match(result, corr, 6, overlap, "memory-mapped")
    assert np.array_equal(np.load(tmp_path / "corr.npy"), corr, equal_nan=True), "input modified"
