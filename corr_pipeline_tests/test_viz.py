"""Pictures (corr_pipeline.viz): exact against brute force, valid bounded PNGs, no N x N temporaries."""

from __future__ import annotations

import base64
import io
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from corr_pipeline import viz
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _decode(png: bytes) -> np.ndarray:
    assert png[:8] == PNG_MAGIC
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def _corr_with_clusters(
    n: int, n_groups: int, seed: int, t: int = 120
) -> tuple[np.ndarray, np.ndarray]:
    """float32 correlation of a factor model (groups = true clusters), NaN rows/cols sprinkled."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, n)
    factors = rng.standard_normal((t, n_groups))
    returns = factors[:, groups] + rng.standard_normal((t, n))
    corr = np.atleast_2d(np.corrcoef(returns.T)).astype(np.float32)
    bad = rng.choice(n, size=max(1, n // 50), replace=False)
    corr[bad, :] = np.nan
    corr[:, bad] = np.nan
    corr[bad, bad] = 1.0
    return corr, groups


def _memmap(tmp_path, array: np.ndarray) -> np.memmap:
    path = tmp_path / "corr.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=array.dtype, shape=array.shape)
    out[...] = array
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


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
    corr, _ = _corr_with_clusters(n, 4, seed=n)
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
# PNGs
# --------------------------------------------------------------------------------------------


def test_clustered_heatmap_png_is_a_valid_bounded_png(tmp_path):
    corr, groups = _corr_with_clusters(400, 6, seed=2)
    png = viz.clustered_heatmap_png(_memmap(tmp_path, corr), groups, max_pixels=128)
    pixels = _decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    assert 300 <= pixels.shape[0] <= 800 and 300 <= pixels.shape[1] <= 800
    # the picture holds the diverging colormap: strong reds (within-cluster) and near-white
    red = (pixels[..., 0] > 150) & (pixels[..., 2] < 110)
    assert red.sum() > 1000


def test_heatmap_with_odd_symbol_names_and_explicit_order():
    corr, groups = _corr_with_clusters(12, 3, seed=4)
    symbols = ["A'B", "C;D", "E F", "$x$", "Ünï", "日本", "a\\b", "_u_", "{b}", "%", "#1", "-"]
    order = np.argsort(groups, kind="stable")
    png = viz.clustered_heatmap_png(corr, groups, order=order, symbols=symbols)
    _decode(png)


def test_png_size_limit_lowers_the_resolution_or_fails_clearly():
    corr, groups = _corr_with_clusters(300, 5, seed=5)
    big = viz.clustered_heatmap_png(corr, groups)
    small = viz.clustered_heatmap_png(corr, groups, max_bytes=len(big) // 2)
    assert len(small) <= len(big) // 2
    assert _decode(small).shape[0] < _decode(big).shape[0]
    with pytest.raises(ValueError, match="max_bytes"):
        viz.clustered_heatmap_png(corr, groups, max_bytes=500)


def test_correlation_histogram_counts_every_upper_pair_once():
    corr, _ = _corr_with_clusters(233, 5, seed=6)
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
    corr, _ = _corr_with_clusters(300, 5, seed=7)
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


def test_correlation_histogram_png_valid():
    corr, _ = _corr_with_clusters(200, 4, seed=8)
    png = viz.correlation_histogram_png(corr)
    _decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    h = viz.correlation_histogram(corr)
    assert viz.correlation_histogram_png(histogram=h) == png
    with pytest.raises(ValueError, match="give corr or histogram"):
        viz.correlation_histogram_png()


def _pairs(n_pairs: int, n_symbols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pairs = np.zeros(n_pairs, dtype=LEAD_LAG_DTYPE)
    pairs["leader"] = rng.integers(0, n_symbols, n_pairs)
    pairs["lagger"] = (pairs["leader"] + 1 + rng.integers(0, n_symbols - 1, n_pairs)) % n_symbols
    pairs["lag"] = rng.integers(1, 6, n_pairs)
    pairs["lagged_corr"] = rng.uniform(-0.6, 0.6, n_pairs)
    pairs["sync_corr"] = np.where(rng.random(n_pairs) < 0.1, np.nan, 0.05)
    pairs["improvement"] = rng.uniform(0, 0.5, n_pairs)
    pairs["overlap"] = 240
    return pairs


def test_normalize_pairs_names_sorts_and_truncates():
    symbols = [f"S{i}" for i in range(20)]
    pairs = _pairs(50, 20)
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


def test_lead_lag_network_png_valid_with_odd_symbols_and_empty():
    symbols = ["A'B", "C;D", "E F", "$x^2$", "Ünï", "日本", "a\\b", "_u_", "{b}", "%"]
    png = viz.lead_lag_network_png(_pairs(40, 10), symbols, top=30)
    _decode(png)
    assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
    empty = viz.lead_lag_network_png(np.zeros(0, dtype=LEAD_LAG_DTYPE), symbols)
    _decode(empty)


def test_lead_lag_markdown_table_escapes_symbols():
    symbols = ["A|B", "*C*", "D"]
    pairs = np.zeros(1, dtype=LEAD_LAG_DTYPE)
    pairs[0] = (0, 1, 2, 0.5, np.nan, 0.45, 100)
    table = viz.lead_lag_markdown_table(pairs, symbols)
    lines = table.splitlines()
    assert lines[0].startswith("| leader | lagger | lag |")
    assert lines[2] == "| A\\|B | \\*C\\* | 2 | +0.500 | NaN | 0.450 | 100 |"


def test_markdown_embedding_round_trips_and_is_dagster_metadata():
    import dagster as dg

    corr, groups = _corr_with_clusters(50, 3, seed=9)
    png = viz.clustered_heatmap_png(corr, groups)
    md = viz.png_markdown(png, "heat [map]")
    assert md.startswith("![heat (map)](data:image/png;base64,") and md.endswith(")")
    payload = md[len("![heat (map)](data:image/png;base64,") : -1]
    assert base64.b64decode(payload) == png
    value = viz.png_metadata(png, "heatmap")
    assert isinstance(value, dg.MarkdownMetadataValue)
    with pytest.raises(ValueError, match="PNG"):
        viz.png_data_uri(b"GIF89a....")

    meta = viz.heatmap_metadata(corr, groups)
    assert set(meta) == {"heatmap"}
    meta = viz.histogram_metadata(corr)
    assert set(meta) == {"correlation_histogram", "corr_mean", "corr_median", "corr_nan_share"}
    meta = viz.lead_lag_metadata(_pairs(5, 50), [f"S{i}" for i in range(50)])
    assert set(meta) == {"lead_lag_network", "lead_lag_top_pairs"}
    for key in ("lead_lag_network",):
        text = meta[key].value
        assert base64.b64decode(text.split("base64,")[1][:-1])[:8] == PNG_MAGIC


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
    _decode(png)
    assert h.n_pairs == n * (n - 1) // 2
    assert peak_heatmap < 0.3 * n_squared_bytes, peak_heatmap
    assert peak_histogram < 0.3 * n_squared_bytes, peak_histogram


# --------------------------------------------------------------------------------------------
# the pictures as the Dagster assets attach them
# --------------------------------------------------------------------------------------------


def test_assets_attach_valid_png_pictures(clean_db, tmp_path):
    """Materialize the snapshot graph on a small synthetic universe and decode every picture
    from the materialization metadata (markdown with a base64 PNG data URI)."""
    import dagster as dg

    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.definitions import build_resources
    from corr_pipeline.defs.assets import snapshot_assets
    from corr_pipeline.defs.resources import SnapshotParams

    report = write_synthetic_universe(clean_db, n_symbols=80, n_days=100, seed=11)
    resources = build_resources(str(tmp_path / "store"))
    resources["snapshot_params"] = SnapshotParams(
        lookback_days=60,
        min_history_days=40,
        min_overlap=30,
        k_neighbors=5,
        max_lag=3,
        k_leaders=3,
        k_laggers=3,
        working_memory_mb=16,
    )
    result = dg.materialize(
        snapshot_assets, partition_key=str(report.last_date), resources=resources
    )
    assert result.success
    metadata = {
        mat.asset_key.to_user_string(): mat.metadata
        for mat in result.asset_materializations_for_node("correlation_and_overlap")
        + result.asset_materializations_for_node("clusters")
        + result.asset_materializations_for_node("lead_lag_pairs")
    }
    pictures = {
        "correlation_matrix": "correlation_histogram",
        "clusters": "heatmap",
        "lead_lag_pairs": "lead_lag_network",
    }
    for asset, key in pictures.items():
        value = metadata[asset][key]
        assert isinstance(value, dg.MarkdownMetadataValue), (asset, key)
        text = value.value
        assert text.startswith("![") and "](data:image/png;base64," in text and text.endswith(")")
        png = base64.b64decode(text.split("base64,", 1)[1][:-1])
        assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
        pixels = _decode(png)
        assert pixels.shape[0] >= 200 and pixels.shape[1] >= 200
    assert -1.0 <= metadata["correlation_matrix"]["corr_mean"].value <= 1.0
