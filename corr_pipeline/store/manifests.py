"""The current pointer of each partition (:class:`Manifests`): ``bundle.manifest.json`` read,
replaced atomically under its lock, and the questions it answers (which version of a name is
current). The protocol is in :mod:`corr_pipeline.store.matrix_store`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from corr_pipeline.store import locks
from corr_pipeline.store.arrays import StoredArray
from corr_pipeline.store.durable import (
    FILE_MODE,
    dtype_descr,
    read_json_file,
    space_or_io_error,
    write_json_atomic,
)
from corr_pipeline.store.errors import CorruptMatrixError
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MANIFEST_LOCK,
    now_iso,
    validate_name,
)

ManifestUpdate = Callable[[dict[str, Any] | None], dict[str, Any]]
"""``update(previous manifest or None) -> new manifest``, run by :meth:`Manifests.commit`."""


class Manifests:
    """Reads and replaces the manifests of the store's partitions (found through ``files``)."""

    def __init__(self, files: StoreFiles) -> None:
        self.files = files

    def read(self, directory: Path) -> dict[str, Any] | None:
        """The manifest of the partition directory ``directory`` (None if there is none);
        :class:`CorruptMatrixError` when it is unreadable or lacks its arrays."""
        manifest = read_json_file(directory / MANIFEST_FILE, "bundle manifest")
        if manifest is not None and not isinstance(manifest.get("arrays"), dict):
            raise CorruptMatrixError(
                f"bundle manifest {directory / MANIFEST_FILE} lacks 'arrays'",
                directory / MANIFEST_FILE,
            )
        return manifest

    def current(self, asset: str, partition: str) -> dict[str, Any] | None:
        """The current manifest of ``<asset>/<partition>`` (None if there is none)."""
        return self.read(self.files.partition_dir(asset, partition))

    def names(self, asset: str, partition: str) -> list[str]:
        """Array names of the current manifest (sorted)."""
        directory = self.files.partition_dir(asset, partition)
        if not directory.is_dir():
            return []
        manifest = self.read(directory)
        return sorted((manifest or {}).get("arrays", {}))

    def current_version(self, asset: str, partition: str, name: str) -> str | None:
        """Version the current manifest names for the array (``None`` if none)."""
        manifest = self.current(asset, partition)
        entry = (manifest or {}).get("arrays", {}).get(validate_name(name))
        return None if entry is None else str(entry.get("version"))

    def exists(self, asset: str, partition: str, name: str) -> bool:
        """True when the current manifest names a version of the array."""
        try:
            return self.current_version(asset, partition, name) is not None
        except CorruptMatrixError:
            return False

    @contextlib.contextmanager
    def _lock(self, directory: Path) -> Iterator[None]:
        fd = os.open(directory / MANIFEST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            with contextlib.suppress(OSError):
                os.fchmod(fd, FILE_MODE)
            locks.lock_fd(fd, exclusive=True, blocking=True)
            yield
        finally:
            os.close(fd)

    def commit(
        self,
        asset: str,
        partition: str,
        directory: Path,
        update: ManifestUpdate,
        *,
        durable: bool = True,
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Read-modify-write of the manifest under the manifest lock (and a shared partition
        hold): ``update(previous manifest or None) -> new manifest``; every version the new one
        names must exist; ``durable``: written through to the disk (:func:`write_json_atomic`).
        Returns (previous, new)."""
        held = self.files.share(directory)
        try:
            with self._lock(directory):
                try:
                    previous = self.read(directory)
                except CorruptMatrixError:
                    previous = None  # unreadable or of an older format: replaced whole
                manifest = update(previous)
                for name, entry in manifest["arrays"].items():
                    if not self.files.has_version(asset, partition, name, entry["version"]):
                        raise CorruptMatrixError(
                            f"version {entry['version']} of {asset}/{partition}/{name} vanished "
                            "before the manifest naming it was written",
                            directory,
                        )
                final = directory / MANIFEST_FILE
                try:
                    write_json_atomic(final, manifest, durable=durable)
                except OSError as exc:
                    raise space_or_io_error("writing the bundle manifest", final, exc) from exc
        finally:
            held.release()
        return previous, manifest

    @staticmethod
    def entry(stored: StoredArray) -> dict[str, Any]:
        """The manifest entry naming ``stored`` (version, shape, dtype, bytes)."""
        return {
            "version": stored.version,
            "shape": list(stored.shape),
            "dtype": dtype_descr(stored.dtype),
            "nbytes": int(stored.array.nbytes),
        }

    @staticmethod
    def new(asset: str, partition: str) -> dict[str, Any]:
        """An empty manifest of ``<asset>/<partition>``, created now."""
        return {
            "format": FORMAT_VERSION,
            "asset": asset,
            "partition": partition,
            "created_at": now_iso(),
            "labels": {},
            "params": {},
            "inputs": {},
            "arrays": {},
        }

    def set_current(self, stored: StoredArray) -> None:
        """Make ``stored`` (a version of its own location) the current version of its name; the
        other entries of the manifest stay as they are."""
        asset, partition, name = stored.location
        directory = self.files.partition_dir(asset, partition)

        def update(previous: dict[str, Any] | None) -> dict[str, Any]:
            manifest = previous or self.new(asset, partition)
            manifest["arrays"][name] = self.entry(stored)
            manifest["created_at"] = now_iso()
            return manifest

        self.commit(asset, partition, directory, update)
        stored.release_writer_lock()

    def delete(self, asset: str, partition: str, name: str) -> bool:
        """Drop ``name`` from the current manifest (True if it was there). Its versions stay on
        disk until garbage collection finds nothing needs them (a published snapshot may pin
        one)."""
        validate_name(name)
        directory = self.files.partition_dir(asset, partition)
        if not (directory / MANIFEST_FILE).is_file():
            return False
        found = []

        def update(previous: dict[str, Any] | None) -> dict[str, Any]:
            manifest = previous or self.new(asset, partition)
            found.append(manifest["arrays"].pop(name, None) is not None)
            return manifest

        self.commit(asset, partition, directory, update)
        return bool(found and found[0])
