"""Reductions (corr_pipeline.viz.reductions): exact against brute force, the same for every
budget, no N x N temporaries."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from corr_pipeline import viz
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline_tests.viz.helpers import corr_with_clusters, decode, lead_lag_pairs, memmap_of

# --------------------------------------------------------------------------------------------
# ordering and the block-averaged grid
# --------------------------------------------------------------------------------------------


def test_cluster_order_groups_clusters_largest_first_keeping_column_order():
    labels = np.array([2, 0, 1, 0, 2, 0, 1, 3])
    order, starts = viz.cluster_order(labels)
    # sizes: 0 -> 3, 1 -> 2, 2 -> 2, 3 -> 1 ; ties by label
    assert order.tolist() == [1, 3, 5, 2, 6, 0, 4, 7]
    assert starts.tolist() == [0, 3, 5, 7, 8]
    assert sorted(order.tolist()) == list(range(8))


@pytest.mark.parametrize(
    ("n", "pixels", "memory_mb"),
    [(157, 20, 0.01), (60, 60, 0.002), (64, 500, 1.0), (1, 5, 1.0)],
)
def test_heatmap_grid_is_the_blockwise_nanmean_of_the_reordered_matrix(n, pixels, memory_mb):
    corr, _ = corr_with_clusters(n, 4, seed=n)
    order = np.random.default_rng(1).permutation(n)
    grid = viz.heatmap_grid(corr, order, max_pixels=pixels, working_memory_mb=memory_mb)
    p = min(n, pixels)
    assert grid.values.shape == (p, p) and grid.values.dtype == np.float32
    edges = grid.edges
    assert edges[0] == 0 and edges[-1] == n and np.all(np.diff(edges) >= 1)
    assert np.diff(edges).max() - np.diff(edges).min() <= 1
    full = corr[order][:, order].astype(np.float64)
    for a in range(p):
        for b in range(p):
            cell = full[edges[a] : edges[a + 1], edges[b] : edges[b + 1]]
            finite = np.isfinite(cell)
            assert grid.counts[a, b] == finite.sum()
            if finite.any():
                assert grid.values[a, b] == pytest.approx(cell[finite].mean(), abs=1e-6)
            else:
                assert np.isnan(grid.values[a, b])


def test_heatmap_grid_rejects_a_non_permutation():
    corr = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="permutation"):
        viz.heatmap_grid(corr, [0, 1, 1, 3])
    with pytest.raises(ValueError, match="square"):
        viz.heatmap_grid(np.zeros((3, 4), dtype=np.float32))


# --------------------------------------------------------------------------------------------
# histogram
# --------------------------------------------------------------------------------------------


def test_correlation_histogram_counts_every_upper_pair_once():
    corr, _ = corr_with_clusters(233, 5, seed=6)
    h = viz.correlation_histogram(corr, bins=50, max_values=None, working_memory_mb=0.02)
    upper = corr[np.triu_indices(233, k=1)].astype(np.float64)
    finite = upper[np.isfinite(upper)]
    assert not h.sampled and h.rows_used == 233
    assert h.n_pairs == upper.size and h.n_nan == upper.size - finite.size
    assert h.counts.tolist() == np.histogram(finite, bins=50, range=(-1, 1))[0].tolist()
    assert h.n_out_of_range == 0
    assert h.mean == pytest.approx(finite.mean(), rel=1e-12)
    assert h.std == pytest.approx(finite.std(), rel=1e-9)
    assert h.nan_share == pytest.approx(1 - finite.size / upper.size)
    assert abs(h.quantile(0.5) - np.median(finite)) <= 2 / 50  # within one bin


def test_correlation_histogram_sample_is_deterministic_whole_rows():
    corr, _ = corr_with_clusters(300, 5, seed=7)
    h1 = viz.correlation_histogram(corr, max_values=3000)
    h2 = viz.correlation_histogram(corr, max_values=3000)
    assert h1.sampled and h1.rows_used == 3000 // 299
    assert h1.counts.tolist() == h2.counts.tolist()
    rows = np.unique(np.rint(np.linspace(0, 299, h1.rows_used)).astype(int))
    values = np.concatenate([np.delete(corr[r], r) for r in rows]).astype(np.float64)
    assert h1.n_pairs == values.size
    finite = values[np.isfinite(values)]
    assert h1.counts.sum() == finite.size
    assert h1.mean == pytest.approx(finite.mean(), rel=1e-12)


def test_correlation_histogram_reports_values_out_of_range():
    corr = np.array([[1, 1.5, np.nan], [1.5, 1, 0.25], [np.nan, 0.25, 1]], dtype=np.float32)
    h = viz.correlation_histogram(corr, bins=4, max_values=None)
    assert (h.n_pairs, h.n_nan, h.n_out_of_range, int(h.counts.sum())) == (3, 1, 1, 1)


# --------------------------------------------------------------------------------------------
# the budget changes the block height, never the result
# --------------------------------------------------------------------------------------------


def test_reductions_are_the_same_for_every_working_memory(tmp_path, monkeypatch):
    from corr_pipeline.viz import reductions

    # small chunks, so that a 700-symbol matrix spans many of them
    monkeypatch.setattr(reductions, "HISTOGRAM_CHUNK", 1000)
    corr, groups = corr_with_clusters(700, 6, seed=12)
    mm = memmap_of(tmp_path, corr)
    order, _ = viz.cluster_order(groups)
    # one pixel row = 7 rows of 18 * 700 bytes = 0.084 MiB; 0.1 MiB holds one, 0.5 several
    grids = [
        viz.heatmap_grid(mm, order, max_pixels=100, working_memory_mb=mb) for mb in (0.1, 0.5, 512)
    ]
    for grid in grids[1:]:
        assert np.array_equal(grid.values, grids[0].values, equal_nan=True)
        assert np.array_equal(grid.counts, grids[0].counts)
    for max_values in (None, 30_000):
        # 1 row (0.0027 MiB) to all 700 rows per block
        hists = [
            viz.correlation_histogram(mm, max_values=max_values, working_memory_mb=mb)
            for mb in (0.001, 0.01, 0.1, 512)
        ]
        for h in hists[1:]:
            assert h.counts.tolist() == hists[0].counts.tolist()
            assert (h.n_pairs, h.n_nan, h.n_out_of_range) == (
                hists[0].n_pairs,
                hists[0].n_nan,
                hists[0].n_out_of_range,
            )
            assert (h.value_sum, h.value_sq_sum) == (hists[0].value_sum, hists[0].value_sq_sum)


# --------------------------------------------------------------------------------------------
# lead-lag pairs
# --------------------------------------------------------------------------------------------


def test_normalize_pairs_names_sorts_and_truncates():
    symbols = [f"S{i}" for i in range(20)]
    pairs = lead_lag_pairs(50, 20)
    rows = viz.normalize_pairs(pairs, symbols, top=10)
    assert len(rows) == 10
    assert [r["improvement"] for r in rows] == sorted(
        (float(v) for v in pairs["improvement"]), reverse=True
    )[:10]
    best = pairs[np.argmax(pairs["improvement"])]
    assert rows[0]["leader"] == symbols[best["leader"]]
    assert rows[0]["lagger"] == symbols[best["lagger"]]
    assert rows[0]["lag"] == int(best["lag"])
    # the same pairs given as database-like rows with names
    as_rows = [
        {
            **{f: p[f].item() for f in LEAD_LAG_DTYPE.names},
            "leader": symbols[p["leader"]],
            "lagger": symbols[p["lagger"]],
        }
        for p in pairs
    ]
    assert viz.normalize_pairs(as_rows, top=10) == rows
    with pytest.raises(ValueError, match="pass symbols"):
        viz.normalize_pairs(pairs)


def test_normalize_pairs_carries_the_significance_and_the_reverse_direction():
    """p_value, q_value and the reverse direction come through as Python numbers (the reverse
    lag an int, 0 for none), and a database row's None stays None."""
    pairs = lead_lag_pairs(2, 5)
    pairs["improvement"] = [0.5, 0.25]
    pairs["q_value"] = [1e-6, 0.5]
    pairs["reverse_lag"] = [2, 0]
    pairs["reverse_lagged_corr"] = [-0.25, np.nan]
    pairs["reverse_q_value"] = [0.004, np.nan]
    first, second = viz.normalize_pairs(pairs, [f"S{i}" for i in range(5)])
    assert (first["q_value"], first["reverse_lag"], first["reverse_lagged_corr"]) == (
        1e-6,
        2,
        -0.25,
    )
    assert type(first["reverse_lag"]) is int and first["reverse_q_value"] == 0.004
    assert second["reverse_lag"] == 0 and np.isnan(second["reverse_q_value"])
    (row,) = viz.normalize_pairs(
        [{"leader": "A", "lagger": "B", "reverse_lag": None, "reverse_q_value": None}]
    )
    assert row["reverse_lag"] is None and row["reverse_q_value"] is None


# --------------------------------------------------------------------------------------------
# memory: no N x N temporaries when reading a memory-mapped matrix
# --------------------------------------------------------------------------------------------


def test_pictures_from_a_memmap_stay_far_below_n_squared(tmp_path):
    n = 3000
    rng = np.random.default_rng(10)
    path = tmp_path / "corr.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, n))
    groups = rng.integers(0, 8, n)
    for r0 in range(0, n, 500):  # fill without an N x N array in RAM
        block = (groups[r0 : r0 + 500, None] == groups[None, :]) * 0.5 + rng.uniform(
            -0.1, 0.1, (min(500, n - r0), n)
        )
        mm[r0 : r0 + 500] = block
    mm.flush()
    del mm
    corr = np.load(path, mmap_mode="r")
    n_squared_bytes = n * n * 4  # 36 MB

    # warm up imports and font caches outside the measurement
    viz.clustered_heatmap_png(np.eye(30, dtype=np.float32), np.zeros(30, dtype=int))
    viz.correlation_histogram_png(np.eye(30, dtype=np.float32))

    tracemalloc.start()
    try:
        png = viz.clustered_heatmap_png(corr, groups, max_pixels=512, working_memory_mb=2)
        _, peak_heatmap = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        h = viz.correlation_histogram(corr, max_values=None, working_memory_mb=2)
        _, peak_histogram = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    decode(png)
    assert h.n_pairs == n * (n - 1) // 2
    assert peak_heatmap < 0.3 * n_squared_bytes, peak_heatmap
    assert peak_histogram < 0.3 * n_squared_bytes, peak_histogram
