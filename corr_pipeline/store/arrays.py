"""The store's value types: a committed version (:class:`StoredArray`), a bundle of them
(:class:`MatrixBundle`), a version being written (:class:`PendingArray`) and the reports of
writes, garbage collection and removals."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store import locks
from corr_pipeline.store.errors import (
    MatrixStoreError,
)


@dataclass(frozen=True, eq=False)
class StoredArray:
    """One committed, immutable version of an array, as loaded from the store.

    ``array`` is a read-only ``np.memmap`` (or, for ``load(..., mmap=False)``, an in-memory
    copy). ``labels``/``params`` come from the sidecar; ``meta`` is the whole sidecar
    (``version`` id, ``shape``, ``dtype``, ``created_at``, ``writer``, ...). Passing a
    ``StoredArray`` inside a :class:`MatrixBundle` is the zero-copy hand-off to the IO manager.
    A ``StoredArray`` fresh from :meth:`PendingArray.commit` holds its writer's lock on the
    version file until a manifest names it (:meth:`release_writer_lock`).
    """

    asset: str
    partition: str
    name: str
    path: Path
    array: np.ndarray
    labels: dict[str, Any]
    params: dict[str, Any]
    meta: dict[str, Any]
    writer_lock: locks.FileLock | None = field(default=None, repr=False)

    @property
    def version(self) -> str:
        """Id of this committed version (a new one on every commit)."""
        return str(self.meta["version"])

    @property
    def location(self) -> tuple[str, str, str]:
        return (self.asset, self.partition, self.name)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def release_writer_lock(self) -> None:
        """Stop protecting this version as "being written" (a manifest names it now)."""
        if self.writer_lock is not None:
            self.writer_lock.release()

    def __repr__(self) -> str:
        return (
            f"StoredArray({self.asset}/{self.partition}/{self.name}, shape={self.shape}, "
            f"dtype={self.dtype}, version={self.meta.get('version')}, "
            f"labels={sorted(self.labels)})"
        )


@dataclass(eq=False)
class MatrixBundle:
    """What one asset hands to the next: named arrays plus shared labels and params.

    ``arrays`` maps an array name (``^[A-Za-z0-9_]+$``) to either a plain ``np.ndarray``
    (the store copies it) or a :class:`StoredArray` (already committed; no copy — see
    :meth:`MatrixStore.save_bundle`). ``labels`` (e.g. ``{"symbols": [...], "dates": [...]}``)
    and ``params`` are JSON-able dicts shared by all arrays of the bundle. ``inputs`` records the
    versions of other assets (of the same partition) the bundle was computed from,
    ``{asset: {array name: version}}`` (see :meth:`source`); the store keeps those versions as
    long as this bundle is current.

    ``bundle["corr"]`` returns the ``np.ndarray`` (the memmap for stored arrays);
    ``bundle.stored("corr")`` the :class:`StoredArray` (``None`` for plain arrays);
    ``bundle.versions`` the version of each stored array. A bundle loaded from the store also
    carries its ``asset`` and ``partition``.
    """

    arrays: dict[str, np.ndarray | StoredArray]
    labels: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    asset: str | None = None
    partition: str | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        value = self.arrays[name]
        return value.array if isinstance(value, StoredArray) else value

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    @property
    def names(self) -> list[str]:
        return list(self.arrays)

    def stored(self, name: str) -> StoredArray | None:
        value = self.arrays[name]
        return value if isinstance(value, StoredArray) else None

    @property
    def versions(self) -> dict[str, str]:
        """``{array name: version}`` of the stored arrays (what a reader of this bundle read)."""
        return {n: v.version for n, v in self.arrays.items() if isinstance(v, StoredArray)}

    def source(self) -> dict[str, dict[str, str]]:
        """``{asset: versions}``: this bundle as the ``inputs`` of a bundle computed from it."""
        assets = {v.asset for v in self.arrays.values() if isinstance(v, StoredArray)}
        asset = self.asset or (assets.pop() if len(assets) == 1 else None)
        if asset is None:
            raise MatrixStoreError("source(): the bundle was not loaded from the store")
        return {asset: self.versions}

    def __repr__(self) -> str:
        arrays = ", ".join(
            f"{n}: {'stored ' if isinstance(v, StoredArray) else ''}"
            f"{getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', ()))}"
            for n, v in self.arrays.items()
        )
        return f"MatrixBundle({{{arrays}}}, labels={sorted(self.labels)}, params={self.params})"


def sources(*bundles: MatrixBundle) -> dict[str, dict[str, str]]:
    """The ``inputs`` of a bundle computed from ``bundles`` (each loaded from the store)."""
    out: dict[str, dict[str, str]] = {}
    for bundle in bundles:
        out.update(bundle.source())
    return out


@dataclass(frozen=True)
class BundleWriteReport:
    """Result of :meth:`MatrixStore.save_bundle`: the stored bundle and how each array got there.

    ``reused``: committed in place by the producer (zero copy); ``linked``: hard-linked from
    another committed file (zero copy); ``copied``: written from an in-memory array;
    ``removed``: names of the previous manifest the new one no longer has (their versions are
    left to garbage collection); ``superseded``: versions the new manifest replaced.
    """

    bundle: MatrixBundle
    directory: Path
    reused: list[str]
    linked: list[str]
    copied: list[str]
    removed: list[str]
    nbytes: int
    copied_bytes: int
    superseded: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VersionInfo:
    """One version: its files' total ``bytes``, whether both files exist, the ``directory``
    holding them (the partition directory, or its memory area: :mod:`corr_pipeline.store.memory`)."""

    asset: str
    partition: str
    name: str
    version: str
    bytes: int
    complete: bool
    directory: Path | None = None


@dataclass
class GarbageReport:
    """What :meth:`~corr_pipeline.store.collection.GarbageCollector.collect_garbage` deleted
    (or, with ``dry_run``, would delete)."""

    deleted: list[VersionInfo] = field(default_factory=list)
    kept_busy: list[VersionInfo] = field(default_factory=list)
    temps_removed: list[Path] = field(default_factory=list)
    busy_partitions: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    legacy_removed: list[Path] = field(default_factory=list)
    dry_run: bool = False

    @property
    def freed_bytes(self) -> int:
        return sum(v.bytes for v in self.deleted)

    def merge(self, other: GarbageReport) -> None:
        self.deleted += other.deleted
        self.kept_busy += other.kept_busy
        self.temps_removed += other.temps_removed
        self.busy_partitions += other.busy_partitions
        self.unreadable += other.unreadable
        self.legacy_removed += other.legacy_removed


@dataclass
class RemovalReport:
    """What :meth:`~corr_pipeline.store.collection.GarbageCollector.remove_partition` removed
    (or, with ``dry_run``, would remove)."""

    partition: str
    assets: list[str]
    versions: list[VersionInfo]
    bytes: int
    dry_run: bool = False
