"""The store's memory area (corr_pipeline.store.memory): versions that never reach the disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
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
    area = store.files.memory_partition_dir("correlation_matrix", "2024-03-28")
    assert area is not None and str(area).startswith(str(SHM))
    assert stored.path.parent == area
    assert not list(store.files.partition_dir("correlation_matrix", "2024-03-28").glob("corr.*"))
    loaded = store.load_bundle("correlation_matrix", "2024-03-28")
    assert loaded.versions == {"corr": stored.version}
    assert float(loaded["corr"][3, 7]) == 0.5
    (info,) = store.files.versions("correlation_matrix", "2024-03-28")
    assert info.directory == area and info.complete
    on_disk = _commit(store, "2024-03-29", 0.25, in_memory=False)
    assert on_disk.path.parent == store.files.partition_dir("correlation_matrix", "2024-03-29")


@needs_shm
def test_garbage_collection_and_removal_reach_the_memory_area(tmp_path):
    store = MatrixStore(tmp_path / "store")
    old = _commit(store, "2024-03-28", 0.5, in_memory=True)
    new = _commit(store, "2024-03-28", 0.75, in_memory=True)
    report = store.collector.collect_garbage()
    assert [v.version for v in report.deleted] == [old.version]
    assert not old.path.exists() and new.path.exists()
    removal = store.collector.remove_partition("2024-03-28", reason="retention")
    assert [v.version for v in removal.versions] == [new.version]
    assert not new.path.exists() and not new.path.parent.exists()
    record = store.pruned("2024-03-28")
    assert record is not None
    assert record["versions"]["correlation_matrix"]["corr"] == [new.version]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants as the user nobody")
NOBODY = 65534


@pytest.fixture
def shared_dir():
    """A stand-in for ``/dev/shm`` on the same memory file system: a directory of mode ``mode``
    (default: every user may write it, sticky, like ``/dev/shm``); removed afterwards."""
    made = []

    def make(mode: int = 0o1777) -> Path:
        base = Path(tempfile.mkdtemp(prefix="corr_pipeline_shm_", dir=settings.memory_dir()))
        base.chmod(mode)
        made.append(base)
        return base

    yield make
    for base in made:
        shutil.rmtree(base, ignore_errors=True)


@needs_shm
@pytest.mark.parametrize("planted", ["link", pytest.param("foreign", marks=needs_root)])
def test_a_directory_planted_at_the_old_predictable_name_diverts_nothing(
    tmp_path, monkeypatch, shared_dir, planted
):
    """Another user (or a link) at ``<memory dir>/corr_pipeline-<uid>``, the name the area once
    had, neither sends the versions to disk nor receives them: the area has a random name."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = shared_dir()
    old_name = base / f"corr_pipeline-{os.geteuid()}"
    if planted == "link":
        old_name.symlink_to(elsewhere)
    else:
        old_name.mkdir()
        old_name.chmod(0o777)
        os.chown(old_name, NOBODY, NOBODY)
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(base))
    store = MatrixStore(tmp_path / "store")
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    area = memory.store_area(store.base_dir)
    assert area is not None and area.parent == base and area != old_name
    assert area.name.startswith(f"corr_pipeline-{os.geteuid()}-") and len(area.name) > 20
    assert stored.path.parent == area / "correlation_matrix" / "2024-03-28"
    assert (area.stat().st_mode & 0o777, area.stat().st_uid) == (0o700, os.geteuid())
    assert list(elsewhere.iterdir()) == [] and list(old_name.iterdir()) == []
    # another store of the same user gets an area of its own, under another random name
    other = memory.store_area(MatrixStore(tmp_path / "other").base_dir, create=True)
    assert other is not None and other != area and other.parent == base


@needs_shm
@pytest.mark.parametrize("tampered", ["link", "open"])
def test_a_recorded_area_that_is_not_private_is_replaced_with_a_warning(
    tmp_path, monkeypatch, shared_dir, caplog, tampered
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(shared_dir()))
    store = MatrixStore(tmp_path / "store")
    area = memory.store_area(store.base_dir, create=True)
    assert area is not None
    if tampered == "link":
        area.rmdir()
        area.symlink_to(elsewhere)
    else:
        area.chmod(0o755)
    assert memory.store_area(store.base_dir) is None  # readers never use it
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    new = memory.store_area(store.base_dir)
    assert new is not None and new != area and stored.path.parent.parent.parent == new
    assert list(elsewhere.iterdir()) == []
    why = "is not a directory" if tampered == "link" else "is open to others (mode 0755)"
    assert f"the store's memory area {area} {why}: not used" in caplog.text


@pytest.mark.parametrize(
    ("mode", "owner", "cause"),
    [
        (0o777, None, "may be written by others and has no sticky bit (mode 0777)"),
        pytest.param(0o755, NOBODY, f"belongs to uid {NOBODY} (mode 0755)", marks=needs_root),
    ],
)
@needs_shm
def test_a_memory_dir_others_control_is_refused_with_the_cause(
    tmp_path, monkeypatch, shared_dir, caplog, mode, owner, cause
):
    """In a memory dir others could rename the area in (or own), nothing goes to memory, and
    the warning says why."""
    base = shared_dir(mode)
    if owner is not None:
        os.chown(base, owner, owner)
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(base))
    store = MatrixStore(tmp_path / "store")
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    assert stored.path.parent == store.files.partition_dir("correlation_matrix", "2024-03-28")
    assert os.listdir(base) == []
    assert f"no memory area: {base} {cause}: every matrix goes to disk" in caplog.text


def test_off_disables_the_memory_area(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.ENV_MEMORY_DIR, "off")
    store = MatrixStore(tmp_path / "store")
    stored = _commit(store, "2024-03-28", 0.5, in_memory=True)
    assert stored.path.parent == store.files.partition_dir("correlation_matrix", "2024-03-28")


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
        assert stored.path.parent == store.files.partition_dir("correlation_matrix", "2024-03-28")
        assert float(store.load("correlation_matrix", "2024-03-28", "corr").array[1, 1]) == 0.5
    finally:
        subprocess.run(["umount", str(small)], check=True)


@needs_shm
def test_the_memory_area_leaves_a_quarter_of_the_memory_available(tmp_path):
    """Its pages cannot be evicted: a version that would leave the machine less than a quarter
    of its memory available goes to disk."""
    store = MatrixStore(tmp_path / "store")
    area = store.files.memory_partition_dir("correlation_matrix", "2024-03-28", create=True)
    assert area is not None
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.AVAILABLE_SHARE == 4
    assert not memory.has_room(area, total - total // 4 + 1)


@needs_shm
def test_the_memory_area_holds_at_most_half_of_the_memory(tmp_path):
    store = MatrixStore(tmp_path / "store")
    area = store.files.memory_partition_dir("correlation_matrix", "2024-03-28", create=True)
    assert area is not None
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.AREA_SHARE == 2
    assert memory.has_room(area, 1 << 20)
    assert not memory.has_room(area, total // 2 + 1)
