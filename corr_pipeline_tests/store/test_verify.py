"""The full checksum written at commit, and ``corr-pipeline store verify``.

A value changed between the load's sampled blocks loads silently (the sampled fingerprint
cannot see it); ``store verify`` reads every byte and names the file.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from corr_pipeline import cli, settings
from corr_pipeline.store import checksum
from corr_pipeline.store.checksum import SAMPLE_BYTES, SEGMENT_BYTES, full_checksum, sample_offsets
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline.store.verify import verify_store

P = "2026-11-27"


def _sha256_tree(data: bytes, segment: int = SEGMENT_BYTES) -> str:
    """The documented formula, computed on the bytes in memory."""
    top = hashlib.sha256(len(data).to_bytes(8, "little"))
    for start in range(0, len(data), segment):
        top.update(hashlib.sha256(data[start : start + segment]).digest())
    return "sha256-tree:" + top.hexdigest()


def _between_samples(size: int) -> int:
    """A byte offset no sampled block covers."""
    offsets = sample_offsets(size)
    return (offsets[8] + SAMPLE_BYTES + offsets[9]) // 2


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.ENV_STORE_DIR, str(tmp_path / "store"))
    return MatrixStore(tmp_path / "store")


def _corr(n: int = 1024) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((n, n)).astype(np.float32)


def test_every_way_of_writing_records_the_whole_file_sha256(store):
    saved = store.save("snapshot_corr", P, "corr", _corr())
    with store.allocate("snapshot_corr", P, "overlap", (512, 512), np.uint16) as pending:
        pending.array[:] = 3
        committed = pending.commit()
    linked = store.writer.link(saved, "snapshot_clusters", P, "corr")
    for stored in (saved, committed, linked):
        assert stored.meta["array_file"]["checksum"] == _sha256_tree(stored.path.read_bytes())
    assert [c.status for c in verify_store(store)] == ["ok"] * 3


def test_a_value_changed_between_the_samples_is_found_by_verify_only(store, capsys):
    saved = store.save("snapshot_corr", P, "corr", _corr())
    other = store.save("snapshot_corr", "2026-11-26", "corr", _corr())
    size = saved.path.stat().st_size
    offset = _between_samples(size)
    with open(saved.path, "r+b") as f:  # one float32 in the middle of corr
        f.seek(offset - offset % 4)
        value = np.frombuffer(f.read(4), np.float32)[0]
        f.seek(offset - offset % 4)
        f.write(np.float32(value + 0.5).tobytes())
    loaded = store.load("snapshot_corr", P, "corr")  # the sampled check does not see it
    assert loaded.array.shape == (1024, 1024)
    del loaded

    assert cli.main(["store", "verify"]) == 1
    out, err = capsys.readouterr()
    assert "1 damaged" in out and "damaged" in out
    assert f"{saved.path}: damaged" in err
    assert str(other.path) not in err
    assert cli.main(["store", "verify", "--partition", "2026-11-26"]) == 0
    capsys.readouterr()
    assert cli.main(["store", "verify", "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    statuses = {v["partition"]: v["status"] for v in payload["versions"]}
    assert statuses == {P: "damaged", "2026-11-26": "ok"}


def test_a_version_without_a_full_checksum_is_said_to_be_sampled(store, capsys):
    saved = store.save("snapshot_corr", P, "corr", _corr(256))
    sidecar = saved.path.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    del meta["array_file"]["checksum"]  # as written before full checksums were recorded
    sidecar.write_text(json.dumps(meta))
    (check,) = verify_store(store)
    assert check.status == "sampled" and not check.failed
    assert cli.main(["store", "verify"]) == 0
    assert "1 without one (sampled fingerprint only" in capsys.readouterr().out


def test_a_truncated_version_is_reported_corrupt(store, capsys):
    saved = store.save("snapshot_corr", P, "corr", _corr(256))
    os.truncate(saved.path, saved.path.stat().st_size - 4)
    (check,) = verify_store(store)
    assert check.status == "corrupt" and "truncated" in check.detail
    assert cli.main(["store", "verify"]) == 1
    assert "corrupt" in capsys.readouterr().err


@pytest.mark.parametrize("size", [0, 1, 1000, 4096, 4097, 10_000])
@pytest.mark.parametrize("workers", [1, 3])
def test_the_full_checksum_is_the_documented_tree(tmp_path, monkeypatch, size, workers):
    """Small segments so that a file spans several (and the threads share them out)."""
    monkeypatch.setattr(checksum, "SEGMENT_BYTES", 4096)
    monkeypatch.setattr(checksum, "_CHUNK_BYTES", 1000)
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f"
    path.write_bytes(data + b"tail not counted")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert full_checksum(fd, size, workers=workers) == _sha256_tree(data, 4096)
    finally:
        os.close(fd)
