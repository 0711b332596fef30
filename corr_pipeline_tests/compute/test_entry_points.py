"""The entry points with a runner: ``pairwise_correlation``, ``top_k_neighbors`` and
``find_lead_lag_pairs`` given ``runner=InProcessRunner()`` run their striped variants, with
stripes sized from ``working_memory_mb``, and return the threaded path's bits (which the
brute-force tests of each algorithm check against their references)."""

from __future__ import annotations

import numpy as np
import pytest

from corr_pipeline.compute import find_lead_lag_pairs, pairwise_correlation, top_k_neighbors
from corr_pipeline.compute.parallel.runners import InProcessRunner, budget_stripe_rows
from corr_pipeline.compute.tiling import GEMM_TILE, overlap_dtype
from corr_pipeline_tests.compute.universes import realistic_universe

N, T = 300, 120


@pytest.fixture(scope="module")
def universe():
    return realistic_universe(21, T, N, 30, name="entry_points")


def _maps(tmp_path, n: int, t: int) -> tuple[np.memmap, np.memmap]:
    corr = np.lib.format.open_memmap(tmp_path / "corr.npy", "w+", np.float32, (n, n))
    overlap = np.lib.format.open_memmap(tmp_path / "overlap.npy", "w+", overlap_dtype(t), (n, n))
    return corr, overlap


@pytest.mark.parametrize("working_memory_mb", [1e-3, 512])
def test_correlation_on_a_runner_is_the_threads(tmp_path, universe, working_memory_mb):
    expected = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    corr, overlap = _maps(tmp_path, N, T)
    found = pairwise_correlation(
        universe.R,
        min_overlap=universe.min_overlap,
        working_memory_mb=working_memory_mb,
        out_corr=corr,
        out_overlap=overlap,
        runner=InProcessRunner(),
    )
    assert found.corr is corr and found.overlap is overlap
    assert corr.tobytes() == expected.corr.tobytes()
    assert overlap.tobytes() == expected.overlap.tobytes()


def test_correlation_on_a_runner_needs_its_outputs(universe):
    with pytest.raises(ValueError, match="out_corr and out_overlap"):
        pairwise_correlation(universe.R, min_overlap=universe.min_overlap, runner=InProcessRunner())


def test_neighbors_and_lead_lag_on_a_runner_are_the_threads(tmp_path, universe):
    corr, overlap = _maps(tmp_path, N, T)
    pairwise_correlation(
        universe.R, min_overlap=universe.min_overlap, out_corr=corr, out_overlap=overlap
    )
    expected = top_k_neighbors(corr, k=7, overlap=overlap)
    found = top_k_neighbors(corr, k=7, overlap=overlap, runner=InProcessRunner())
    for name in ("index", "corr", "overlap"):
        assert getattr(found, name).tobytes() == getattr(expected, name).tobytes(), name
    params = dict(max_lag=3, k_leaders=4, k_laggers=5, min_overlap=universe.min_overlap)
    threads = find_lead_lag_pairs(universe.R, corr=corr, **params)
    for working_memory_mb in (1e-3, 512):  # blocks of one tile, and of the default cap
        striped = find_lead_lag_pairs(
            universe.R,
            corr=corr,
            working_memory_mb=working_memory_mb,
            runner=InProcessRunner(),
            **params,
        )
        assert striped.tobytes() == threads.tobytes(), working_memory_mb


def test_stripe_rows_are_whole_tiles_of_the_budget():
    row_bytes = 24_000 * 6
    assert budget_stripe_rows(row_bytes, 512, 24_000, 16 * GEMM_TILE) == 16 * GEMM_TILE
    assert budget_stripe_rows(row_bytes, 100, 24_000, 16 * GEMM_TILE) == 5 * GEMM_TILE
    assert budget_stripe_rows(row_bytes, 1e-3, 24_000, 16 * GEMM_TILE) == GEMM_TILE
