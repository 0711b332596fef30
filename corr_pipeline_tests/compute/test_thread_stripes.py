"""The stripes on this process's threads (:class:`ThreadRunner`), the correlation step's path
for outputs in files: bit-identical to the threaded kernels, progress per stripe, nothing kept
after the runner's ``with`` block."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from corr_pipeline.compute import find_lead_lag_pairs, pairwise_correlation
from corr_pipeline.compute import stripes as stripes_module
from corr_pipeline.compute.stripes import (
    CORRELATION_STRIPE_ROWS,
    ThreadRunner,
    striped_correlation,
    striped_lead_lag,
    thread_stripe_rows,
)
from corr_pipeline.compute.tiling import GEMM_TILE, PRODUCT_COLUMNS, overlap_dtype
from corr_pipeline.snapshot import steps
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline_tests.compute.universes import adversarial_universe, realistic_universe

UNIVERSE = adversarial_universe(31, 120, PRODUCT_COLUMNS + 180, 30)
LEAD_LAG = realistic_universe(32, 90, 700, 40, injected=[(3, 500, 2), (650, 10, 4)])


@pytest.fixture(scope="module")
def threaded():
    return pairwise_correlation(UNIVERSE.R, min_overlap=UNIVERSE.min_overlap)


def _outputs(tmp_path: Path, n: int, T: int) -> tuple[np.memmap, np.memmap]:
    corr = np.lib.format.open_memmap(tmp_path / "corr.npy", "w+", np.float32, (n, n))
    overlap = np.lib.format.open_memmap(tmp_path / "overlap.npy", "w+", overlap_dtype(T), (n, n))
    corr[:] = -7.0  # every byte must be written
    overlap[:] = -1
    return corr, overlap


def _assert_same(result, corr: np.ndarray, overlap: np.ndarray) -> None:
    assert corr.tobytes() == result.corr.tobytes()
    assert overlap.tobytes() == result.overlap.tobytes()


@pytest.mark.parametrize("stripe_rows", [128, 384, CORRELATION_STRIPE_ROWS])
def test_correlation_on_threads_into_files_is_the_threads(threaded, tmp_path, stripe_rows):
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    seen: list[tuple[int, int]] = []
    with ThreadRunner() as runner:
        striped_correlation(
            UNIVERSE.R,
            runner,
            min_overlap=UNIVERSE.min_overlap,
            out_corr=corr,
            out_overlap=overlap,
            stripe_rows=stripe_rows,
            progress=lambda done, total: seen.append((done, total)),
        )
        tokens = list(runner._tokens)
    _assert_same(threaded, corr, overlap)
    stripes = -(-UNIVERSE.N // stripe_rows)
    total = 2 * stripes - 1
    assert seen == [(i, total) for i in range(1, total + 1)]
    assert tokens and not any(token in stripes_module._contexts for token in tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corr.npy", "overlap.npy"]


def test_the_correlation_step_writes_files_by_stripes_and_memory_by_the_kernel(
    threaded, tmp_path, monkeypatch
):
    """``steps.correlation`` without a runner: file-backed outputs through the thread runner's
    stripes, in-memory ones through ``pairwise_correlation``; the same bytes."""
    params = SnapshotParameters(min_overlap=UNIVERSE.min_overlap, working_memory_mb=8)
    used: list[str] = []
    real = steps.striped_correlation

    def spy(*args, **kwargs):
        used.append(type(args[1]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "striped_correlation", spy)
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    steps.correlation(UNIVERSE.R, params, out_corr=corr, out_overlap=overlap)
    assert used == ["ThreadRunner"]
    _assert_same(threaded, corr, overlap)
    in_memory = np.full_like(np.asarray(corr), -7.0), np.full_like(np.asarray(overlap), -1)
    steps.correlation(UNIVERSE.R, params, out_corr=in_memory[0], out_overlap=in_memory[1])
    assert used == ["ThreadRunner"]
    _assert_same(threaded, *in_memory)


def test_lead_lag_on_threads_with_feedback_is_the_threads(tmp_path):
    """The runner's feedback (stripes submitted as threads free up, each with the floors of
    those finished before it) gives the threaded scan's pairs exactly."""
    result = pairwise_correlation(LEAD_LAG.R, min_overlap=LEAD_LAG.min_overlap)
    corr = np.lib.format.open_memmap(tmp_path / "corr.npy", "w+", np.float32, result.corr.shape)
    corr[:] = result.corr
    common = dict(max_lag=4, k_leaders=3, k_laggers=2, min_overlap=LEAD_LAG.min_overlap)
    expected = find_lead_lag_pairs(LEAD_LAG.R, corr=corr, **common)
    with ThreadRunner() as runner:
        found = striped_lead_lag(LEAD_LAG.R, runner, corr=corr, stripe_rows=128, **common)
    assert expected.size > 0
    assert found.tobytes() == expected.tobytes()


def test_a_failing_stripe_fails_the_call():
    def boom(_shared, stripe, _token):
        if stripe == (2, 3):
            raise RuntimeError("stripe (2, 3) failed")
        return stripe

    with ThreadRunner() as runner, pytest.raises(RuntimeError, match=r"stripe \(2, 3\)"):
        runner.map(boom, None, [(i, i + 1) for i in range(5)])


@pytest.mark.parametrize(
    ("n_cols", "working_memory_mb", "threads", "rows"),
    [
        (24_000, 512, 2, 896),  # 512 MiB / 2 threads / (2 x 24,000 x 6 bytes) = 932 rows
        (4_000, 512, 2, CORRELATION_STRIPE_ROWS),  # capped
        (64_000, 512, 2, 4 * GEMM_TILE),  # at least 4 tiles
        (24_000, 512, 1, 1792),
    ],
)
def test_thread_stripe_rows_fit_the_working_memory(n_cols, working_memory_mb, threads, rows):
    assert thread_stripe_rows(n_cols, 2, working_memory_mb, threads) == rows
