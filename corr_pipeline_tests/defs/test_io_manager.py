"""MatrixStoreIOManager: partitioned (multi-)assets materialized into a temporary store."""

import json
import os

import dagster as dg
import numpy as np
import pytest

from corr_pipeline.defs.io_manager import (
    UNPARTITIONED,
    MatrixStoreIOManager,
    MatrixStoreResource,
)
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore
from corr_pipeline_tests.defs import io_assets
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.defs.io_assets import ASSETS, SYMBOLS, multiprocess_job
from corr_pipeline_tests.fixtures.deployment import use_store

PK = "2024-01-03"


def resources(base_dir) -> dict:
    use_store(base_dir)
    return {"io_manager": MatrixStoreIOManager(), "matrix_store": MatrixStoreResource()}


def expected_returns(partition_key: str) -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(4, 3) + io_assets.partition_day(partition_key)


def check_store(base_dir, partition_key: str, *, multi_asset: bool = True) -> None:
    store = MatrixStore(base_dir)
    part = base_dir / "returns_matrix" / partition_key
    manifest = json.loads((part / "bundle.manifest.json").read_text())
    versions = {name: entry["version"] for name, entry in manifest["arrays"].items()}
    assert sorted(versions) == ["returns", "valid"]
    current = sorted(
        f"{name}.{version}.{kind}" for name, version in versions.items() for kind in ("json", "npy")
    )
    # the current versions are there (older versions may remain until garbage collection)
    visible = sorted(p.name for p in part.iterdir() if not p.name.startswith("."))
    assert set(current) <= set(visible) and "bundle.manifest.json" in visible
    returns_file = part / f"returns.{versions['returns']}.npy"
    np.testing.assert_array_equal(np.load(returns_file), expected_returns(partition_key))
    sidecar = json.loads(returns_file.with_suffix(".json").read_text())
    assert sidecar["labels"] == {"symbols": SYMBOLS, "partition": partition_key}
    assert sidecar["shape"] == [4, 3] and sidecar["dtype"] == "<f4"
    assert sidecar["version"] == versions["returns"]
    assert store.load_bundle("returns_matrix", partition_key).versions == versions

    corr = store.load_bundle("correlation_matrix", partition_key)
    ref = np.corrcoef(expected_returns(partition_key).astype(np.float64), rowvar=False)
    np.testing.assert_allclose(corr["corr"], ref, rtol=1e-6)
    np.testing.assert_array_equal(corr["returns_sum"], expected_returns(partition_key).sum(axis=0))
    assert corr.labels["symbols"] == SYMBOLS

    # multi-asset: each output in its own asset directory
    if multi_asset:
        assert store.load_bundle("neighbors", partition_key)["index"].shape == (3, 3)
        assert store.load_bundle("clusters", partition_key)["labels"].dtype == np.int32
    assert not any(".tmp-" in p.name for p in base_dir.rglob("*"))


def test_materialize_partitioned_assets(tmp_path):
    base = tmp_path / "store"
    result = dg.materialize(ASSETS, partition_key=PK, resources=resources(base))
    assert result.success
    check_store(base, PK)

    mats = {m.asset_key.path[-1]: m for m in materializations(result, "correlation_matrix")}
    meta = mats["correlation_matrix"].metadata
    seen = meta["seen"].value
    assert seen["input_is_memmap"] and seen["input_read_only"]
    assert seen["input_labels"] == {"symbols": SYMBOLS, "partition": PK}
    # zero-copy: the allocated "corr" was reused, only the small array was copied
    assert meta["zero_copy_arrays"].value == 1
    assert meta["copied_bytes"].value == 3 * 4
    assert meta["path"].value == str(base.resolve() / "correlation_matrix" / PK)

    # the bundle handed downstream exposes the versions it was loaded from
    store = MatrixStore(base)
    assert seen["input_versions"] == store.load_bundle("returns_matrix", PK).versions
    assert store.load_bundle("correlation_matrix", PK).inputs == {
        "returns_matrix": seen["input_versions"]
    }
    versions = meta["versions"].value
    assert versions == store.load_bundle("correlation_matrix", PK).versions

    # a second partition lands next to the first; re-materializing commits new versions and a
    # new manifest; the old versions stay (immutable) until garbage collection
    before = store.load_bundle("returns_matrix", PK).versions
    held = store.load_bundle("returns_matrix", PK)
    assert dg.materialize(ASSETS, partition_key="2024-01-04", resources=resources(base)).success
    assert dg.materialize(ASSETS, partition_key=PK, resources=resources(base)).success
    check_store(base, "2024-01-04")
    check_store(base, PK)
    after = store.load_bundle("returns_matrix", PK).versions
    assert set(after) == set(before) and all(after[n] != before[n] for n in after)
    np.testing.assert_array_equal(held["returns"], expected_returns(PK))  # old map still valid
    assert store.has_version("returns_matrix", PK, "returns", before["returns"])
    report = store.collector.collect_garbage()
    assert {
        (v.partition, v.name, v.version) for v in report.deleted if v.asset == "returns_matrix"
    } == {(PK, name, version) for name, version in before.items()}
    assert not store.has_version("returns_matrix", PK, "returns", before["returns"])
    check_store(base, PK)
    assert MatrixStore(base).files.partitions("returns_matrix") == ["2024-01-03", "2024-01-04"]


def test_handle_output_rejects_non_bundles(tmp_path):
    @dg.asset
    def not_a_bundle() -> np.ndarray:
        return np.zeros(3)

    with pytest.raises(TypeError, match="needs a MatrixBundle"):
        dg.materialize([not_a_bundle], resources=resources(tmp_path))


def test_unpartitioned_asset(tmp_path):
    @dg.asset
    def plain() -> MatrixBundle:
        return MatrixBundle({"x": np.arange(3)})

    @dg.asset
    def child(plain: MatrixBundle) -> MatrixBundle:
        return MatrixBundle({"y": np.asarray(plain["x"]) * 2})

    assert dg.materialize([plain, child], resources=resources(tmp_path)).success
    np.testing.assert_array_equal(
        MatrixStore(tmp_path).load_bundle("child", UNPARTITIONED)["y"], [0, 2, 4]
    )


def test_multiprocess_executor(tmp_path):
    """Each step runs in its own subprocess: the IO manager finds the store in the environment
    the step process inherits."""
    base = use_store(tmp_path / "store")
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        result = dg.execute_job(
            dg.reconstructable(multiprocess_job),
            instance=instance,
            tags={"dagster/partition": PK},
        )
        assert result.success, [
            e.message for e in result.all_events if e.event_type_value == "STEP_FAILURE"
        ]
        pids = {e.pid for e in result.all_events if e.event_type_value == "STEP_START"}
        assert len(pids) == 2 and os.getpid() not in pids  # really separate processes
    check_store(base, PK, multi_asset=False)
