"""The core of :class:`~corr_pipeline.store.matrix_store.MatrixStore`: paths, partition locks,
reading manifests and versions, listing, and the removal of stale temp files."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store import locks, memory
from corr_pipeline.store.arrays import (
    StoredArray,
    VersionInfo,
)
from corr_pipeline.store.checksum import sampled_fingerprint
from corr_pipeline.store.durable import (
    FILE_MODE,
    descr_to_dtype,
    dtype_descr,
    make_dir,
    make_dirs,
    read_json_file,
    space_or_io_error,
    unlink_quiet,
    write_json_atomic,
)
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    InvalidStoreKeyError,
    MatrixStoreError,
    VersionNotFoundError,
)
from corr_pipeline.store.layout import (
    ASSET_RE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MANIFEST_LOCK,
    PARTITION_LOCK,
    PARTITION_RE,
    TEMP_RE,
    VERSION_FILE_RE,
    now_iso,
    validate_asset_name,
    validate_name,
    validate_partition,
    validate_version,
)


class StoreCore:
    """Paths, locks, manifests and versions read, listing, stale temp files. See :class:`~corr_pipeline.store.matrix_store.MatrixStore`."""

    def __init__(self, base_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        base = Path(base_dir).expanduser()
        if create:
            make_dirs(base.absolute())
        elif not base.is_dir():
            raise MatrixStoreError(f"matrix store directory {base} does not exist", base)
        self.base_dir = base.resolve()

    def __repr__(self) -> str:
        return f"MatrixStore({str(self.base_dir)!r})"

    def partition_dir(self, asset: str, partition: str) -> Path:
        """``<base>/<asset>/<partition>`` after validating both keys (not created)."""
        validate_asset_name(asset)
        validate_partition(partition)
        path = self.base_dir / asset / partition
        # defence in depth: the regexes already forbid separators and '..'
        if os.path.commonpath([self.base_dir, path.resolve()]) != str(self.base_dir):
            raise InvalidStoreKeyError(f"{asset}/{partition} resolves outside {self.base_dir}")
        return path

    def memory_partition_dir(
        self, asset: str, partition: str, *, create: bool = False
    ) -> Path | None:
        """``<memory area>/<asset>/<partition>`` (:mod:`corr_pipeline.store.memory`), None
        without a usable memory area; ``create``: make it."""
        area = memory.store_area(self.base_dir, create=create)
        if area is None:
            return None
        path = area / validate_asset_name(asset) / validate_partition(partition)
        if create:
            make_dir(path.parent)
            make_dir(path)
        return path

    def _version_dirs(self, asset: str, partition: str) -> list[Path]:
        """The directories holding versions of ``<asset>/<partition>``: the partition directory,
        then its memory area when it exists."""
        directories = [self.partition_dir(asset, partition)]
        in_memory = self.memory_partition_dir(asset, partition)
        if in_memory is not None and in_memory.is_dir():
            directories.append(in_memory)
        return directories

    def array_path(self, asset: str, partition: str, name: str, version: str) -> Path:
        """``<base>/<asset>/<partition>/<name>.<version>.npy``, or the same file in the memory
        area when the version lives there."""
        file = f"{validate_name(name)}.{validate_version(version)}.npy"
        on_disk = self.partition_dir(asset, partition) / file
        if not on_disk.exists():
            in_memory = self.memory_partition_dir(asset, partition)
            if in_memory is not None and (in_memory / file).exists():
                return in_memory / file
        return on_disk

    def sidecar_path(self, asset: str, partition: str, name: str, version: str) -> Path:
        return self.array_path(asset, partition, name, version).with_suffix(".json")

    def manifest_path(self, asset: str, partition: str) -> Path:
        return self.partition_dir(asset, partition) / MANIFEST_FILE

    def _ensure_dir(self, asset: str, partition: str) -> Path:
        directory = self.partition_dir(asset, partition)
        if not directory.is_dir():
            make_dir(self.base_dir / asset)
            make_dir(directory)
        return directory

    def _hold(
        self,
        directory: Path,
        *,
        exclusive: bool,
        blocking: bool,
        create: bool,
        allow_upgrade: bool = False,
    ) -> locks.Hold | None:
        """A share of ``directory``'s partition lock (see :mod:`corr_pipeline.store.locks`);
        None if busy (``blocking=False``) or if the directory does not exist and ``create`` is
        False."""
        for _ in range(20):
            if create and not directory.is_dir():
                make_dir(directory.parent)
                make_dir(directory)
            try:
                return locks.hold(
                    directory / PARTITION_LOCK,
                    exclusive=exclusive,
                    blocking=blocking,
                    allow_upgrade=allow_upgrade,
                )
            except FileNotFoundError:
                if not create:
                    return None
        raise MatrixStoreError(f"could not lock {directory}: it keeps disappearing", directory)

    @contextlib.contextmanager
    def _manifest_lock(self, directory: Path) -> Iterator[None]:
        fd = os.open(directory / MANIFEST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            with contextlib.suppress(OSError):
                os.fchmod(fd, FILE_MODE)
            locks.lock_fd(fd, exclusive=True, blocking=True)
            yield
        finally:
            os.close(fd)

    def hold_partition(self, asset: str, partition: str) -> locks.Hold:
        """A shared hold on ``<asset>/<partition>`` (created if missing) for as long as the caller
        uses it: retention and garbage collection leave the partition alone meanwhile. Call
        ``.release()`` when done (the Dagster resources hold it for a step)."""
        directory = self.partition_dir(asset, partition)
        held = self._hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        return held

    def hold_existing_partition(self, asset: str, partition: str) -> locks.Hold | None:
        """Like :meth:`hold_partition`, but None (nothing created) when ``<asset>/<partition>``
        does not exist, e.g. after retention removed it."""
        return self._hold(
            self.partition_dir(asset, partition), exclusive=False, blocking=True, create=False
        )

    def _read_manifest(self, directory: Path) -> dict[str, Any] | None:
        manifest = read_json_file(directory / MANIFEST_FILE, "bundle manifest")
        if manifest is not None and not isinstance(manifest.get("arrays"), dict):
            raise CorruptMatrixError(
                f"bundle manifest {directory / MANIFEST_FILE} lacks 'arrays'",
                directory / MANIFEST_FILE,
            )
        return manifest

    def manifest(self, asset: str, partition: str) -> dict[str, Any] | None:
        """The current manifest of ``<asset>/<partition>`` (None if there is none)."""
        return self._read_manifest(self.partition_dir(asset, partition))

    def _has_version(self, asset: str, partition: str, name: str, version: str) -> bool:
        return any(
            (directory / f"{name}.{version}.npy").is_file()
            and (directory / f"{name}.{version}.json").is_file()
            for directory in self._version_dirs(asset, partition)
        )

    def _commit_manifest(
        self,
        asset: str,
        partition: str,
        directory: Path,
        update: Any,
        *,
        durable: bool = True,
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Read-modify-write of the manifest under the manifest lock (and a shared partition
        hold): ``update(previous manifest or None) -> new manifest``; every version the new one
        names must exist; ``durable``: written through to the disk (:func:`write_json_atomic`).
        Returns (previous, new)."""
        held = self._hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        try:
            with self._manifest_lock(directory):
                try:
                    previous = self._read_manifest(directory)
                except CorruptMatrixError:
                    previous = None  # unreadable or of an older format: replaced whole
                manifest = update(previous)
                for name, entry in manifest["arrays"].items():
                    if not self._has_version(asset, partition, name, entry["version"]):
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
    def _entry(stored: StoredArray) -> dict[str, Any]:
        return {
            "version": stored.version,
            "shape": list(stored.shape),
            "dtype": dtype_descr(stored.dtype),
            "nbytes": int(stored.array.nbytes),
        }

    def _new_manifest(self, asset: str, partition: str) -> dict[str, Any]:
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

    def names(self, asset: str, partition: str) -> list[str]:
        """Array names of the current manifest (sorted)."""
        directory = self.partition_dir(asset, partition)
        if not directory.is_dir():
            return []
        manifest = self._read_manifest(directory)
        return sorted((manifest or {}).get("arrays", {}))

    def assets(self) -> list[str]:
        """Asset directories of the store (sorted)."""
        return sorted(
            p.name for p in self.base_dir.iterdir() if p.is_dir() and ASSET_RE.fullmatch(p.name)
        )

    def partitions(self, asset: str) -> list[str]:
        """Partition keys present for an asset (sorted)."""
        directory = self.base_dir / validate_asset_name(asset)
        if not directory.is_dir():
            return []
        return sorted(
            p.name
            for p in directory.iterdir()
            if p.is_dir() and PARTITION_RE.fullmatch(p.name) and ".." not in p.name
        )

    def partition_keys(self) -> list[str]:
        """Every partition key present under any asset (sorted)."""
        return sorted({p for asset in self.assets() for p in self.partitions(asset)})

    def versions(self, asset: str, partition: str) -> list[VersionInfo]:
        """The versions in ``<asset>/<partition>`` and its memory area (oldest first), current
        or not."""
        found: dict[tuple[str, str], list[Path]] = {}
        for directory in self._version_dirs(asset, partition):
            try:
                entries = list(directory.iterdir())
            except FileNotFoundError:
                continue
            for p in entries:
                m = VERSION_FILE_RE.fullmatch(p.name)
                if m:
                    found.setdefault((m["name"], m["version"]), []).append(p)
        out = []
        for (name, version), paths in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            size = 0
            for p in paths:
                with contextlib.suppress(FileNotFoundError):
                    size += p.stat().st_size
            out.append(
                VersionInfo(asset, partition, name, version, size, len(paths) == 2, paths[0].parent)
            )
        return out

    def disk_usage(self, partition: str) -> dict[str, int]:
        """Bytes on disk per asset of ``partition`` (every file of its directories)."""
        validate_partition(partition)
        usage: dict[str, int] = {}
        for asset in self.assets():
            directory = self.base_dir / asset / partition
            if not directory.is_dir():
                continue
            total = 0
            for p in directory.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    total += p.stat().st_size
            usage[asset] = total
        return usage

    def open_version(
        self, asset: str, partition: str, name: str, version: str, *, mmap: bool
    ) -> StoredArray:
        """The version ``version`` of ``<asset>/<partition>/<name>``, checked against its sidecar
        (:meth:`MatrixStore.load`'s checks), memory-mapped read-only with ``mmap``."""
        npy = self.array_path(asset, partition, name, version)
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

    def cleanup_stale_temps(
        self, *, asset: str | None = None, partition: str | None = None
    ) -> list[Path]:
        """Delete temp files whose writer is gone; returns the paths removed.

        Scans the whole store, or only ``asset`` (and ``partition``) when given.
        :meth:`allocate` runs it on its own partition directory, so a re-materialization after
        a crash removes the crashed attempt's leftovers. A temp file is stale when no open file
        description holds a lock on it: its writer (on this host or another one sharing the
        store) released it or died. A live writer's temp file is never removed, however old.
        """
        if partition is not None and asset is None:
            raise ValueError("cleanup_stale_temps: partition given without asset")
        removed: list[Path] = []
        for part_dir in self._partition_dirs(asset, partition):
            removed += self._cleanup_dir(part_dir)
        return removed

    def _partition_dirs(self, asset: str | None, partition: str | None) -> list[Path]:
        if asset is None:
            asset_dirs = [self.base_dir / a for a in self.assets()]
        else:
            asset_dirs = [self.base_dir / validate_asset_name(asset)]
        out: list[Path] = []
        for asset_dir in asset_dirs:
            if not asset_dir.is_dir():
                continue
            keys = self.partitions(asset_dir.name) if partition is None else [partition]
            for key in keys:
                out += self._version_dirs(asset_dir.name, key)
        return [p for p in out if p.is_dir()]

    def _cleanup_dir(self, part_dir: Path, *, dry_run: bool = False) -> list[Path]:
        removed: list[Path] = []
        try:
            entries = sorted(part_dir.iterdir())
        except FileNotFoundError:
            return removed
        for p in entries:
            if not TEMP_RE.fullmatch(p.name):
                continue
            try:
                fd = os.open(p, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                # the probe lock is held while unlinking: a writer that locks its new temp file
                # just after our probe finds the name gone and takes another one
                if locks.lock_fd(fd, exclusive=True, blocking=False):
                    if dry_run or unlink_quiet(p):
                        removed.append(p)
            finally:
                os.close(fd)
        return removed
