"""Matrix store (SPEC §8): round trips, read-only memmaps, immutable versions and the manifest
pointer, corrupt files, path safety, garbage collection, removal, permissions, copies, bundles
and scratch arrays; crashes and a full disk are in ``test_store_faults``."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.store.matrix_store import (
    CorruptMatrixError,
    InvalidStoreKeyError,
    MatrixBundle,
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    PartitionBusyError,
    StoredArray,
    VersionNotFoundError,
)
from corr_pipeline_tests.store.store_files import (
    CRASH_WRITER,
    P,
    final_files,
    sigkill,
    start_script,
    temp_files,
)

# ---- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array([[np.nan, 1.5], [-np.inf, 2.0]], dtype=np.float64),
        np.arange(-5, 5, dtype=np.int16).reshape(2, 5),
        np.array([True, False, True]),
        np.zeros((0, 7), dtype=np.float32),
        np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        np.array(3.25),
        np.array(
            [
                (1, 2, 3, 0.5, np.nan, 0.25, 40, 1e-9, 1e-7, 2, -0.25, 1e-3),
                (4, 5, 1, -0.75, 0.1, 0.5, 41, 0.5, 1.0, 0, np.nan, np.nan),
            ],
            dtype=LEAD_LAG_DTYPE,
        ),
        np.array(["AAPL", "ÉTÉ"], dtype="<U4"),
    ],
    ids=["f32", "f64-nan", "i16", "bool", "empty", "fortran", "0d", "structured", "unicode"],
)
@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(tmp_path, array, mmap):
    store = MatrixStore(tmp_path)
    labels = {"symbols": ["A", "B"], "n": 3}
    saved = store.save("asset_x", P, "m", array, labels=labels, params={"k": 10})
    loaded = store.load("asset_x", P, "m", mmap=mmap)
    for s in (saved, loaded):
        assert s.array.dtype == array.dtype
        assert s.array.shape == array.shape
        assert np.ascontiguousarray(s.array).tobytes() == np.ascontiguousarray(array).tobytes()
        assert s.labels == labels
        assert s.params == {"k": 10}
    assert loaded.version == saved.version
    assert loaded.meta["shape"] == list(array.shape)
    assert loaded.path == tmp_path.resolve() / "asset_x" / P / f"m.{saved.version}.npy"
    # the file is a standard .npy any tool can read
    assert np.load(loaded.path).tobytes("A") == array.tobytes("A")
    assert isinstance(loaded.array, np.memmap) == mmap


def test_labels_are_converted_to_json(tmp_path):
    store = MatrixStore(tmp_path)
    labels = {
        "symbols": np.array(["BRK.B", "AAPL"]),
        "dates": [dt.date(2024, 3, 27), dt.date(2024, 3, 28)],
        "dates64": np.array(["2024-03-27", "2024-03-28"], dtype="datetime64[D]"),
        "as_of": np.datetime64("2024-03-28"),
        "count": np.int64(7),
        "ratio": np.float32(0.5),
        "nested": {"a": (1, 2)},
    }
    store.save("a", P, "x", np.zeros(2), labels=labels)
    got = store.load("a", P, "x").labels
    assert got == {
        "symbols": ["BRK.B", "AAPL"],
        "dates": ["2024-03-27", "2024-03-28"],
        "dates64": ["2024-03-27", "2024-03-28"],
        "as_of": "2024-03-28",
        "count": 7,
        "ratio": 0.5,
        "nested": {"a": [1, 2]},
    }
    sidecar = json.loads(store.load("a", P, "x").path.with_suffix(".json").read_text())
    assert sidecar["labels"]["symbols"] == ["BRK.B", "AAPL"]
    assert {"shape", "dtype", "params", "created_at", "version"} <= set(sidecar)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        store.save("a", P, "y", np.zeros(2), labels={"bad": object()})
    assert not [p for p in (tmp_path / "a" / P).iterdir() if p.name.startswith("y.")]


def test_object_dtype_refused(tmp_path):
    with pytest.raises(TypeError, match="object"):
        MatrixStore(tmp_path).save("a", P, "x", np.array([{}, None], dtype=object))


def test_memmap_loads_are_read_only(tmp_path):
    store = MatrixStore(tmp_path)
    saved = store.save("a", P, "x", np.ones((4, 4), np.float32))
    arr = store.load("a", P, "x").array
    assert isinstance(arr, np.memmap)
    assert not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        arr[0, 0] = 5.0
    np.testing.assert_array_equal(np.load(saved.path), 1.0)


# ---- allocate / commit / abort ------------------------------------------------------------


def test_allocate_fill_commit(tmp_path):
    store = MatrixStore(tmp_path)
    directory = tmp_path / "corr" / P
    with store.allocate("corr", P, "corr", (64, 32), np.float32, labels={"n": 64}) as pending:
        assert isinstance(pending.array, np.memmap) and pending.array.flags.writeable
        assert np.count_nonzero(pending.array) == 0  # fresh contents are zero
        for start in range(0, 64, 16):  # tile by tile
            pending.array[start : start + 16] = np.arange(start, start + 16)[:, None]
        assert final_files(directory) == []  # nothing visible before commit
        assert len(temp_files(directory)) == 1
        assert pending.temp_path.parent == directory
        stored = pending.commit()
    assert pending.state == "committed"
    assert isinstance(stored, StoredArray) and not stored.array.flags.writeable
    np.testing.assert_array_equal(stored.array[:, 0], np.arange(64))
    v = stored.version
    assert final_files(directory) == [f"corr.{v}.json", f"corr.{v}.npy"]
    assert temp_files(directory) == []
    # a committed version exists but is not current until a manifest names it
    assert not store.exists("corr", P, "corr")
    assert store.load("corr", P, "corr", version=v).version == v
    store.manifests.set_current(stored)
    assert store.load("corr", P, "corr").version == v
    assert final_files(directory) == ["bundle.manifest.json", f"corr.{v}.json", f"corr.{v}.npy"]
    with pytest.raises(MatrixStoreError, match="committed"):
        pending.array  # noqa: B018
    with pytest.raises(MatrixStoreError, match="already committed"):
        pending.commit()


def test_exception_in_with_block_aborts_and_keeps_previous(tmp_path):
    store = MatrixStore(tmp_path)
    store.save("a", P, "x", np.full(5, 1.0))
    with pytest.raises(RuntimeError, match="kernel failed"):
        with store.allocate("a", P, "x", (5,), np.float64) as pending:
            pending.array[:] = 2.0
            raise RuntimeError("kernel failed")
    assert pending.state == "aborted"
    np.testing.assert_array_equal(store.load("a", P, "x").array, 1.0)
    assert temp_files(tmp_path / "a" / P) == []


def test_leaving_with_block_without_commit_is_an_error(tmp_path):
    store = MatrixStore(tmp_path)
    with pytest.raises(MatrixStoreError, match="without commit"):
        with store.allocate("a", P, "x", (5,), np.float64):
            pass
    assert not store.exists("a", P, "x")
    assert temp_files(tmp_path / "a" / P) == []


def test_explicit_abort(tmp_path):
    store = MatrixStore(tmp_path)
    pending = store.allocate("a", P, "x", (3,), np.int32)
    pending.abort()
    assert temp_files(tmp_path / "a" / P) == []
    with pytest.raises(MatrixNotFoundError):
        store.load("a", P, "x")


def test_replace_is_atomic_and_readers_keep_their_version(tmp_path):
    store = MatrixStore(tmp_path)
    first = store.save("a", P, "x", np.full((3, 3), 1.0), labels={"v": 1})
    held = store.load("a", P, "x")
    second = store.save("a", P, "x", np.full((5, 2), 2.0, np.float32), labels={"v": 2})
    assert second.version != first.version
    # a reader's map still shows the complete old version (files are never modified in place)
    np.testing.assert_array_equal(held.array, np.full((3, 3), 1.0))
    now = store.load("a", P, "x")
    assert now.array.shape == (5, 2) and now.array.dtype == np.float32 and now.labels == {"v": 2}
    # both versions are on disk (immutable) until garbage collection; the old one stays loadable
    v1, v2 = first.version, second.version
    assert final_files(tmp_path / "a" / P) == sorted(
        ["bundle.manifest.json"] + [f"x.{v}.{k}" for v in (v1, v2) for k in ("json", "npy")]
    )
    np.testing.assert_array_equal(store.load("a", P, "x", version=v1).array, np.full((3, 3), 1.0))
    assert [v.version for v in store.collector.collect_garbage().deleted] == [v1]
    assert final_files(tmp_path / "a" / P) == [
        "bundle.manifest.json",
        f"x.{v2}.json",
        f"x.{v2}.npy",
    ]
    np.testing.assert_array_equal(held.array, np.full((3, 3), 1.0))  # the map outlives the file


def test_concurrent_writers_and_reader_never_see_a_mismatch(tmp_path):
    """Two writers re-commit the same array while a reader loads it: every load pairs an
    array with its own sidecar (array value == labels['value'])."""
    store = MatrixStore(tmp_path)
    store.save("a", P, "x", np.full(1000, 0.0), labels={"value": 0})
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        try:
            for i in range(60):
                v = base + i
                with store.allocate("a", P, "x", (1000,), np.float64, labels={"value": v}) as p:
                    p.array[:] = v
                    store.manifests.set_current(p.commit())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    loads = 0

    def reader() -> None:
        nonlocal loads
        try:
            while not stop.is_set():
                s = store.load("a", P, "x")
                assert np.all(s.array == s.labels["value"]), (s.array[0], s.labels)
                loads += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(b,)) for b in (1000, 2000)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert not errors, errors
    assert loads > 0
    final = store.load("a", P, "x")
    assert np.all(final.array == final.labels["value"])
    assert temp_files(tmp_path / "a" / P) == []


# ---- errors on missing / corrupt files -----------------------------------------------------


def test_missing_array_names_the_path(tmp_path):
    store = MatrixStore(tmp_path)
    with pytest.raises(MatrixNotFoundError, match=r"a/2024-03-28/nope\.npy") as info:
        store.load("a", P, "nope")
    assert isinstance(info.value, FileNotFoundError)


def test_truncated_array_is_reported(tmp_path):
    store = MatrixStore(tmp_path)
    s = store.save("a", P, "x", np.arange(100, dtype=np.float64))
    # simulate damage outside the store's protocol (e.g. a disk error): rewrite in place
    data = s.path.read_bytes()
    with open(s.path, "r+b") as f:
        f.truncate(len(data) - 8)
    meta = json.loads(s.path.with_suffix(".json").read_text())
    st = os.stat(s.path)
    meta["array_file"] = {"inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    s.path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(CorruptMatrixError, match=r"x\.\S+\.npy is 920 bytes, expected 928"):
        store.load("a", P, "x")


def test_bad_sidecar_json_is_reported(tmp_path):
    store = MatrixStore(tmp_path)
    s = store.save("a", P, "x", np.arange(3))
    s.path.with_suffix(".json").write_text("{not json")
    with pytest.raises(CorruptMatrixError, match=r"x\.\S+\.json is not valid JSON"):
        store.load("a", P, "x")


def test_sidecar_header_disagreement_is_reported(tmp_path):
    store = MatrixStore(tmp_path)
    s = store.save("a", P, "x", np.arange(6, dtype=np.int64))
    meta = json.loads(s.path.with_suffix(".json").read_text())
    meta["shape"] = [2, 3]
    s.path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(CorruptMatrixError, match="disagrees with its sidecar"):
        store.load("a", P, "x")


def test_array_swapped_under_sidecar_is_detected(tmp_path):
    """Another version's array under this sidecar (same shape/dtype) is caught by identity."""
    store = MatrixStore(tmp_path)
    mine = store.save("a", P, "x", np.zeros(4))
    other = store.save("a", "other", "x", np.ones(4))
    os.replace(other.path, mine.path)
    with pytest.raises(CorruptMatrixError, match="does not match its sidecar"):
        store.load("a", P, "x")


# ---- path safety ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "asset,partition,name",
    [
        ("../evil", P, "x"),
        ("a/b", P, "x"),
        ("", P, "x"),
        (".hidden", P, "x"),
        ("a", "..", "x"),
        ("a", "../../etc", "x"),
        ("a", "2024/03/28", "x"),
        ("a", "x..y", "x"),
        ("a", ".tmp", "x"),
        ("a", "", "x"),
        ("a", "/abs", "x"),
        ("a", P, "../x"),
        ("a", P, "x.y"),
        ("a", P, "x/y"),
        ("a", P, ""),
        ("a", "2024-03-28|AAPL", "x"),
        ("a", P + "\n", "x"),
    ],
)
def test_path_traversal_is_rejected(tmp_path, asset, partition, name):
    base = tmp_path / "store"
    store = MatrixStore(base)
    with pytest.raises(InvalidStoreKeyError):
        store.save(asset, partition, name, np.zeros(2))
    with pytest.raises(InvalidStoreKeyError):
        store.load(asset, partition, name)
    with pytest.raises(InvalidStoreKeyError):
        store.allocate(asset, partition, name, (2,), np.float32)
    assert list(base.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_valid_keys(tmp_path):
    store = MatrixStore(tmp_path)
    for partition in ("2024-03-28", "_unpartitioned", "v1.2_x-y"):
        store.save("Asset_1", partition, "name_2", np.zeros(1))
    assert store.files.partitions("Asset_1") == ["2024-03-28", "_unpartitioned", "v1.2_x-y"]
    assert store.manifests.names("Asset_1", "2024-03-28") == ["name_2"]


# ---- versions, pins, garbage collection -----------------------------------------------------


def test_versions_are_immutable_and_pinnable(tmp_path):
    store = MatrixStore(tmp_path)
    v1 = store.save("a", P, "x", np.full(3, 1.0))
    v2 = store.save("a", P, "x", np.full(3, 2.0))
    assert v1.version < v2.version  # versions sort by commit time
    assert store.manifests.current_version("a", P, "x") == v2.version
    np.testing.assert_array_equal(store.load("a", P, "x", version=v1.version).array, 1.0)
    np.testing.assert_array_equal(store.load("a", P, "x").array, 2.0)
    assert v1.path.exists() and v1.path != v2.path
    with pytest.raises(VersionNotFoundError) as info:
        store.load("a", P, "x", version="20000101T000000000000Z-00000000")
    assert info.value.version == "20000101T000000000000Z-00000000"
    with pytest.raises(InvalidStoreKeyError):
        store.load("a", P, "x", version="../x")
    assert store.manifests.delete("a", P, "x") and not store.exists("a", P, "x")
    assert store.has_version("a", P, "x", v2.version)  # dropped from the manifest, not deleted
    with pytest.raises(MatrixNotFoundError):
        store.load("a", P, "x")


HOLD_A_VERSION = """
import sys, time, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
store = MatrixStore(sys.argv[1])
with store.allocate("c", "2024-03-28", "corr", (4, 4), np.float32) as pending:
    pending.array[:] = 3.0
    stored = pending.commit()       # committed, not yet named by a manifest
print(stored.version, flush=True)
time.sleep(120)
"""


def test_garbage_collection_keeps_exactly_what_is_needed(tmp_path):
    """Deleted: superseded versions nobody pins, an orphan sidecar of an interrupted commit and
    a dead writer's temp file. Kept: the current manifest's versions, the versions another
    bundle records as its inputs, the caller's pins, and a version another live process has
    committed but not yet named."""
    store = MatrixStore(tmp_path)
    old_corr = store.save("c", P, "corr", np.full((4, 4), 1.0, np.float32))
    input_corr = store.save("c", P, "corr", np.full((4, 4), 2.0, np.float32))
    current_corr = store.save("c", P, "corr", np.full((4, 4), 2.5, np.float32))
    pinned_ov = store.save("o", P, "overlap", np.full((4, 4), 5, np.int16))
    superseded_ov = store.save("o", P, "overlap", np.full((4, 4), 6, np.int16))
    current_ov = store.save("o", P, "overlap", np.full((4, 4), 7, np.int16))
    consumer = store.load_bundle("c", P)
    consumer.arrays["corr"] = store.load("c", P, "corr", version=input_corr.version)
    store.save_bundle(
        "n", P, MatrixBundle({"index": np.zeros((4, 2), np.int32)}, inputs=consumer.source())
    )
    other = store.save("c", "2024-03-29", "corr", np.zeros((2, 2), np.float32))
    store.save("c", "2024-03-29", "corr", np.ones((2, 2), np.float32))
    # an orphan sidecar: a commit killed between its sidecar and its array rename
    orphan = tmp_path / "c" / P / "corr.20200101T000000000000Z-deadbeef.json"
    orphan.write_text(current_corr.path.with_suffix(".json").read_text())
    # a dead writer's temp file
    proc = start_script(CRASH_WRITER, str(tmp_path))
    dead_temp = Path(proc.stdout.readline().strip())
    sigkill(proc)
    holder = start_script(HOLD_A_VERSION, str(tmp_path))
    try:
        held_version = holder.stdout.readline().strip()
        assert held_version, holder.stderr.read()
        report = store.collector.collect_garbage({P: {"o": {"overlap": pinned_ov.version}}})
        deleted = {(v.asset, v.partition, v.name, v.version) for v in report.deleted}
        assert deleted == {
            ("c", P, "corr", old_corr.version),
            ("c", P, "corr", "20200101T000000000000Z-deadbeef"),
            ("o", P, "overlap", superseded_ov.version),
            ("c", "2024-03-29", "corr", other.version),
        }
        assert report.temps_removed == [dead_temp] and not dead_temp.exists()
        assert [v.version for v in report.kept_busy] == [held_version]
        assert report.freed_bytes > 0 and report.busy_partitions == []
        remaining = {(v.asset, v.name, v.version) for v in store.files.versions("c", P)}
        remaining |= {(v.asset, v.name, v.version) for v in store.files.versions("o", P)}
        assert remaining == {
            ("c", "corr", input_corr.version),
            ("c", "corr", current_corr.version),
            ("c", "corr", held_version),
            ("o", "overlap", pinned_ov.version),
            ("o", "overlap", current_ov.version),
        }
        # everything kept still loads, byte for byte
        assert store.load("c", P, "corr", version=input_corr.version).array[0, 0] == 2.0
        assert store.load("o", P, "overlap", version=pinned_ov.version).array[0, 0] == 5
    finally:
        sigkill(holder)
    # the holder is gone: its never-named version is garbage now; unpinned, so is the overlap
    report = store.collector.collect_garbage()
    assert {v.version for v in report.deleted} == {held_version, pinned_ov.version}


HOLD_PARTITION = """
import sys, time
from corr_pipeline.store.matrix_store import MatrixStore
held = MatrixStore(sys.argv[1]).hold_partition("c", "2024-03-28")
print("held", flush=True)
time.sleep(120)
"""


def test_a_partition_in_use_by_another_process_is_left_alone(tmp_path):
    store = MatrixStore(tmp_path)
    old = store.save("c", P, "corr", np.zeros(3))
    store.save("c", P, "corr", np.ones(3))
    proc = start_script(HOLD_PARTITION, str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "held", proc.stderr.read()
        report = store.collector.collect_garbage()
        assert report.busy_partitions == [P] and report.deleted == []
        with pytest.raises(PartitionBusyError):
            store.collector.remove_partition(P)
        with store.collector.exclusive_partition(P) as free:
            assert not free
    finally:
        sigkill(proc)
    assert [v.version for v in store.collector.collect_garbage().deleted] == [old.version]


def test_remove_partition_records_what_it_removed(tmp_path):
    store = MatrixStore(tmp_path)
    corr = store.save("c", P, "corr", np.zeros((3, 3)))
    store.save_bundle("n", P, MatrixBundle({"index": np.zeros(3, np.int32)}))
    store.save("c", "2024-03-29", "corr", np.zeros((3, 3)))
    dry = store.collector.remove_partition(P, reason="test", dry_run=True)
    assert dry.assets == ["c", "n"] and dry.bytes > 0 and store.exists("c", P, "corr")
    assert store.pruned(P) is None
    report = store.collector.remove_partition(P, reason="test")
    assert report.assets == ["c", "n"] and len(report.versions) == 2
    assert not (tmp_path / "c" / P).exists() and not (tmp_path / "n" / P).exists()
    assert store.files.partition_keys() == ["2024-03-29"]
    record = store.pruned(P)
    assert record["reason"] == "test"
    assert record["versions"]["c"] == {"corr": [corr.version]}
    with pytest.raises(MatrixNotFoundError):
        store.load("c", P, "corr", version=corr.version)
    store.save("c", P, "corr", np.ones((3, 3)))  # the partition can be materialized again
    assert store.load("c", P, "corr").array[0, 0] == 1.0


# ---- permissions and copies -------------------------------------------------------------------

WRITE_UNDER_UMASK = """
import os, sys, numpy as np
os.umask(int(sys.argv[2], 8))
from corr_pipeline.store.matrix_store import MatrixStore, MatrixBundle
store = MatrixStore(sys.argv[1])
store.save("a", "2024-03-28", "x", np.arange(3.0))
store.save("a", "2024-03-28", "x", np.arange(4.0))
store.save_bundle("b", "2024-03-28", MatrixBundle({"y": np.ones(2)}))
store.collector.collect_garbage()
store.save("a", "2024-03-29", "x", np.arange(3.0))
store.collector.remove_partition("2024-03-29", reason="test")
"""


@pytest.mark.parametrize("umask", ["000", "022", "277"])
def test_store_files_are_private_whatever_the_umask(tmp_path, umask):
    base = tmp_path / "home" / "store"
    proc = subprocess.run(
        [sys.executable, "-c", WRITE_UNDER_UMASK, str(base), umask], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    modes = {
        str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode)
        for p in [tmp_path / "home", *tmp_path.joinpath("home").rglob("*")]
    }
    assert any(name.endswith(".npy") for name in modes) and any(".retention" in n for n in modes)
    for name, mode in modes.items():
        want = 0o700 if (tmp_path / name).is_dir() else 0o600
        assert mode == want, (name, oct(mode))


def _copy(src: Path, dst: Path, how: str) -> None:
    if how == "cp -a":
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    elif how == "tar":
        archive = dst.parent / "store.tar"
        subprocess.run(["tar", "-C", str(src), "-cf", str(archive), "."], check=True)
        dst.mkdir()
        subprocess.run(["tar", "-C", str(dst), "-xf", str(archive)], check=True)
    else:  # a plain copy: new inodes, new modification times
        shutil.copytree(src, dst, copy_function=shutil.copyfile)


@pytest.mark.parametrize("how", ["cp -a", "tar", "copy"])
def test_a_faithful_copy_loads_and_damage_is_still_detected(tmp_path, how):
    src = MatrixStore(tmp_path / "src")
    x = src.save("a", P, "x", np.arange(1000, dtype=np.float64).reshape(100, 10))
    other = src.save("a", "other", "x", np.arange(1000, dtype=np.float64).reshape(100, 10) + 1)
    src.save_bundle("b", P, MatrixBundle({"y": np.ones(3, np.int16)}, labels={"s": ["A"]}))
    _copy(tmp_path / "src", tmp_path / "dst", how)
    dst = MatrixStore(tmp_path / "dst")
    loaded = dst.load("a", P, "x")
    assert loaded.version == x.version and loaded.path.parent == tmp_path / "dst" / "a" / P
    np.testing.assert_array_equal(loaded.array, x.array)
    np.testing.assert_array_equal(dst.load("a", P, "x", version=x.version).array, x.array)
    assert dst.load_bundle("b", P).labels == {"s": ["A"]}

    # damage in the copy is still detected: size, shape, dtype, version, other data
    path = loaded.path
    side = path.with_suffix(".json")
    pristine_data, pristine_side = path.read_bytes(), side.read_text()

    def edit_sidecar(**changes) -> None:
        side.write_text(json.dumps({**json.loads(pristine_side), **changes}))

    cases = [
        (lambda: path.write_bytes(pristine_data[:-8]), "is 8120 bytes, expected 8128"),
        (lambda: edit_sidecar(shape=[10, 100]), "disagrees with its sidecar"),
        (lambda: edit_sidecar(dtype="<f4"), "disagrees with its sidecar"),
        (lambda: edit_sidecar(version=other.version), "belongs to"),
        (lambda: path.write_bytes(other.path.read_bytes()), "does not match its sidecar"),
    ]
    for damage, message in cases:
        damage()
        with pytest.raises(CorruptMatrixError, match=message):
            dst.load("a", P, "x")
        path.write_bytes(pristine_data)
        side.write_text(pristine_side)
        assert dst.load("a", P, "x").version == x.version


# ---- bundles ------------------------------------------------------------------------------


def test_bundle_zero_copy_link_and_copy(tmp_path):
    store = MatrixStore(tmp_path)
    upstream = store.save("returns", P, "returns", np.arange(6.0).reshape(2, 3))
    with store.allocate("corr", P, "corr", (3, 3), np.float32, labels={"s": 1}) as pending:
        pending.array[:] = np.eye(3)
        committed = pending.commit()
    inode_before = os.stat(committed.path).st_ino
    report = store.save_bundle(
        "corr",
        P,
        MatrixBundle(
            {"corr": committed, "returns_copy": upstream, "small": np.array([1, 2, 3])},
            labels={"symbols": ["A", "B", "C"]},
            params={"min_overlap": 2},
            inputs={"returns": {"returns": upstream.version}},
        ),
    )
    assert report.reused == ["corr"]
    assert report.linked == ["returns_copy"]
    assert report.copied == ["small"]
    assert report.copied_bytes == 3 * np.dtype(np.int_).itemsize
    assert os.stat(committed.path).st_ino == inode_before  # not rewritten
    assert (
        os.stat(report.bundle.stored("returns_copy").path).st_ino == os.stat(upstream.path).st_ino
    )

    bundle = store.load_bundle("corr", P)
    assert bundle.names == ["corr", "returns_copy", "small"]
    assert bundle.labels == {"symbols": ["A", "B", "C"]} and bundle.params == {"min_overlap": 2}
    assert bundle.inputs == {"returns": {"returns": upstream.version}}
    assert bundle.versions == report.bundle.versions and bundle.asset == "corr"
    assert bundle.source() == {"corr": bundle.versions}
    np.testing.assert_array_equal(bundle["corr"], np.eye(3))
    np.testing.assert_array_equal(bundle["returns_copy"], np.arange(6.0).reshape(2, 3))
    assert bundle.stored("corr").version == committed.version
    assert all(isinstance(bundle[n], np.memmap) for n in bundle.names)

    # a re-materialization with fewer arrays drops the leftovers from the manifest
    report2 = store.save_bundle("corr", P, MatrixBundle({"corr": np.zeros((2, 2))}))
    assert report2.removed == ["returns_copy", "small"]
    assert report2.superseded == {"corr": committed.version}
    assert store.manifests.names("corr", P) == ["corr"]
    assert store.load_bundle("corr", P).names == ["corr"]


def test_an_older_stored_version_is_reused_as_is(tmp_path):
    """A StoredArray of an older version of the same location: versions are immutable, so the
    bundle names exactly that version again, without a copy, and holds what the caller passed."""
    store = MatrixStore(tmp_path)
    old = store.save("a", P, "x", np.full(3, 1.0))
    store.save("a", P, "x", np.full(3, 2.0))
    report = store.save_bundle("a", P, MatrixBundle({"x": old}))
    assert report.reused == ["x"]
    np.testing.assert_array_equal(store.load_bundle("a", P)["x"], np.full(3, 1.0))
    assert store.load_bundle("a", P).versions == {"x": old.version}


def test_bundle_errors(tmp_path):
    store = MatrixStore(tmp_path)
    with pytest.raises(MatrixNotFoundError, match="bundle.manifest.json"):
        store.load_bundle("a", P)
    pending = store.allocate("a", P, "x", (2,), np.float32)
    with pytest.raises(MatrixStoreError, match="call commit"):
        store.save_bundle("a", P, MatrixBundle({"x": pending}))
    pending.abort()
    report = store.save_bundle("a", P, MatrixBundle({"x": np.zeros(2)}))
    with pytest.raises(InvalidStoreKeyError):
        store.save_bundle("a", P, MatrixBundle({"x": np.zeros(2)}, inputs={"b": {"y": "v1"}}))
    os.unlink(report.bundle.stored("x").path)  # deleted outside the store's protocol
    with pytest.raises(CorruptMatrixError, match="expects"):
        store.load_bundle("a", P)


def test_a_partition_of_the_older_format_is_refused_clearly_then_replaced(tmp_path):
    """A store written by the format-1 code (one replaceable ``<name>.npy`` per array): loads
    say to re-materialize; re-materializing writes a format-2 manifest over the old one, and
    garbage collection removes the old files."""
    directory = tmp_path / "a" / P
    directory.mkdir(parents=True)
    np.save(directory / "x.npy", np.zeros(3))
    (directory / "x.json").write_text(json.dumps({"format": 1, "version": "ab" * 16}))
    (directory / "bundle.manifest.json").write_text(
        json.dumps({"format": 1, "arrays": {"x": {"version": "ab" * 16}}})
    )
    (directory / ".x.lock").write_text("")
    store = MatrixStore(tmp_path)
    with pytest.raises(CorruptMatrixError, match="older corr_pipeline .* re-materialize"):
        store.load("a", P, "x")
    report = store.save_bundle("a", P, MatrixBundle({"x": np.ones(3)}))
    np.testing.assert_array_equal(store.load("a", P, "x").array, 1.0)
    garbage = store.collector.collect_garbage()
    assert sorted(p.name for p in garbage.legacy_removed) == [".x.lock", "x.json", "x.npy"]
    assert final_files(directory) == sorted(
        ["bundle.manifest.json"]
        + [report.bundle.stored("x").path.name[: -len("npy")] + k for k in ("json", "npy")]
    )


# ---- scratch arrays ---------------------------------------------------------------------------


def test_scratch_is_a_file_in_the_partition_removed_after_the_block(tmp_path):
    """A zero-filled, writable, file-backed array in ``<asset>/<partition>/`` while the block
    runs; afterwards no file, no version, no manifest."""
    store = MatrixStore(tmp_path)
    directory = tmp_path / "clusters" / P
    with store.scratch("clusters", P, "work", (1000,), np.float64) as work:
        assert isinstance(work, np.memmap) and work.flags.writeable
        assert work.shape == (1000,) and work.dtype == np.float64
        assert not work.any()
        (temp,) = temp_files(directory)
        assert temp.startswith(".work.") and Path(work.filename).name == temp
        work[:] = np.arange(1000.0)
        assert store.files.cleanup_stale_temps() == []  # locked: a live writer's file stays
        del work
    assert list(directory.iterdir()) == [directory / ".partition.lock"]
    assert (
        store.files.versions("clusters", P) == [] and store.manifests.current("clusters", P) is None
    )


def test_scratch_removed_when_the_block_raises(tmp_path):
    store = MatrixStore(tmp_path)
    directory = tmp_path / "clusters" / P
    with pytest.raises(ZeroDivisionError):
        with store.scratch("clusters", P, "work", (64, 64), np.float64) as work:
            work[0, 0] = 1.0
            assert len(temp_files(directory)) == 1
            raise ZeroDivisionError
    assert temp_files(directory) == []


SCRATCH_THEN_SIGKILL = """
import os, signal, sys, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
with MatrixStore(sys.argv[1]).scratch("clusters", "2024-03-28", "work", (4096,), np.float64) as w:
    w[:] = 1.0
    print(w.filename, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("cleaner", ["allocate", "collect_garbage"])
def test_scratch_of_a_killed_process_is_removed_by_the_next_allocate_or_gc(tmp_path, cleaner):
    store = MatrixStore(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", SCRATCH_THEN_SIGKILL, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    temp = Path(proc.stdout.strip())
    assert temp.exists() and temp.parent == tmp_path / "clusters" / P
    if cleaner == "allocate":
        with store.scratch("clusters", P, "work", (10,), np.float64):
            assert not temp.exists()
    else:
        assert store.collector.collect_garbage().temps_removed == [temp]
    assert temp_files(tmp_path / "clusters" / P) == []
