"""Matrix store (SPEC §8) under faults: a writer killed (real SIGKILL) at each step of a write,
stale temp files (a writer is alive while it holds its lock), Ctrl-C, and a real full file
system."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from corr_pipeline.store.matrix_store import (
    MatrixStore,
    MatrixStoreSpaceError,
    PartitionBusyError,
    StoredArray,
)
from corr_pipeline_tests.store.store_files import (
    CRASH_WRITER,
    P,
    final_files,
    sigkill,
    start_script,
    temp_files,
)

# ---- crash safety (real SIGKILL) -----------------------------------------------------------


def test_sigkill_mid_write_leaves_previous_version(tmp_path):
    store = MatrixStore(tmp_path)
    previous = store.save(
        "corr", P, "corr", np.full((8, 8), 3.0, np.float32), labels={"version": "old"}
    )
    before = previous.path.read_bytes()
    proc = start_script(CRASH_WRITER, str(tmp_path))
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
    # the previous version is intact and readable; nothing partial under a final name
    v = previous.version
    assert final_files(directory) == ["bundle.manifest.json", f"corr.{v}.json", f"corr.{v}.npy"]
    assert previous.path.read_bytes() == before
    again = store.load("corr", P, "corr")
    np.testing.assert_array_equal(again.array, np.full((8, 8), 3.0, np.float32))
    assert again.labels == {"version": "old"} and again.version == previous.version
    # the dead writer's temp file is cleaned up, the committed files are not
    assert temp_files(directory) == [temp.name]
    assert store.files.cleanup_stale_temps(asset="corr", partition="other") == []
    assert store.files.cleanup_stale_temps(asset="other_asset") == []
    removed = store.files.cleanup_stale_temps(asset="corr")
    assert removed == [temp]
    assert temp_files(directory) == []
    assert store.load("corr", P, "corr").version == previous.version


def test_allocate_cleans_up_a_crashed_attempt(tmp_path):
    store = MatrixStore(tmp_path)
    proc = start_script(CRASH_WRITER, str(tmp_path))
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


CRASH_AFTER_RENAME = """
import os, signal, sys, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
real_replace = os.replace
def replace_then_die(src, dst):
    real_replace(src, dst)
    if str(dst).endswith(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace_then_die
store = MatrixStore(sys.argv[1])
store.save("a", "2024-03-28", "x", np.full(10, 9.0), labels={"version": "new"})
"""


def _killed_after_renaming(tmp_path: Path, target: str) -> tuple[MatrixStore, StoredArray]:
    """A store holding version "old" of ``a/x``, then a writer of version "new" SIGKILLed right
    after renaming the file ending in ``target`` into place: the store and the old version."""
    store = MatrixStore(tmp_path)
    old = store.save("a", P, "x", np.full(4, 1.0), labels={"version": "old"})
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_RENAME, str(tmp_path), target],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return store, old


def test_sigkill_before_the_manifest_commit_keeps_the_previous_version(tmp_path):
    """Killed right after the new version's array is renamed into place (sidecar written, both
    fsynced), before the manifest names it: the previous version stays current and whole; the
    new version is unreferenced and garbage collection removes it."""
    store, old = _killed_after_renaming(tmp_path, ".npy")
    directory = tmp_path / "a" / P
    assert temp_files(directory) == []
    (new,) = [v for v in store.files.versions("a", P) if v.version != old.version]
    assert new.complete
    loaded = store.load("a", P, "x")
    assert loaded.version == old.version and loaded.labels == {"version": "old"}
    np.testing.assert_array_equal(loaded.array, np.full(4, 1.0))
    report = store.collector.collect_garbage()
    assert [v.version for v in report.deleted] == [new.version]
    assert [v.version for v in store.files.versions("a", P)] == [old.version]


def test_sigkill_right_after_the_manifest_commit_shows_the_new_version(tmp_path):
    store, old = _killed_after_renaming(tmp_path, "bundle.manifest.json")
    loaded = store.load("a", P, "x")
    assert loaded.version != old.version and loaded.labels == {"version": "new"}
    np.testing.assert_array_equal(loaded.array, np.full(10, 9.0))
    assert temp_files(tmp_path / "a" / P) == []
    # the superseded version goes at the next garbage collection, unless pinned
    assert store.collector.collect_garbage({P: {"a": {"x": old.version}}}).deleted == []
    assert [v.version for v in store.collector.collect_garbage().deleted] == [old.version]


# ---- stale temp files: a writer is alive while it holds its lock --------------------------

LIVE_WRITER = """
import os, sys, time, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
store = MatrixStore(sys.argv[1])
pending = store.allocate("a", "2024-03-28", "x", (1000,), np.float64)
if sys.argv[2] == "fork":                        # the lock outlives the process that took it
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
print(pending.temp_path, flush=True)
if sys.argv[2] == "fork":
    os._exit(0)                                  # the writer process itself is gone
time.sleep(120)
"""


def test_cleanup_keeps_live_writers_temps(tmp_path):
    """A temp file whose writer holds its lock is kept however old it is (even in this very
    process), and deleted once the lock is gone."""
    store = MatrixStore(tmp_path)
    pending = store.allocate("a", P, "x", (10,), np.float32)
    assert store.files.cleanup_stale_temps() == []
    assert pending.temp_path.exists()
    os.utime(pending.temp_path, (0, 0))  # ancient: still alive, still kept
    assert store.files.cleanup_stale_temps() == []
    assert pending.temp_path.exists()
    pending.abort()
    assert not pending.temp_path.exists()


@pytest.mark.parametrize("how", ["plain", "fork"])
def test_stale_temp_cleanup_follows_the_lock_not_the_pid(tmp_path, how):
    """Another process writes: while it (or, ``fork``, a process that inherited its lock after
    the writer itself exited, as a writer on another host would look from here) holds the lock,
    cleanup, garbage collection and partition removal leave its temp file alone; once killed,
    the file is stale and removed."""
    store = MatrixStore(tmp_path)
    proc = start_script(LIVE_WRITER, str(tmp_path), how)
    holder: int | None = None
    try:
        temp = Path(proc.stdout.readline().strip())
        assert temp.exists(), proc.stderr.read()
        if how == "fork":
            assert proc.wait(30) == 0  # the writer's own pid is gone...
            holders = [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and _holds_file(int(p.name), temp)
            ]
            assert len(holders) == 1 and holders[0] != proc.pid  # ...its lock is not
            holder = holders[0]
        os.utime(temp, (0, 0))
        assert store.files.cleanup_stale_temps() == []
        assert store.collector.collect_garbage().temps_removed == []
        with pytest.raises(PartitionBusyError):
            store.collector.remove_partition(P)
        assert temp.exists()
    finally:
        sigkill(proc)
        if holder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder, signal.SIGKILL)
            for _ in range(200):
                if not _holds_file(holder, temp):
                    break
                time.sleep(0.05)
    assert store.files.cleanup_stale_temps() == [temp]
    assert not temp.exists()


def _holds_file(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


INTERRUPTED_WRITER = """
import os, signal, sys, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
store = MatrixStore(sys.argv[1])
held = store.allocate("a", "2024-03-28", "held", (4096,), np.float64)   # no with-block
with store.allocate("a", "2024-03-28", "y", (4096,), np.float64) as pending:
    pending.array[:10] = 1.0
    print(pending.temp_path, held.temp_path, flush=True)
    os.kill(os.getpid(), signal.SIGINT)           # Ctrl-C: KeyboardInterrupt right here
"""


def test_keyboard_interrupt_removes_temp_files(tmp_path):
    """Ctrl-C while writing: the with-block's temp file is removed at once, the one of a
    PendingArray held without a with-block when the interpreter exits."""
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_WRITER, str(tmp_path)], capture_output=True, text=True
    )
    # Python ends an unhandled KeyboardInterrupt by dying of SIGINT, like any Ctrl-C'd program
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in proc.stderr, proc.stderr
    temps = [Path(p) for p in proc.stdout.split()]
    assert len(temps) == 2 and all(t.parent == tmp_path / "a" / P for t in temps)
    assert not any(t.exists() for t in temps)
    assert temp_files(tmp_path / "a" / P) == []


# ---- disk full: a real, small file system --------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MiB tmpfs mounted at ``tmp_path / "fs"`` (unmounted afterwards). Mounting needs
    root (CAP_SYS_ADMIN); elsewhere the test is skipped, saying why."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); run the suite as root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {proc.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(path: Path, leave: int) -> None:
    """Write zeros into ``path`` until at most ``leave`` bytes are free on its file system."""
    with open(path, "wb") as f:
        chunk = b"\0" * (1 << 20)
        while True:
            free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(4096, min(len(chunk), free - leave))])
                f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break


def test_disk_full_gives_clean_error_and_consistent_store(small_fs):
    """ENOSPC from a real full file system, on every write path: the reservation of a large
    array, the copy path of save(), the sidecar of an array that fits, the manifest. Each time:
    MatrixStoreSpaceError naming the path, no temp file left, the previous version current and
    intact; once space is freed, writes work again."""
    base = small_fs / "store"
    store = MatrixStore(base)
    previous = store.save("a", P, "x", np.arange(5.0), labels={"version": "old"})
    directory = base / "a" / P

    def assert_consistent() -> None:
        assert temp_files(directory) == []
        again = store.load("a", P, "x")
        assert again.version == previous.version
        np.testing.assert_array_equal(again.array, np.arange(5.0))

    # 1) the array does not fit: refused by posix_fallocate, before any byte is computed
    with pytest.raises(MatrixStoreSpaceError) as info:
        store.allocate("a", P, "x", (8192, 8192), np.float32)  # 256 MiB on 64 MiB
    err = info.value
    assert err.errno == errno.ENOSPC and "out of disk space" in str(err)
    assert str(err.path).startswith(str(directory / "x.")) and str(err.path).endswith(".npy")
    assert_consistent()
    # 2) the copy path of save()
    with pytest.raises(MatrixStoreSpaceError) as info:
        store.save("a", P, "x", np.ones((3000, 3000)))  # 72 MB
    assert info.value.errno == errno.ENOSPC
    assert_consistent()
    # 3) the array fits, its sidecar does not
    filler = small_fs / "filler"
    _fill(filler, leave=64 * 1024)
    with pytest.raises(MatrixStoreSpaceError) as info:
        store.save("a", P, "x", np.ones(10), labels={"big": "s" * (1 << 20)})
    assert info.value.errno == errno.ENOSPC
    assert_consistent()
    assert [v.version for v in store.files.versions("a", P)] == [previous.version]
    # 4) the version is complete but the manifest naming it cannot be written
    os.unlink(filler)
    pending = store.allocate("a", P, "x", (16,), np.float64)
    pending.array[:] = 7.0
    committed = pending.commit()
    _fill(filler, leave=0)
    with pytest.raises(MatrixStoreSpaceError) as info:
        store.manifests.set_current(committed)
    assert info.value.errno == errno.ENOSPC and "manifest" in str(info.value)
    assert_consistent()
    # space freed: the same write succeeds; nothing of the failed attempts is left over
    os.unlink(filler)
    committed.release_writer_lock()
    store.collector.collect_garbage()
    assert [v.version for v in store.files.versions("a", P)] == [previous.version]
    new = store.save("a", P, "x", np.ones(10))
    assert store.load("a", P, "x").version == new.version
