"""``corr-pipeline store verify``: every stored version's bytes against its full checksum.

A load checks the header, the size and a sampled fingerprint
(:func:`corr_pipeline.store.checksum.sampled_fingerprint`); this reads every byte of every
version and compares the SHA-256 recorded in its sidecar at commit
(:func:`corr_pipeline.store.checksum.full_checksum`), so a value changed anywhere (a bad disk
block, a stray write into a file) is found.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from corr_pipeline.store.checksum import full_checksum
from corr_pipeline.store.matrix_store import (
    CorruptMatrixError,
    MatrixStore,
    VersionInfo,
    VersionNotFoundError,
)

__all__ = ["VersionCheck", "verify_store"]


@dataclass(frozen=True)
class VersionCheck:
    """The verdict on one stored version: ``status`` is ``ok`` (full checksum equal),
    ``sampled`` (no full checksum recorded, as in versions written before they were; its
    sampled fingerprint is equal), ``damaged`` (the full checksum differs) or ``corrupt`` (the
    load's own checks failed: header, size, sampled fingerprint, sidecar); ``detail`` says why."""

    asset: str
    partition: str
    name: str
    version: str
    path: str
    bytes: int
    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("damaged", "corrupt")

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__}


def verify_store(store: MatrixStore, partitions: Iterable[str] | None = None) -> list[VersionCheck]:
    """Check every complete version of every array of ``store`` (only ``partitions`` when
    given), current or not, in the partition directories and the memory area: the load's checks
    (on a read-only map: nothing is read into memory), then the full checksum against the
    sidecar's. A version removed meanwhile (garbage collection) is left out."""
    wanted = set(partitions) if partitions is not None else None
    checks = []
    for asset in store.files.assets():
        for partition in store.files.partitions(asset):
            if wanted is not None and partition not in wanted:
                continue
            for info in store.files.versions(asset, partition):
                if not info.complete:
                    continue
                path = store.files.array_path(asset, partition, info.name, info.version)
                try:  # held open: garbage collection may unlink it, the bytes stay readable
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    status, detail = _check(store, info, fd)
                finally:
                    os.close(fd)
                checks.append(
                    VersionCheck(
                        asset,
                        partition,
                        info.name,
                        info.version,
                        str(path),
                        info.bytes,
                        status,
                        detail,
                    )  # fmt: skip
                )
    return checks


def _check(store: MatrixStore, info: VersionInfo, fd: int) -> tuple[str, str]:
    """``(status, detail)`` of the version ``info``, whose file is open as ``fd``."""
    try:
        stored = store.load(info.asset, info.partition, info.name, version=info.version)
    except VersionNotFoundError:
        return "corrupt", "its sidecar is gone"
    except CorruptMatrixError as exc:
        return "corrupt", str(exc)
    recorded = (stored.meta.get("array_file") or {}).get("checksum")
    del stored
    if recorded is None:
        return "sampled", "no full checksum recorded; sampled fingerprint ok"
    actual = full_checksum(fd, os.fstat(fd).st_size)
    if actual != recorded:
        return "damaged", f"sha256 {actual}, recorded {recorded}"
    return "ok", ""
