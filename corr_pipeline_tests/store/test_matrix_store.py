"""Matrix store (SPEC §8): round trips, read-only memmaps, atomic replace, crash and disk-full safety."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import signal
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
    StoredArray,
)

P = "2024-03-28"


def final_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


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
            [(1, 2, 3, 0.5, np.nan, 0.25, 40), (4, 5, 1, -0.75, 0.1, 0.5, 41)], dtype=LEAD_LAG_DTYPE
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
    assert loaded.path == tmp_path.resolve() / "asset_x" / P / "m.npy"
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
    sidecar = json.loads((tmp_path / "a" / P / "x.json").read_text())
    assert sidecar["labels"]["symbols"] == ["BRK.B", "AAPL"]
    assert {"shape", "dtype", "params", "created_at", "version"} <= set(sidecar)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        store.save("a", P, "y", np.zeros(2), labels={"bad": object()})
    assert not (tmp_path / "a" / P / "y.npy").exists()


def test_object_dtype_refused(tmp_path):
    with pytest.raises(TypeError, match="object"):
        MatrixStore(tmp_path).save("a", P, "x", np.array([{}, None], dtype=object))


def test_memmap_loads_are_read_only(tmp_path):
    store = MatrixStore(tmp_path)
    store.save("a", P, "x", np.ones((4, 4), np.float32))
    arr = store.load("a", P, "x").array
    assert isinstance(arr, np.memmap)
    assert not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        arr[0, 0] = 5.0
    np.testing.assert_array_equal(np.load(tmp_path / "a" / P / "x.npy"), 1.0)


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
    assert final_files(directory) == ["corr.json", "corr.npy"]
    assert temp_files(directory) == []
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
    assert final_files(tmp_path / "a" / P) == ["x.json", "x.npy"]


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
                    p.commit()
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
    with pytest.raises(CorruptMatrixError, match=r"x\.npy is 920 bytes, expected 928"):
        store.load("a", P, "x")


def test_bad_sidecar_json_is_reported(tmp_path):
    store = MatrixStore(tmp_path)
    s = store.save("a", P, "x", np.arange(3))
    s.path.with_suffix(".json").write_text("{not json")
    with pytest.raises(CorruptMatrixError, match=r"x\.json is not valid JSON"):
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
    store.save("a", P, "x", np.zeros(4))
    other = store.save("a", "other", "x", np.ones(4))
    os.replace(other.path, tmp_path / "a" / P / "x.npy")
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
    assert store.partitions("Asset_1") == ["2024-03-28", "_unpartitioned", "v1.2_x-y"]
    assert store.names("Asset_1", "2024-03-28") == ["name_2"]


# ---- crash safety (real SIGKILL) -----------------------------------------------------------

CRASH_WRITER = """
import sys, time, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
store = MatrixStore(sys.argv[1])
n_rows, n_cols = 2048, 4096                     # 32 MiB of float32
pending = store.allocate("corr", "2024-03-28", "corr", (n_rows, n_cols), np.float32,
                         labels={"version": "new"})
for start in range(0, n_rows // 2, 128):        # fill half, tile by tile
    pending.array[start:start + 128] = 7.0
pending.array.flush()
print(pending.temp_path, flush=True)
time.sleep(120)                                  # killed here
"""


def test_sigkill_mid_write_leaves_previous_version(tmp_path):
    store = MatrixStore(tmp_path)
    previous = store.save(
        "corr", P, "corr", np.full((8, 8), 3.0, np.float32), labels={"version": "old"}
    )
    before = previous.path.read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        temp_line = proc.stdout.readline().strip()
        assert temp_line, proc.stderr.read()
        temp = Path(temp_line)
        assert temp.exists() and temp.stat().st_size > 32 * 2**20
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    directory = tmp_path / "corr" / P
    # the previous version is intact and readable; nothing partial under the final name
    assert final_files(directory) == ["corr.json", "corr.npy"]
    assert previous.path.read_bytes() == before
    again = store.load("corr", P, "corr")
    np.testing.assert_array_equal(again.array, np.full((8, 8), 3.0, np.float32))
    assert again.labels == {"version": "old"} and again.version == previous.version
    # the dead writer's temp file is cleaned up, the committed files are not
    assert temp_files(directory) == [temp.name]
    assert store.cleanup_stale_temps(asset="corr", partition="other") == []
    assert store.cleanup_stale_temps(asset="other_asset") == []
    removed = store.cleanup_stale_temps(asset="corr")
    assert removed == [temp]
    assert temp_files(directory) == []
    assert store.load("corr", P, "corr").version == previous.version


def test_allocate_cleans_up_a_crashed_attempt(tmp_path):
    store = MatrixStore(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        temp = Path(proc.stdout.readline().strip())
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert temp.exists()
    with store.allocate("corr", P, "corr", (2, 2), np.float32) as retry:  # the retry
        assert not temp.exists()
        assert temp_files(tmp_path / "corr" / P) == [retry.temp_path.name]
        retry.commit()


CRASH_BETWEEN_RENAMES = """
import os, signal, sys, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
real_replace = os.replace
def replace_then_die(src, dst):
    real_replace(src, dst)
    if str(dst).endswith(".npy"):                 # right after the commit point
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace_then_die
store = MatrixStore(sys.argv[1])
store.save("a", "2024-03-28", "x", np.full(10, 9.0), labels={"version": "new"})
"""


def test_sigkill_between_array_and_sidecar_rename(tmp_path):
    """The array rename is the commit point: the new version is readable at once (its
    complete temp sidecar is used) and cleanup rolls the sidecar forward."""
    store = MatrixStore(tmp_path)
    store.save("a", P, "x", np.full(4, 1.0), labels={"version": "old"})
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_BETWEEN_RENAMES, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    directory = tmp_path / "a" / P
    assert len(temp_files(directory)) == 1 and temp_files(directory)[0].startswith(".x.json.tmp-")
    old_sidecar = json.loads((directory / "x.json").read_text())
    assert old_sidecar["labels"] == {"version": "old"}  # stale sidecar on disk...
    loaded = store.load("a", P, "x")  # ...yet the load is consistent
    np.testing.assert_array_equal(loaded.array, np.full(10, 9.0))
    assert loaded.labels == {"version": "new"}
    assert store.cleanup_stale_temps() == []  # rolled forward, nothing deleted
    assert temp_files(directory) == []
    assert json.loads((directory / "x.json").read_text())["labels"] == {"version": "new"}
    assert store.load("a", P, "x").version == loaded.version


def test_cleanup_keeps_live_writers_temps(tmp_path):
    store = MatrixStore(tmp_path)
    pending = store.allocate("a", P, "x", (10,), np.float32)
    assert store.cleanup_stale_temps() == []
    assert pending.temp_path.exists()
    assert store.cleanup_stale_temps(max_age_seconds=3600) == []
    os.utime(pending.temp_path, (0, 0))  # ancient: stale by age (shared-filesystem mode)
    assert store.cleanup_stale_temps(max_age_seconds=3600) == [pending.temp_path]
    pending.abort()


# ---- disk full (RLIMIT_FSIZE in a subprocess) ----------------------------------------------

DISK_FULL = """
import json, resource, sys, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore, MatrixStoreSpaceError
store = MatrixStore(sys.argv[1])
limit = 1 << 20                                            # 1 MiB per file
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
out = {}
def attempt(key, fn):
    try:
        fn()
        out[key] = None
    except MatrixStoreSpaceError as exc:
        out[key] = {"type": type(exc).__name__, "errno": exc.errno, "msg": str(exc),
                    "path": str(exc.path)}
# 1) the array itself does not fit (allocate reserves the space up front)
attempt("allocate", lambda: store.allocate("a", "2024-03-28", "x", (1024, 1024), np.float32))
# 2) the copy path of save()
attempt("save", lambda: store.save("a", "2024-03-28", "x", np.ones((600, 600))))
# 3) the array fits but its sidecar does not
attempt("sidecar", lambda: store.save("a", "2024-03-28", "x", np.ones(10),
                                      labels={"big": "s" * (2 << 20)}))
print(json.dumps(out))
"""


def test_disk_full_gives_clean_error_and_consistent_store(tmp_path):
    store = MatrixStore(tmp_path)
    previous = store.save("a", P, "x", np.arange(5.0), labels={"version": "old"})
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("allocate", "save", "sidecar"):
        err = out[key]
        assert err is not None, key
        assert err["type"] == "MatrixStoreSpaceError"
        assert err["errno"] == errno.EFBIG
        assert str(tmp_path / "a" / P / "x.npy") in err["msg"]
        assert err["path"] == str(tmp_path.resolve() / "a" / P / "x.npy")
        assert "out of disk space" in err["msg"]
    directory = tmp_path / "a" / P
    assert temp_files(directory) == []
    assert final_files(directory) == ["x.json", "x.npy"]
    again = store.load("a", P, "x")
    assert again.version == previous.version
    np.testing.assert_array_equal(again.array, np.arange(5.0))


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
        ),
    )
    assert report.reused == ["corr"]
    assert report.linked == ["returns_copy"]
    assert report.copied == ["small"]
    assert report.copied_bytes == 3 * np.dtype(np.int_).itemsize
    assert os.stat(committed.path).st_ino == inode_before  # not rewritten
    assert (
        os.stat(tmp_path / "corr" / P / "returns_copy.npy").st_ino == os.stat(upstream.path).st_ino
    )

    bundle = store.load_bundle("corr", P)
    assert bundle.names == ["corr", "returns_copy", "small"]
    assert bundle.labels == {"symbols": ["A", "B", "C"]} and bundle.params == {"min_overlap": 2}
    np.testing.assert_array_equal(bundle["corr"], np.eye(3))
    np.testing.assert_array_equal(bundle["returns_copy"], np.arange(6.0).reshape(2, 3))
    assert bundle.stored("corr").version == committed.version
    assert all(isinstance(bundle[n], np.memmap) for n in bundle.names)

    # a re-materialization with fewer arrays removes the leftovers
    report2 = store.save_bundle("corr", P, MatrixBundle({"corr": np.zeros((2, 2))}))
    assert report2.removed == ["returns_copy", "small"]
    assert store.names("corr", P) == ["corr"]
    assert store.load_bundle("corr", P).names == ["corr"]


def test_stale_stored_array_is_not_reused(tmp_path):
    """A StoredArray whose location was re-written since it was loaded is re-linked from
    the object's own (old) file, so the bundle holds what the caller passed."""
    store = MatrixStore(tmp_path)
    old = store.save("a", P, "x", np.full(3, 1.0))
    store.save("a", P, "x", np.full(3, 2.0))
    report = store.save_bundle("a", P, MatrixBundle({"x": old}))
    assert report.reused == []
    np.testing.assert_array_equal(store.load_bundle("a", P)["x"], np.full(3, 1.0))


def test_bundle_errors(tmp_path):
    store = MatrixStore(tmp_path)
    with pytest.raises(MatrixNotFoundError, match="bundle.manifest.json"):
        store.load_bundle("a", P)
    pending = store.allocate("a", P, "x", (2,), np.float32)
    with pytest.raises(MatrixStoreError, match="call commit"):
        store.save_bundle("a", P, MatrixBundle({"x": pending}))
    pending.abort()
    store.save_bundle("a", P, MatrixBundle({"x": np.zeros(2)}))
    store.save("a", P, "x", np.ones(2))  # re-written behind the manifest's back
    with pytest.raises(CorruptMatrixError, match="expects"):
        store.load_bundle("a", P)
