"""Writing versions (:class:`VersionWriter`): allocate an array in place and commit it
(:class:`PendingArray`), a scratch array, a copy of an in-memory array, a hard link of a committed
one. The protocol is in :mod:`corr_pipeline.store.matrix_store`."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store import locks, memory
from corr_pipeline.store.arrays import StoredArray
from corr_pipeline.store.checksum import full_checksum, sampled_fingerprint
from corr_pipeline.store.durable import (
    advise_huge_pages,
    create_temp,
    dtype_descr,
    fsync_dir,
    jsonable,
    space_or_io_error,
    temp_path,
    unlink_quiet,
    write_json_atomic,
)
from corr_pipeline.store.errors import MatrixStoreError
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import (
    FORMAT_VERSION,
    new_version,
    now_iso,
    validate_name,
)
from corr_pipeline.store.manifests import Manifests
from corr_pipeline.store.reading import VersionReader


def version_meta(
    asset: str,
    partition: str,
    name: str,
    version: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    labels: dict[str, Any],
    params: dict[str, Any],
    size: int,
    fingerprint: str,
    checksum: str,
) -> dict[str, Any]:
    """The sidecar of a version (SPEC §8): its key, shape, dtype, labels, params, when and by
    whom it was written, and the size, sampled fingerprint and full checksum of its file."""
    return {
        "format": FORMAT_VERSION,
        "version": version,
        "asset": asset,
        "partition": partition,
        "name": name,
        "shape": [int(s) for s in shape],
        "dtype": dtype_descr(np.dtype(dtype)),
        "labels": labels,
        "params": params,
        "created_at": now_iso(),
        "writer": {"host": socket.gethostname(), "pid": os.getpid()},
        "array_file": {"size": int(size), "fingerprint": fingerprint, "checksum": checksum},
    }


def discard_temp(path: Path, lock: locks.FileLock, pid: int) -> None:
    """Finalizer of a :class:`PendingArray` left neither committed nor aborted (in the process
    that created it: a forked child exiting normally must not delete its parent's temp file)."""
    if os.getpid() == pid:
        unlink_quiet(path)
        lock.release()


class PendingArray:
    """A writable array being produced inside the store; see :meth:`VersionWriter.allocate`.

    Fill ``pending.array`` (a writable ``np.memmap`` on the temp file), then call
    :meth:`commit` (a new immutable version, returns a :class:`StoredArray`) or :meth:`abort`
    (delete). As a context manager it aborts when the block raises (``KeyboardInterrupt``
    included), and also aborts when the block ends without ``commit()``/``abort()`` (then raising
    :class:`MatrixStoreError`, because a silently dropped result is a bug). Dropped without
    either, its temp file is deleted when it is garbage collected or the interpreter exits. Do
    not write to ``pending.array`` (or any view of it) after ``commit()``.
    """

    def __init__(
        self,
        reader: VersionReader,
        asset: str,
        partition: str,
        name: str,
        version: str,
        final_path: Path,
        temp_path: Path,
        lock: locks.FileLock,
        array: np.ndarray,
        labels: dict[str, Any],
        params: dict[str, Any],
    ) -> None:
        self.reader = reader
        self.shape: tuple[int, ...] = tuple(array.shape)
        self.dtype: np.dtype = array.dtype
        self.asset = asset
        self.partition = partition
        self.name = name
        self.version = version
        self.path = final_path
        self.temp_path = temp_path
        self.labels = labels
        self.params = params
        self._lock = lock
        self._array: np.ndarray | None = array
        self._state = "open"
        self._stored: StoredArray | None = None
        self._finalizer = weakref.finalize(self, discard_temp, temp_path, lock, os.getpid())

    @property
    def array(self) -> np.ndarray:
        """The writable memory map (only while the pending array is open)."""
        if self._array is None:
            raise MatrixStoreError(
                f"pending array {self.path} is {self._state}; it can no longer be written",
                self.path,
            )
        return self._array

    @property
    def state(self) -> str:
        """``"open"``, ``"committed"`` or ``"aborted"``."""
        return self._state

    def _fail(self, *extra: Path) -> None:
        self._state = "aborted"
        self._array = None
        self._finalizer.detach()
        unlink_quiet(self.temp_path)
        for path in extra:
            unlink_quiet(path)
        self._lock.release()

    def commit(self) -> StoredArray:
        """Flush, fsync and publish as a new immutable version (not yet current: see
        :meth:`MatrixStore.save_bundle` / :meth:`Manifests.set_current`)."""
        if self._state != "open":
            raise MatrixStoreError(f"pending array {self.path} is already {self._state}", self.path)
        arr = self._array
        assert arr is not None
        sidecar = self.path.with_suffix(".json")
        wrote_sidecar = False
        try:
            if isinstance(arr, np.memmap):
                arr.flush()
            self._array = None
            del arr
            fd = self._lock.fd
            assert fd is not None
            os.fsync(fd)
            size = os.fstat(fd).st_size
            meta = version_meta(
                self.asset,
                self.partition,
                self.name,
                self.version,
                self.shape,
                self.dtype,
                self.labels,
                self.params,
                size,
                sampled_fingerprint(fd, size),
                full_checksum(fd, size),
            )
            write_json_atomic(sidecar, meta, sync_dir=False)
            wrote_sidecar = True
            os.replace(self.temp_path, self.path)
            self._lock.path = self.path
            fsync_dir(self.path.parent)
            stored = self.reader.open_version(
                self.asset, self.partition, self.name, self.version, mmap=True
            )
        except OSError as exc:
            self._fail(*([sidecar, self.path] if wrote_sidecar else []))
            raise space_or_io_error("committing", self.path, exc) from exc
        except BaseException:
            self._fail(*([sidecar, self.path] if wrote_sidecar else []))
            raise
        self._finalizer.detach()
        self._stored = StoredArray(**{**stored.__dict__, "writer_lock": self._lock})
        self._state = "committed"
        return self._stored

    def abort(self) -> None:
        """Discard the temp file; the versions already committed stay as they are."""
        if self._state == "committed":
            raise MatrixStoreError(f"pending array {self.path} is already committed", self.path)
        if self._state == "open":
            self._fail()

    def __enter__(self) -> PendingArray:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._state == "open":
            self.abort()
            if exc_type is None:
                raise MatrixStoreError(
                    f"pending array {self.path} left its with-block without commit() or "
                    "abort(); it was discarded",
                    self.path,
                )

    def __repr__(self) -> str:
        return f"PendingArray({self.path}, shape={self.shape}, dtype={self.dtype}, {self._state})"


class VersionWriter:
    """Writes new versions into the directories of ``files``; :meth:`save` and :meth:`link` make
    them current through ``manifests``, and a committed version is read back through
    ``reader``."""

    def __init__(self, files: StoreFiles, manifests: Manifests, reader: VersionReader) -> None:
        self.files = files
        self.manifests = manifests
        self.reader = reader

    def allocate(
        self,
        asset: str,
        partition: str,
        name: str,
        shape: int | Sequence[int],
        dtype: Any,
        *,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        fortran_order: bool = False,
        in_memory: bool = False,
    ) -> PendingArray:
        """Create a writable, zero-filled array that :meth:`PendingArray.commit` turns into a new
        version of ``<asset>/<partition>/<name>``.

        The disk space is reserved up front (``posix_fallocate``); if it is not available,
        raises :class:`MatrixStoreSpaceError` naming the path, with nothing left behind.
        ``labels``/``params`` go to the sidecar at commit (they are validated as JSON now).
        ``in_memory``: the version lives in the store's memory area
        (:mod:`corr_pipeline.store.memory`) when there is one with room for it
        (:func:`~corr_pipeline.store.memory.has_room`), else on disk;
        it is found, loaded, collected and removed like any other.
        """
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise TypeError(f"{asset}/{partition}/{name}: object dtypes cannot be stored")
        shp = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shp):
            raise ValueError(f"{asset}/{partition}/{name}: negative dimension in shape {shp}")
        self.files.partition_dir(asset, partition)
        validate_name(name)
        labels_j = jsonable(dict(labels or {}), f"{name}.labels")
        params_j = jsonable(dict(params or {}), f"{name}.params")
        version = new_version()
        directory = self.files.partition_dir(asset, partition)
        with contextlib.suppress(OSError):  # best effort: free what a crashed attempt left
            self.files.cleanup_stale_temps(asset=asset, partition=partition)
        target = directory
        if in_memory:
            area = self.files.memory_partition_dir(asset, partition, create=True)
            if area is not None and memory.has_room(area, math.prod(shp) * dt.itemsize):
                target = area
        held = self.files.share(directory)
        final = target / f"{name}.{version}.npy"
        try:
            temp, lock = create_temp(final)
        except OSError as exc:
            held.release()
            raise space_or_io_error("allocating", final, exc) from exc
        except BaseException:
            held.release()
            raise
        try:
            # the file exists (0600, locked); open_memmap writes the header into it in place
            mm = np.lib.format.open_memmap(
                temp, mode="w+", dtype=dt, shape=shp, fortran_order=fortran_order
            )
            assert lock.fd is not None
            size = os.fstat(lock.fd).st_size
            if hasattr(os, "posix_fallocate") and size > 0:
                try:
                    os.posix_fallocate(lock.fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
        except OSError as exc:
            unlink_quiet(temp)
            lock.release()
            if target != directory and exc.errno == errno.ENOSPC:  # memory filled meanwhile
                held.release()
                return self.allocate(
                    asset,
                    partition,
                    name,
                    shp,
                    dt,
                    labels=labels,
                    params=params,
                    fortran_order=fortran_order,
                )
            raise space_or_io_error("allocating", final, exc) from exc
        except BaseException:
            unlink_quiet(temp)
            lock.release()
            raise
        finally:
            held.release()
        return PendingArray(
            self.reader, asset, partition, name, version, final, temp, lock, mm, labels_j, params_j
        )

    @contextlib.contextmanager
    def scratch(
        self,
        asset: str,
        partition: str,
        name: str,
        shape: int | Sequence[int],
        dtype: Any,
        *,
        in_memory: bool = False,
    ) -> Iterator[np.ndarray]:
        """A writable, zero-filled, file-backed working array for the ``with`` block, never a
        version: :meth:`allocate`'s locked temp file in ``<asset>/<partition>/`` (disk space
        reserved up front), deleted when the block ends, normally or by an exception
        (``KeyboardInterrupt`` included). A process killed inside the block leaves a temp file
        whose lock died with it, which the next :meth:`allocate` on the partition or garbage
        collection removes (:meth:`StoreFiles.cleanup_stale_temps`). ``in_memory``: in the store's memory
        area when it has room (:meth:`allocate`), where no page is ever written back to a disk.

        On disk its pages live in the page cache (the process's ``RssFile``, not ``RssAnon``), so the
        kernel can write them back and reclaim them under memory pressure. The map is advised
        ``MADV_HUGEPAGE``: where the file system caches large folios (ext4 and XFS on recent
        Linux) it is then mapped with 2 MiB pages like a large heap array, which random access
        needs (fewer TLB misses, and one write fault per 2 MiB instead of per 4 KiB each time
        the kernel has written the dirty pages back). Drop every reference
        to the array (and its views) by the end of the block: the file is unlinked then, and its
        pages are freed once the last map of it is gone.
        """
        pending = self.allocate(asset, partition, name, shape, dtype, in_memory=in_memory)
        try:
            advise_huge_pages(pending.array)
            yield pending.array
        finally:
            pending.abort()

    def save_version(
        self,
        asset: str,
        partition: str,
        name: str,
        array: Any,
        labels: Mapping[str, Any] | None,
        params: Mapping[str, Any] | None,
        *,
        in_memory: bool = False,
    ) -> StoredArray:
        """Copy an in-memory array into a new version of ``<asset>/<partition>/<name>``, not
        yet current (its writer lock kept until a manifest names it)."""
        arr = np.asarray(array)
        with self.allocate(
            asset,
            partition,
            name,
            arr.shape,
            arr.dtype,
            labels=labels,
            params=params,
            fortran_order=bool(arr.flags.f_contiguous and not arr.flags.c_contiguous),
            in_memory=in_memory,
        ) as pending:
            if arr.size:
                pending.array[...] = arr
            return pending.commit()

    def save(
        self,
        asset: str,
        partition: str,
        name: str,
        array: Any,
        *,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> StoredArray:
        """Copy an in-memory array into the store as a new version and make it the current one
        (:meth:`Manifests.set_current`)."""
        stored = self.save_version(asset, partition, name, array, labels, params)
        self.manifests.set_current(stored)
        return stored

    def link(
        self,
        source: StoredArray,
        asset: str,
        partition: str,
        name: str,
        *,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> StoredArray:
        """Make a committed array a new, current version at another location without copying
        (hard link; a copy when hard links are impossible or the source file is gone)."""
        stored = self.link_version(source, asset, partition, name, labels=labels, params=params)
        self.manifests.set_current(stored)
        return stored

    def link_version(
        self,
        source: StoredArray,
        asset: str,
        partition: str,
        name: str,
        *,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> StoredArray:
        """``source`` hard-linked as a new version of ``<asset>/<partition>/<name>``, not yet
        current (a copy when hard links are impossible or the source file is gone)."""
        self.files.partition_dir(asset, partition)
        validate_name(name)
        labels_j = jsonable(dict(source.labels if labels is None else labels), "labels")
        params_j = jsonable(dict(source.params if params is None else params), "params")
        version = new_version()
        directory = self.files.partition_dir(asset, partition)
        held = self.files.share(directory)
        final = directory / f"{name}.{version}.npy"
        sidecar = final.with_suffix(".json")
        temp = temp_path(final)
        try:
            os.link(source.path, temp)
            fd = os.open(temp, os.O_RDWR | os.O_CLOEXEC)
            lock = locks.FileLock(fd, temp)
            try:
                locks.lock_fd(fd, exclusive=False, blocking=True)
                if os.stat(temp).st_ino != os.fstat(fd).st_ino:
                    raise FileNotFoundError(errno.ENOENT, "removed while being locked", str(temp))
            except BaseException:
                lock.release()
                raise
        except OSError as exc:
            unlink_quiet(temp)
            held.release()
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT):
                return self.save_version(asset, partition, name, source.array, labels_j, params_j)
            raise space_or_io_error("linking", final, exc) from exc
        try:
            size = os.fstat(fd).st_size
            fingerprint = sampled_fingerprint(fd, size)
            recorded = source.meta.get("array_file", {})
            if recorded.get("fingerprint") != fingerprint:
                raise OSError(errno.ENOENT, "the source file changed", str(source.path))
            # the same inode: its full checksum is the source's (computed when that has none)
            checksum = recorded.get("checksum") or full_checksum(fd, size)
            meta = version_meta(
                asset, partition, name, version, source.shape, source.dtype, labels_j, params_j,
                size, fingerprint, checksum,
            )  # fmt: skip
            write_json_atomic(sidecar, meta, sync_dir=False)
            os.replace(temp, final)
            lock.path = final
            fsync_dir(directory)
            stored = self.reader.open_version(asset, partition, name, version, mmap=True)
        except OSError as exc:
            unlink_quiet(temp)
            unlink_quiet(final)
            unlink_quiet(sidecar)
            lock.release()
            if exc.errno == errno.ENOENT:
                return self.save_version(asset, partition, name, source.array, labels_j, params_j)
            raise space_or_io_error("linking", final, exc) from exc
        except BaseException:
            unlink_quiet(temp)
            unlink_quiet(final)
            unlink_quiet(sidecar)
            lock.release()
            raise
        finally:
            held.release()
        return StoredArray(**{**stored.__dict__, "writer_lock": lock})
