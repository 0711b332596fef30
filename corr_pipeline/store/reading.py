"""Reading a version (:class:`VersionReader`): the current one of a name or a pinned one, its
files checked against each other before the array is mapped (the checks are listed in
:mod:`corr_pipeline.store.matrix_store`)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store.arrays import StoredArray
from corr_pipeline.store.checksum import sampled_fingerprint
from corr_pipeline.store.durable import (
    MANIFEST_ATTEMPTS,
    MANIFEST_SLEEP_S,
    descr_to_dtype,
    read_json_file,
)
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    MatrixNotFoundError,
    VersionNotFoundError,
)
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import MANIFEST_FILE, validate_name, validate_version
from corr_pipeline.store.manifests import Manifests


class VersionReader:
    """Opens versions of arrays found through ``files``, the current one as ``manifests``
    names it."""

    def __init__(self, files: StoreFiles, manifests: Manifests) -> None:
        self.files = files
        self.manifests = manifests

    def load(
        self,
        asset: str,
        partition: str,
        name: str,
        *,
        version: str | None = None,
        mmap: bool = True,
    ) -> StoredArray:
        """Load a version of an array: the current one (``version=None``, what the manifest
        names) or exactly ``version`` (a pinned one). A read-only ``np.memmap`` (``mmap=True``)
        or an in-memory copy.

        Raises :class:`MatrixNotFoundError` when no version is current,
        :class:`VersionNotFoundError` when the requested version is not on disk and
        :class:`CorruptMatrixError` (naming the file) when files are unreadable, truncated or
        disagree with their sidecar.
        """
        directory = self.files.partition_dir(asset, partition)
        validate_name(name)
        if version is not None:
            return self.open_version(asset, partition, name, validate_version(version), mmap=mmap)
        seen: str | None = None
        for attempt in range(MANIFEST_ATTEMPTS):
            if attempt:
                time.sleep(MANIFEST_SLEEP_S)
            manifest = self.manifests.read(directory)
            entry = (manifest or {}).get("arrays", {}).get(name)
            if entry is None:
                raise MatrixNotFoundError(
                    f"no array {asset}/{partition}/{name}.npy in the store ({directory / MANIFEST_FILE} "
                    "names no version of it)",
                    directory / f"{name}.npy",
                )
            current = str(entry.get("version"))
            if current == seen:
                break  # the manifest still names a version that is not on disk
            try:
                return self.open_version(asset, partition, name, current, mmap=mmap)
            except VersionNotFoundError:
                seen = current  # replaced and collected meanwhile? read the manifest again
        raise CorruptMatrixError(
            f"the current manifest of {asset}/{partition} names version {seen} of {name!r}, "
            "which is not on disk (deleted outside the store's protocol)",
            directory / MANIFEST_FILE,
        )

    def open_version(
        self, asset: str, partition: str, name: str, version: str, *, mmap: bool
    ) -> StoredArray:
        """The version ``version`` of ``<asset>/<partition>/<name>``, checked against its sidecar
        (:meth:`load`'s checks), memory-mapped read-only with ``mmap``."""
        npy = self.files.array_path(asset, partition, name, version)
        side = npy.with_suffix(".json")
        meta = read_json_file(side, "sidecar")
        try:
            f = open(npy, "rb")
        except FileNotFoundError:
            f = None
        if meta is None or f is None:
            if f is not None:
                f.close()
            missing = side if meta is None else npy
            raise VersionNotFoundError(
                f"version {version} of {asset}/{partition}/{name} is not in the matrix store "
                f"({missing} does not exist)",
                npy,
                asset,
                partition,
                name,
                version,
            )
        with f:
            if meta.get("version") != version or meta.get("name") != name:
                raise CorruptMatrixError(
                    f"sidecar {side} belongs to {meta.get('name')!r} version "
                    f"{meta.get('version')}, not to the file it sits next to",
                    side,
                )
            return self._check_and_map(asset, partition, name, npy, f, meta, mmap)

    def _check_and_map(
        self,
        asset: str,
        partition: str,
        name: str,
        npy: Path,
        f: Any,
        meta: dict[str, Any],
        mmap: bool,
    ) -> StoredArray:
        try:
            fmt = np.lib.format.read_magic(f)
            if fmt == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif fmt == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {fmt}")
        except (ValueError, OSError, SyntaxError) as exc:
            raise CorruptMatrixError(
                f"array {npy} has an unreadable .npy header: {exc}", npy
            ) from exc
        try:
            want_shape = tuple(int(s) for s in meta["shape"])
            want_dtype = descr_to_dtype(meta["dtype"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMatrixError(
                f"sidecar of {npy} lacks a valid shape/dtype: {exc}", npy.with_suffix(".json")
            ) from exc
        if tuple(shape) != want_shape or np.dtype(dtype) != want_dtype:
            raise CorruptMatrixError(
                f"array {npy} header (shape {tuple(shape)}, dtype {dtype}) disagrees with its "
                f"sidecar (shape {want_shape}, dtype {want_dtype})",
                npy,
            )
        if dtype.hasobject:
            raise CorruptMatrixError(f"array {npy} has an object dtype (refused)", npy)
        offset = f.tell()
        nbytes = math.prod(shape) * dtype.itemsize
        size = os.fstat(f.fileno()).st_size
        if size != offset + nbytes:
            raise CorruptMatrixError(
                f"array {npy} is {size} bytes, expected {offset + nbytes} "
                f"(header {offset} + data {nbytes}): truncated or corrupt",
                npy,
            )
        recorded = meta.get("array_file")
        if (
            not isinstance(recorded, dict)
            or recorded.get("size") != size
            or recorded.get("fingerprint") != sampled_fingerprint(f.fileno(), size)
        ):
            raise CorruptMatrixError(
                f"array {npy} does not match its sidecar {npy.with_suffix('.json')} (size or "
                "sampled content fingerprint differs: the data of another version, or damaged)",
                npy,
            )
        order = "F" if fortran else "C"
        if mmap:
            array: np.ndarray = np.memmap(  # type: ignore[call-overload]
                f, dtype=dtype, mode="r", shape=tuple(shape), offset=offset, order=order
            )
        else:
            count = math.prod(shape)
            f.seek(offset)
            flat = np.fromfile(f, dtype=dtype, count=count)
            if flat.size != count:
                raise CorruptMatrixError(f"array {npy}: short read", npy)
            array = flat.reshape(shape, order=order)  # type: ignore[call-overload]
        return StoredArray(
            asset=asset,
            partition=partition,
            name=name,
            path=npy,
            array=array,
            labels=dict(meta.get("labels") or {}),
            params=dict(meta.get("params") or {}),
            meta=meta,
        )
