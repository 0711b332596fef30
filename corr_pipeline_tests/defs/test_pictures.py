"""Pictures as Dagster metadata (corr_pipeline.defs.pictures): markdown images with base64 PNG
data URIs, and the pictures a real materialization attaches."""

from __future__ import annotations

import base64

import pytest

from corr_pipeline import viz
from corr_pipeline.defs import pictures
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.fixtures.deployment import resources_at
from corr_pipeline_tests.fixtures.pipeline import SIXTY_DAYS
from corr_pipeline_tests.viz.helpers import (
    PNG_MAGIC,
    corr_with_clusters,
    decode,
    lead_lag_pairs,
)

#: The step's own figures and the matrix store's entries (the IO manager's), listed last
HOUSEKEEPING = {
    "stage_seconds",
    "check_seconds",
    "peak_rss_mib",
    "rss_anon_mib",
    "matrices_in_memory",
}
STORE_KEYS = {"path", "arrays", "versions", "bytes", "copied_bytes", "zero_copy_arrays"}


def test_markdown_embedding_round_trips_and_is_dagster_metadata():
    import dagster as dg

    corr, groups = corr_with_clusters(50, 3, seed=9)
    png = viz.clustered_heatmap_png(corr, groups)
    md = viz.png_markdown(png, "heat [map]")
    assert md.startswith("![heat (map)](data:image/png;base64,") and md.endswith(")")
    payload = md[len("![heat (map)](data:image/png;base64,") : -1]
    assert base64.b64decode(payload) == png
    value = pictures.png_metadata(png, "heatmap")
    assert isinstance(value, dg.MarkdownMetadataValue)
    with pytest.raises(ValueError, match="PNG"):
        viz.png_data_uri(b"GIF89a....")

    meta = pictures.heatmap_metadata(corr, groups)
    assert set(meta) == {"picture: clustered heatmap"}
    meta = pictures.histogram_metadata(corr)
    assert set(meta) == {
        "picture: correlation histogram",
        "corr_mean",
        "corr_median",
        "corr_nan_share",
    }
    meta = pictures.lead_lag_network_metadata(lead_lag_pairs(5, 50), [f"S{i}" for i in range(50)])
    assert set(meta) == {"picture: lead-lag network"}
    # the snapshot's max_q_value decides which pairs are drawn two-way (its legend names it)
    strict = pictures.lead_lag_network_metadata(
        lead_lag_pairs(5, 50), [f"S{i}" for i in range(50)], max_q_value=0.05
    )
    assert set(strict) == {"picture: lead-lag network"}
    assert strict["picture: lead-lag network"].value != meta["picture: lead-lag network"].value
    for key in ("picture: lead-lag network",):
        text = meta[key].value
        assert base64.b64decode(text.split("base64,")[1][:-1])[:8] == PNG_MAGIC


def test_assets_attach_valid_png_pictures(clean_db, tmp_path):
    """Materialize the snapshot graph on a small synthetic universe and decode every picture
    from the materialization metadata (markdown with a base64 PNG data URI)."""
    import dagster as dg

    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.defs.assets import snapshot_assets
    from corr_pipeline.defs.resources import SnapshotParams

    report = write_synthetic_universe(clean_db, n_symbols=80, n_days=100, seed=11)
    resources = resources_at(tmp_path / "store")
    resources["snapshot_params"] = SnapshotParams(**{**SIXTY_DAYS, "max_q_value": 0.05})
    result = dg.materialize(
        snapshot_assets, partition_key=str(report.last_date), resources=resources
    )
    assert result.success
    metadata = {
        mat.asset_key.to_user_string(): mat.metadata
        for mat in materializations(result, "correlation_matrix")
        + materializations(result, "overlap_matrix")
        + materializations(result, "clusters")
        + materializations(result, "lead_lag_pairs")
    }
    picture_keys = {
        "correlation_matrix": "picture: correlation histogram",
        "clusters": "picture: clustered heatmap",
        "lead_lag_pairs": "picture: lead-lag network",
    }
    for asset, key in picture_keys.items():
        value = metadata[asset][key]
        assert isinstance(value, dg.MarkdownMetadataValue), (asset, key)
        text = value.value
        assert text.startswith("![") and "](data:image/png;base64," in text and text.endswith(")")
        png = base64.b64decode(text.split("base64,", 1)[1][:-1])
        assert len(png) <= viz.DEFAULT_MAX_PNG_BYTES
        pixels = decode(png)
        assert pixels.shape[0] >= 200 and pixels.shape[1] >= 200
    assert -1.0 <= metadata["correlation_matrix"]["corr_mean"].value <= 1.0
    lead_lag = metadata["lead_lag_pairs"]
    assert lead_lag["significant_pairs"].value <= lead_lag["n_pairs"].value
    assert 0 <= lead_lag["two_way_pairs"].value <= lead_lag["n_pairs"].value
    # as the UI lists them: results, then pictures, then the step's figures, then the store's
    for asset, meta in metadata.items():
        keys = list(meta)
        groups = [
            3
            if key in STORE_KEYS
            else 2
            if key in HOUSEKEEPING
            else 1
            if key.startswith("picture: ")
            else 0
            for key in keys
        ]
        assert groups == sorted(groups), (asset, keys)
        assert groups[0] == 0 and 3 in groups, (asset, keys)
        assert (1 in groups) == (asset in picture_keys), (asset, keys)
    assert "stage_seconds" in metadata["clusters"]
