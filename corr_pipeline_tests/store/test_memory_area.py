"""The store's memory area (corr_pipeline.store.memory): versions that never reach the disk."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from corr_pipeline import settings
from corr_pipeline.store import memory
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore

SHM = Path(settings.DEFAULT_MEMORY_DIR)
needs_shm = pytest.mark.skipif(settings.memory_dir() is None, reason="no tmpfs at /dev/shm")


@pytest.fixture(autouse=True)
def _free_memory_area(tmp_path):
    """Remove what a test leaves in the memory area of its store."""
    yield
    area = memory.store_area((tmp_path / "store").resolve())
    if area is not None:
        shutil.rmtree(area, ignore_errors=True)


def _written_bytes() -> int:
    """Bytes this process has caused to be written to storage (``/proc/self/io``)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("write_bytes"))


def _commit(store: MatrixStore, partition: str, value: float, *, in_memory: bool):
    with store.allocate(
        "correlation_matrix", partition, "corr", (1000, 1000), np.float32, in_memory=in_memory
    ) as pending:
        pending.array[:] = value
        stored = pending.commit()
    store.save_bundle("correlation_matrix", partition, MatrixBundle({"corr": stored}))
    return stored


@needs_shm
def test_a_memory_version_is_read_like_any_other_and_never_written_to_disk(tmp_path):
    store = MatrixStore(tmp_path / "store")
    before = _written_bytes()
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    written = _written_bytes() - before
    assert written < 1_000_000, f"{written} bytes went to disk for a 4 MB in-memory version"
    area = store.memory_partition_dir("correlation_matrix", "2024-03-28")
    assert area is not None and str(area).startswith(str(SHM))
    assert stored.path.parent == area
    assert not list(store.partition_dir("correlation_matrix", "2024-03-28").glob("corr.*"))
    loaded = store.load_bundle("correlation_matrix", "2024-03-28")
    assert loaded.versions == {"corr": stored.version}
    assert float(loaded["corr"][3, 7]) == 0.5
    (info,) = store.versions("correlation_matrix", "2024-03-28")
    assert info.directory == area and info.complete
    on_disk = _commit(store, "2024-03-29", 0.25, in_memory=False)
    assert on_disk.path.parent == store.partition_dir("correlation_matrix", "2024-03-29")


@needs_shm
def test_garbage_collection_and_removal_reach_the_memory_area(tmp_path):
    store = MatrixStore(tmp_path / "store")
    old = _commit(store, "2024-03-28", 0.5, in_memory=True)
    new = _commit(store, "2024-03-28", 0.75, in_memory=True)
    report = store.collect_garbage()
    assert [v.version for v in report.deleted] == [old.version]
    assert not old.path.exists() and new.path.exists()
    removal = store.remove_partition("2024-03-28", reason="retention")
    assert [v.version for v in removal.versions] == [new.version]
    assert not new.path.exists() and not new.path.parent.exists()
    record = store.pruned("2024-03-28")
    assert record is not None
    assert record["versions"]["correlation_matrix"]["corr"] == [new.version]


@needs_shm
def test_a_user_directory_that_is_not_private_is_never_used(tmp_path, monkeypatch):
    """The user's directory sits in world-writable /dev/shm: a symbolic link planted there, or
    a directory others may enter, sends every version to disk and is left as it was."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "shm"
    base.mkdir()
    user_dir = base / f"corr_pipeline-{os.geteuid()}"
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(base))
    user_dir.symlink_to(elsewhere)
    store = MatrixStore(tmp_path / "store")
    assert memory.store_area(store.base_dir, create=True) is None
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    assert stored.path.parent == store.partition_dir("correlation_matrix", "2024-03-28")
    assert list(elsewhere.iterdir()) == []
    user_dir.unlink()
    user_dir.mkdir(mode=0o755)
    user_dir.chmod(0o755)
    assert memory.store_area(store.base_dir, create=True) is None
    user_dir.chmod(0o700)
    assert memory.store_area(store.base_dir, create=True) is not None


def test_off_disables_the_memory_area(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, "off")
    store = MatrixStore(tmp_path / "store")
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    assert stored.path.parent == store.partition_dir("correlation_matrix", "2024-03-28")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_memory_area_sends_the_version_to_disk(tmp_path, monkeypatch):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=1777", "tmpfs", str(small)], check=True
    )
    try:
        monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(small))
        store = MatrixStore(tmp_path / "store")
        stored = _commit(store, "2024-03-28", 0.5, in_memory=True)  # 4 MB > 2 MB
        assert stored.path.parent == store.partition_dir("correlation_matrix", "2024-03-28")
        assert float(store.load("correlation_matrix", "2024-03-28", "corr").array[1, 1]) == 0.5
    finally:
        subprocess.run(["umount", str(small)], check=True)


@needs_shm
def test_the_memory_area_leaves_a_quarter_of_the_memory_available(tmp_path):
    """Its pages cannot be evicted: a version that would leave the machine less than a quarter
    of its memory available goes to disk."""
    store = MatrixStore(tmp_path / "store")
    area = store.memory_partition_dir("correlation_matrix", "2024-03-28", create=True)
    assert area is not None
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.AVAILABLE_SHARE == 4
    assert not memory.has_room(area, total - total // 4 + 1)


@needs_shm
def test_the_memory_area_holds_at_most_half_of_the_memory(tmp_path):
    store = MatrixStore(tmp_path / "store")
    area = store.memory_partition_dir("correlation_matrix", "2024-03-28", create=True)
    assert area is not None
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.AREA_SHARE == 2
    assert memory.has_room(area, 1 << 20)
    assert not memory.has_room(area, total // 2 + 1)
