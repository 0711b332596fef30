"""Bundles (:class:`Bundles`): saving the arrays of a partition with the manifest that makes
them current in one step, and loading the current bundle. The protocol is in
:mod:`corr_pipeline.store.matrix_store`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from corr_pipeline.store.arrays import (
    BundleWriteReport,
    MatrixBundle,
    StoredArray,
)
from corr_pipeline.store.durable import (
    MANIFEST_ATTEMPTS,
    MANIFEST_SLEEP_S,
    check_inputs,
    jsonable,
)
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    MatrixNotFoundError,
    MatrixStoreError,
    VersionNotFoundError,
)
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import MANIFEST_FILE, validate_name
from corr_pipeline.store.manifests import Manifests
from corr_pipeline.store.reading import VersionReader
from corr_pipeline.store.writing import PendingArray, VersionWriter


class Bundles:
    """Saves and loads whole bundles: the arrays through ``writer`` (or reused as they are) and
    ``reader``, the current pointer through ``manifests``, found through ``files``."""

    def __init__(
        self, files: StoreFiles, manifests: Manifests, reader: VersionReader, writer: VersionWriter
    ) -> None:
        self.files = files
        self.manifests = manifests
        self.reader = reader
        self.writer = writer

    def save_bundle(
        self, asset: str, partition: str, bundle: MatrixBundle, *, in_memory: bool = False
    ) -> BundleWriteReport:
        """Store every array of ``bundle`` under ``<asset>/<partition>`` and commit its manifest.

        Per array ``name``:

        * a :class:`StoredArray` that is a version of ``<asset>/<partition>/<name>`` still on
          disk (what :meth:`PendingArray.commit` returned, or any older version) is **reused as
          is** — no byte is copied (the zero-copy hand-off);
        * another :class:`StoredArray` is hard-linked as a new version (zero copy);
        * anything else is converted with ``np.asarray`` and copied into a new version, with the
          bundle's labels/params in its sidecar.

        ``in_memory``: the copies go to the store's memory area when it has room
        (:meth:`VersionWriter.allocate`). Then ``bundle.manifest.json`` (names, versions, shapes, dtypes,
        labels, params, inputs) replaces the previous one atomically — the commit point of the
        bundle; when every version it names lives in the memory area, which a reboot empties,
        it is written without waiting for the disk. Names of the
        previous manifest missing from the bundle are dropped (``removed``); their versions,
        like the superseded ones, are left to garbage collection
        (:meth:`GarbageCollector.collect_garbage`).
        """
        for name in bundle.arrays:  # every key is checked before anything touches the disk
            validate_name(name)
        directory = self.files.partition_dir(asset, partition)
        inputs = check_inputs(bundle.inputs, "bundle.inputs")
        labels = jsonable(dict(bundle.labels), "bundle.labels")
        params = jsonable(dict(bundle.params), "bundle.params")
        held = self.files.share(directory)
        try:
            stored: dict[str, StoredArray] = {}
            how: dict[str, list[str]] = {"reused": [], "linked": [], "copied": []}
            copied_bytes = 0
            for name, value in bundle.arrays.items():
                stored[name], kind = self._store_array(
                    asset, partition, name, value, bundle, in_memory=in_memory
                )
                how[kind].append(name)
                if kind == "copied":
                    copied_bytes += int(stored[name].array.nbytes)

            def update(previous: dict[str, Any] | None) -> dict[str, Any]:
                manifest = self.manifests.new(asset, partition)
                manifest.update(
                    labels=labels,
                    params=params,
                    inputs=inputs,
                    arrays={name: self.manifests.entry(s) for name, s in stored.items()},
                )
                return manifest

            # versions that all live in the memory area do not survive a reboot: neither need
            # the manifest naming them
            in_area = all(not s.path.is_relative_to(self.files.base_dir) for s in stored.values())
            previous, manifest = self.manifests.commit(
                asset, partition, directory, update, durable=not (stored and in_area)
            )
        finally:
            held.release()
        for s in stored.values():
            s.release_writer_lock()
        before = (previous or {}).get("arrays", {})
        out = MatrixBundle(
            arrays=dict(stored),
            labels=manifest["labels"],
            params=manifest["params"],
            inputs=manifest["inputs"],
            asset=asset,
            partition=partition,
        )
        return BundleWriteReport(
            bundle=out,
            directory=directory,
            reused=how["reused"],
            linked=how["linked"],
            copied=how["copied"],
            removed=sorted(n for n in before if n not in stored),
            nbytes=int(sum(s.array.nbytes for s in stored.values())),
            copied_bytes=copied_bytes,
            superseded={
                n: str(e.get("version"))
                for n, e in before.items()
                if n in stored and e.get("version") != stored[n].version
            },
        )

    def _store_array(
        self,
        asset: str,
        partition: str,
        name: str,
        value: Any,
        bundle: MatrixBundle,
        *,
        in_memory: bool,
    ) -> tuple[StoredArray, str]:
        """One array of :meth:`save_bundle`'s bundle as a version of ``<asset>/<partition>/<name>``
        and how: ``reused`` (already that version), ``linked`` (another version, hard-linked)
        or ``copied`` (an in-memory array)."""
        if isinstance(value, PendingArray):
            raise MatrixStoreError(
                f"bundle array {name!r} is a PendingArray in state {value.state}: "
                "call commit() and put the returned StoredArray in the bundle",
                value.path,
            )
        if isinstance(value, StoredArray):
            if value.location == (asset, partition, name) and self.files.has_version(
                asset, partition, name, value.version
            ):
                return value, "reused"
            linked = self.writer.link_version(
                value, asset, partition, name, labels=value.labels, params=value.params
            )
            return linked, "linked"
        saved = self.writer.save_version(
            asset,
            partition,
            name,
            np.asarray(value),
            bundle.labels,
            bundle.params,
            in_memory=in_memory,
        )
        return saved, "copied"

    def has_bundle(self, asset: str, partition: str) -> bool:
        """True when ``<asset>/<partition>`` has a manifest."""
        return (self.files.partition_dir(asset, partition) / MANIFEST_FILE).is_file()

    def load_bundle(self, asset: str, partition: str, *, mmap: bool = True) -> MatrixBundle:
        """Load the current bundle (arrays as :class:`StoredArray`, ``bundle.versions`` = the
        versions read). A manifest replaced while it is being read is read again; a manifest
        naming a version that is not on disk raises :class:`CorruptMatrixError`."""
        directory = self.files.partition_dir(asset, partition)
        path = directory / MANIFEST_FILE
        problem = ""
        previous_manifest: dict[str, Any] | None = None
        for attempt in range(MANIFEST_ATTEMPTS):
            if attempt:
                time.sleep(MANIFEST_SLEEP_S)
            manifest = self.manifests.read(directory)
            if manifest is None:
                raise MatrixNotFoundError(
                    f"no bundle for {asset}/{partition}: {path} does not exist "
                    "(was the asset materialized through the matrix-store IO manager?)",
                    path,
                )
            if previous_manifest is not None and manifest == previous_manifest:
                break  # unchanged and still naming a missing version: not a race
            arrays: dict[str, np.ndarray | StoredArray] = {}
            for name, entry in manifest["arrays"].items():
                try:
                    arrays[name] = self.reader.open_version(
                        asset, partition, name, str(entry.get("version")), mmap=mmap
                    )
                except VersionNotFoundError:
                    problem = (
                        f"array {name!r}: version {entry.get('version')} that {path} expects "
                        "is not on disk"
                    )
                    break
            else:
                return MatrixBundle(
                    arrays=arrays,
                    labels=dict(manifest.get("labels") or {}),
                    params=dict(manifest.get("params") or {}),
                    inputs={k: dict(v) for k, v in (manifest.get("inputs") or {}).items()},
                    asset=asset,
                    partition=partition,
                )
            previous_manifest = manifest
        raise CorruptMatrixError(f"bundle {asset}/{partition} is inconsistent: {problem}", path)
