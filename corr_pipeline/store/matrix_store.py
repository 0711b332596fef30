"""Matrix store: crash-safe, memory-mapped ``.npy`` arrays with JSON sidecars (SPEC §8).

Layout
------
::

    <base_dir>/<asset>/<partition>/<name>.npy            the array (standard NumPy .npy format)
    <base_dir>/<asset>/<partition>/<name>.json           its sidecar (labels, shape, dtype, params, ...)
    <base_dir>/<asset>/<partition>/bundle.manifest.json  optional: the set of arrays one materialization
                                                         handed over (see :meth:`MatrixStore.save_bundle`)
    <base_dir>/<asset>/<partition>/.<file>.tmp-<pid>-<hex>   in-flight temp files (never read)
    <base_dir>/<asset>/<partition>/.<name>.lock              commit lock (flock), empty

``asset`` and array ``name`` match ``^[A-Za-z0-9_]+$``; ``partition`` matches
``^[A-Za-z0-9_][A-Za-z0-9_.-]*$`` (an ISO date such as ``2024-03-28`` qualifies) and may
not contain ``..``. Every path is checked to lie inside ``base_dir``, so no key can steer a
write or a read outside the store.

Writing (producer side)
-----------------------
Large arrays are written in place, tile by tile, without a second copy in RAM::

    with store.allocate("correlation_matrix", "2024-03-28", "corr", (n, n), np.float32,
                        labels={"symbols": symbols}) as pending:
        pairwise_correlation(R, min_overlap=30, out_corr=pending.array, ...)
        stored = pending.commit()          # -> StoredArray (read-only memmap of the final file)

:meth:`MatrixStore.allocate` creates ``.<name>.npy.tmp-<pid>-<hex>`` in the partition
directory (same filesystem, so the final rename is atomic), writes the ``.npy`` header,
**reserves the disk blocks** with ``posix_fallocate`` (so a full disk is reported *now*, as a
clean :class:`MatrixStoreSpaceError`, instead of a ``SIGBUS`` when a page of the memory map
is first touched), and maps it writable (``np.lib.format.open_memmap``; fresh contents are
zero). :meth:`PendingArray.commit`:

1. ``flush()`` (``msync``) the map and ``fsync`` the temp file;
2. writes the sidecar to its own temp file (``fsync``); the sidecar records the array file's
   identity ``(inode, size, mtime_ns)`` and a fresh ``version`` id;
3. under an exclusive ``flock`` on ``.<name>.lock``: ``os.replace`` the array into
   ``<name>.npy`` (**the commit point**), then ``os.replace`` the sidecar into ``<name>.json``;
4. ``fsync`` the directory.

Any failure before step 3 removes both temp files and leaves the previous version untouched.

Reading (consumer side)
-----------------------
:meth:`MatrixStore.load` reads the sidecar, opens the array, ``fstat``s the *opened* file and
checks its identity against the sidecar; header shape/dtype and the exact file size are
checked too. So a reader never pairs an array with another version's sidecar:

* between the two renames of step 3 (or after a writer died exactly there) the array is new
  and the sidecar old; the loader then uses the writer's already-complete temp sidecar that
  matches the array's identity (and :meth:`MatrixStore.cleanup_stale_temps` rolls it forward
  once the writer is dead);
* any other mismatch (a concurrent re-write) is retried briefly, then reported.

The array comes back as a read-only ``np.memmap`` (``mmap=True``) mapped from the very file
descriptor that was checked. Files are immutable once committed (a re-write replaces the
directory entry, never the bytes), so a map held by a reader stays valid and unchanged even
if a newer version is committed meanwhile.

Crash safety (SPEC §8): a process killed at any point before the commit point leaves the
previous version readable and only a ``.…tmp-<pid>-…`` file behind, which
:meth:`MatrixStore.cleanup_stale_temps` deletes once ``<pid>`` is gone. Nothing partial ever
appears under ``<name>.npy`` or ``<name>.json``.

Labels and params are JSON: numpy arrays become lists, ``datetime.date`` / ``datetime64``
become ISO strings, numpy scalars become Python numbers. They come back in that JSON form
(e.g. dates as ``"2024-03-28"`` strings).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "BundleWriteReport",
    "CorruptMatrixError",
    "InvalidStoreKeyError",
    "MatrixBundle",
    "MatrixNotFoundError",
    "MatrixStore",
    "MatrixStoreError",
    "MatrixStoreSpaceError",
    "PendingArray",
    "StoredArray",
]

FORMAT_VERSION = 1
"""Sidecar / manifest format version written into every JSON file (``"format"``)."""

MANIFEST_FILE = "bundle.manifest.json"

_ASSET_RE = re.compile(r"[A-Za-z0-9_]{1,200}")
_NAME_RE = _ASSET_RE
_PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_TEMP_RE = re.compile(r"\.(?P<target>.+)\.tmp-(?P<pid>\d+)-(?P<uid>[0-9a-f]{32})")

_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_CONSISTENCY_ATTEMPTS = 40
_CONSISTENCY_SLEEP_S = 0.025


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


class MatrixStoreError(Exception):
    """Base class of every matrix-store error; ``.path`` names the file concerned."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)


class InvalidStoreKeyError(MatrixStoreError, ValueError):
    """An asset name, partition key or array name that is not allowed (path safety)."""


class MatrixNotFoundError(MatrixStoreError, FileNotFoundError):
    """The requested array (or bundle manifest) was never committed, or was deleted."""


class CorruptMatrixError(MatrixStoreError):
    """Files exist but are unreadable or disagree with each other (truncated, bad JSON, ...)."""


class MatrixStoreSpaceError(MatrixStoreError, OSError):
    """Out of disk space / quota / file-size limit while writing; the temp file is removed."""

    def __init__(self, message: str, path: str | os.PathLike[str], errno_: int | None):
        MatrixStoreError.__init__(self, message, path)
        self.errno = errno_


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def validate_asset_name(asset: str) -> str:
    """``asset`` if it is a valid asset directory name (``^[A-Za-z0-9_]+$``, 1-200 characters);
    :class:`InvalidStoreKeyError` otherwise."""
    if not isinstance(asset, str) or not _ASSET_RE.fullmatch(asset):
        raise InvalidStoreKeyError(
            f"invalid asset name {asset!r}: must match ^[A-Za-z0-9_]+$ (1-200 chars)"
        )
    return asset


def _validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidStoreKeyError(
            f"invalid array name {name!r}: must match ^[A-Za-z0-9_]+$ (1-200 chars)"
        )
    return name


def _validate_partition(partition: str) -> str:
    if (
        not isinstance(partition, str)
        or not _PARTITION_RE.fullmatch(partition)
        or ".." in partition
    ):
        raise InvalidStoreKeyError(
            f"invalid partition key {partition!r}: must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ "
            "(e.g. an ISO date 2024-03-28), at most 200 chars, without '..'"
        )
    return partition


def _now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def _jsonable(value: Any, where: str) -> Any:
    """Convert labels/params to plain JSON types (see module docstring)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        if isinstance(value, np.datetime64):
            return str(np.datetime_as_string(value))
        return _jsonable(value.item(), where)
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "M":
            return [str(s) for s in np.datetime_as_string(value).ravel().tolist()]
        if value.dtype.kind == "O":
            return [_jsonable(v, where) for v in value.tolist()]
        return _jsonable(value.tolist(), where)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: JSON object keys must be str, got {k!r}")
            out[k] = _jsonable(v, f"{where}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_jsonable(v, f"{where}[]") for v in value]
    raise TypeError(
        f"{where}: value of type {type(value).__name__} is not JSON-serialisable "
        "(use str, numbers, lists, dicts, dates or numpy arrays)"
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quiet(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _space_or_io_error(action: str, path: Path, exc: OSError) -> MatrixStoreError:
    if exc.errno in _SPACE_ERRNOS:
        return MatrixStoreSpaceError(
            f"out of disk space while {action} {path}: {exc.strerror or exc} "
            f"(errno {exc.errno}); the partial file was removed, the previous version is intact",
            path,
            exc.errno,
        )
    return MatrixStoreError(f"I/O error while {action} {path}: {exc}", path)


def _write_json_file(path: Path, obj: Mapping[str, Any]) -> None:
    """Write ``obj`` as JSON to a *new* file ``path`` and fsync it (no rename)."""
    data = json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json_file(path: Path, what: str) -> dict[str, Any] | None:
    """Parse a JSON file; ``None`` if it does not exist; CorruptMatrixError if unreadable."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptMatrixError(f"{what} {path} is not valid JSON: {exc}", path) from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
        raise CorruptMatrixError(
            f"{what} {path} is not a matrix-store v{FORMAT_VERSION} file "
            f"(format={obj.get('format') if isinstance(obj, dict) else None!r})",
            path,
        )
    return obj


def _identity(st: os.stat_result) -> dict[str, int]:
    return {"inode": int(st.st_ino), "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def _dtype_descr(dtype: np.dtype) -> Any:
    return np.lib.format.dtype_to_descr(dtype)


def _descr_to_dtype(descr: Any) -> np.dtype:
    # JSON turns the tuples of a structured descr into lists; descr_to_dtype wants tuples.
    def fix(d: Any) -> Any:
        if isinstance(d, list):
            return [tuple(fix(x) for x in item) if isinstance(item, list) else item for item in d]
        return d

    return np.lib.format.descr_to_dtype(fix(descr))


# --------------------------------------------------------------------------------------
# value types
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StoredArray:
    """A committed array, as loaded from the store.

    ``array`` is a read-only ``np.memmap`` (or, for ``load(..., mmap=False)``, an in-memory
    copy). ``labels``/``params`` come from the sidecar; ``meta`` is the whole sidecar
    (``version`` id, ``shape``, ``dtype``, ``created_at``, ``writer``, ...). Passing a
    ``StoredArray`` inside a :class:`MatrixBundle` is the zero-copy hand-off to the IO manager.
    """

    asset: str
    partition: str
    name: str
    path: Path
    array: np.ndarray
    labels: dict[str, Any]
    params: dict[str, Any]
    meta: dict[str, Any]

    @property
    def version(self) -> str:
        """Random id of this committed version (changes on every commit)."""
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
    and ``params`` are JSON-able dicts shared by all arrays of the bundle.

    ``bundle["corr"]`` returns the ``np.ndarray`` (the memmap for stored arrays);
    ``bundle.stored("corr")`` the :class:`StoredArray` (``None`` for plain arrays).
    """

    arrays: dict[str, np.ndarray | StoredArray]
    labels: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

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

    def __repr__(self) -> str:
        arrays = ", ".join(
            f"{n}: {'stored ' if isinstance(v, StoredArray) else ''}"
            f"{getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', ()))}"
            for n, v in self.arrays.items()
        )
        return f"MatrixBundle({{{arrays}}}, labels={sorted(self.labels)}, params={self.params})"


@dataclass(frozen=True)
class BundleWriteReport:
    """Result of :meth:`MatrixStore.save_bundle`: the stored bundle and how each array got there.

    ``reused``: committed in place by the producer (zero copy); ``linked``: hard-linked from
    another committed file (zero copy); ``copied``: written from an in-memory array.
    """

    bundle: MatrixBundle
    directory: Path
    reused: list[str]
    linked: list[str]
    copied: list[str]
    removed: list[str]
    nbytes: int
    copied_bytes: int


class PendingArray:
    """A writable array being produced inside the store; see :meth:`MatrixStore.allocate`.

    Fill ``pending.array`` (a writable ``np.memmap`` on the temp file), then call
    :meth:`commit` (publish atomically, returns a :class:`StoredArray`) or :meth:`abort`
    (delete). As a context manager it aborts when the block raises, and also aborts when
    the block ends without ``commit()``/``abort()`` (then raising :class:`MatrixStoreError`,
    because a silently dropped result is a bug). Do not write to ``pending.array`` (or any
    view of it) after ``commit()``: the same inode is now the published file.
    """

    def __init__(
        self,
        store: MatrixStore,
        asset: str,
        partition: str,
        name: str,
        final_path: Path,
        temp_path: Path,
        array: np.ndarray,
        labels: dict[str, Any],
        params: dict[str, Any],
    ) -> None:
        self.store = store
        self.shape: tuple[int, ...] = tuple(array.shape)
        self.dtype: np.dtype = array.dtype
        self.asset = asset
        self.partition = partition
        self.name = name
        self.path = final_path
        self.temp_path = temp_path
        self.labels = labels
        self.params = params
        self._array: np.ndarray | None = array
        self._state = "open"
        self._stored: StoredArray | None = None

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

    def commit(self) -> StoredArray:
        """Flush, fsync and atomically publish; returns the committed read-only array."""
        if self._state != "open":
            raise MatrixStoreError(f"pending array {self.path} is already {self._state}", self.path)
        arr = self._array
        assert arr is not None
        side_final = self.path.with_suffix(".json")
        side_temp = _temp_path(side_final)
        try:
            if isinstance(arr, np.memmap):
                arr.flush()
            self._array = None
            del arr
            fd = os.open(self.temp_path, os.O_RDONLY)
            try:
                os.fsync(fd)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            meta = self.store._make_meta(
                self.asset,
                self.partition,
                self.name,
                self.shape,
                self.dtype,
                self.labels,
                self.params,
                st,
            )
            _write_json_file(side_temp, meta)
        except OSError as exc:
            self._state = "aborted"
            self._array = None
            _unlink_quiet(self.temp_path)
            _unlink_quiet(side_temp)
            raise _space_or_io_error("committing", self.path, exc) from exc
        except BaseException:
            self._state = "aborted"
            self._array = None
            _unlink_quiet(self.temp_path)
            _unlink_quiet(side_temp)
            raise
        self._stored = self.store._publish(
            self.asset, self.partition, self.name, self.temp_path, side_temp, meta
        )
        self._state = "committed"
        return self._stored

    def abort(self) -> None:
        """Discard the temp file; the previously committed version (if any) stays."""
        if self._state == "committed":
            raise MatrixStoreError(f"pending array {self.path} is already committed", self.path)
        self._array = None
        self._state = "aborted"
        _unlink_quiet(self.temp_path)

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


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------


class MatrixStore:
    """Directory of committed arrays, one sub-directory per asset and partition (SPEC §8).

    Stateless apart from ``base_dir``: any number of processes may open the same store.
    See the module docstring for the layout and the commit protocol.
    """

    def __init__(self, base_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        base = Path(base_dir).expanduser()
        if create:
            base.mkdir(parents=True, exist_ok=True)
        elif not base.is_dir():
            raise MatrixStoreError(f"matrix store directory {base} does not exist", base)
        self.base_dir = base.resolve()

    def __repr__(self) -> str:
        return f"MatrixStore({str(self.base_dir)!r})"

    # ---- paths -------------------------------------------------------------------------

    def partition_dir(self, asset: str, partition: str) -> Path:
        """``<base>/<asset>/<partition>`` after validating both keys (not created)."""
        validate_asset_name(asset)
        _validate_partition(partition)
        path = self.base_dir / asset / partition
        # defence in depth: the regexes already forbid separators and '..'
        if os.path.commonpath([self.base_dir, path.resolve()]) != str(self.base_dir):
            raise InvalidStoreKeyError(f"{asset}/{partition} resolves outside {self.base_dir}")
        return path

    def array_path(self, asset: str, partition: str, name: str) -> Path:
        """Final path ``<base>/<asset>/<partition>/<name>.npy``."""
        return self.partition_dir(asset, partition) / f"{_validate_name(name)}.npy"

    def sidecar_path(self, asset: str, partition: str, name: str) -> Path:
        return self.partition_dir(asset, partition) / f"{_validate_name(name)}.json"

    def _ensure_dir(self, asset: str, partition: str) -> Path:
        directory = self.partition_dir(asset, partition)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    @contextlib.contextmanager
    def _lock(self, directory: Path, lock_name: str) -> Iterator[None]:
        fd = os.open(directory / f".{lock_name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    # ---- writing -----------------------------------------------------------------------

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
    ) -> PendingArray:
        """Create a writable, zero-filled array destined for ``<asset>/<partition>/<name>.npy``.

        The disk space is reserved up front (``posix_fallocate``); if it is not available,
        raises :class:`MatrixStoreSpaceError` naming the path, with nothing left behind.
        ``labels``/``params`` go to the sidecar at commit (they are validated as JSON now).
        """
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise TypeError(f"{asset}/{partition}/{name}: object dtypes cannot be stored")
        shp = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shp):
            raise ValueError(f"{asset}/{partition}/{name}: negative dimension in shape {shp}")
        _validate_name(name)
        labels_j = _jsonable(dict(labels or {}), f"{name}.labels")
        params_j = _jsonable(dict(params or {}), f"{name}.params")
        directory = self._ensure_dir(asset, partition)
        with contextlib.suppress(OSError):  # best effort: free what a crashed attempt left
            self.cleanup_stale_temps(asset=asset, partition=partition)
        final = directory / f"{name}.npy"
        temp = _temp_path(final)
        try:
            mm = np.lib.format.open_memmap(
                temp, mode="w+", dtype=dt, shape=shp, fortran_order=fortran_order
            )
            fd = os.open(temp, os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                if hasattr(os, "posix_fallocate") and size > 0:
                    try:
                        os.posix_fallocate(fd, 0, size)
                    except OSError as exc:
                        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                            raise
            finally:
                os.close(fd)
        except OSError as exc:
            _unlink_quiet(temp)
            raise _space_or_io_error("allocating", final, exc) from exc
        except BaseException:
            _unlink_quiet(temp)
            raise
        return PendingArray(self, asset, partition, name, final, temp, mm, labels_j, params_j)

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
        """Copy an in-memory array into the store (same atomic path as :meth:`allocate`)."""
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
        ) as pending:
            if arr.size:
                pending.array[...] = arr
            return pending.commit()

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
        """Publish a committed array under another location without copying (hard link).

        Falls back to a copy if hard links are impossible (other filesystem) or if
        ``source.path`` has been re-written since ``source`` was loaded.
        """
        _validate_name(name)
        directory = self._ensure_dir(asset, partition)
        final = directory / f"{name}.npy"
        temp = _temp_path(final)
        side_temp = _temp_path(final.with_suffix(".json"))
        labels_j = _jsonable(dict(source.labels if labels is None else labels), "labels")
        params_j = _jsonable(dict(source.params if params is None else params), "params")
        try:
            os.link(source.path, temp)
            st = os.stat(temp)
            src_ident = source.meta.get("array_file", {})
            if _identity(st) != src_ident:  # source re-written since loaded
                _unlink_quiet(temp)
                return self.save(
                    asset, partition, name, source.array, labels=labels_j, params=params_j
                )
            meta = self._make_meta(
                asset, partition, name, source.shape, source.dtype, labels_j, params_j, st
            )
            _write_json_file(side_temp, meta)
        except OSError as exc:
            _unlink_quiet(temp)
            _unlink_quiet(side_temp)
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT):
                return self.save(
                    asset, partition, name, source.array, labels=labels_j, params=params_j
                )
            raise _space_or_io_error("linking", final, exc) from exc
        return self._publish(asset, partition, name, temp, side_temp, meta)

    def _make_meta(
        self,
        asset: str,
        partition: str,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        labels: dict[str, Any],
        params: dict[str, Any],
        st: os.stat_result,
    ) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "version": uuid.uuid4().hex,
            "asset": asset,
            "partition": partition,
            "name": name,
            "shape": [int(s) for s in shape],
            "dtype": _dtype_descr(np.dtype(dtype)),
            "labels": labels,
            "params": params,
            "created_at": _now_iso(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            "array_file": _identity(st),
        }

    def _publish(
        self,
        asset: str,
        partition: str,
        name: str,
        array_temp: Path,
        sidecar_temp: Path,
        meta: dict[str, Any],
    ) -> StoredArray:
        """Steps 3-4 of the commit protocol; returns the freshly committed array."""
        directory = array_temp.parent
        final = directory / f"{name}.npy"
        try:
            with self._lock(directory, name):
                os.replace(array_temp, final)  # commit point
                os.replace(sidecar_temp, final.with_suffix(".json"))
                # open our own version while still holding the lock
                stored = self._open_verified(asset, partition, name, final, meta, mmap=True)
            _fsync_dir(directory)
        except OSError as exc:
            _unlink_quiet(array_temp)
            _unlink_quiet(sidecar_temp)
            raise _space_or_io_error("publishing", final, exc) from exc
        return stored

    # ---- reading -----------------------------------------------------------------------

    def exists(self, asset: str, partition: str, name: str) -> bool:
        """True when a committed sidecar exists for the array."""
        return self.sidecar_path(asset, partition, name).is_file()

    def names(self, asset: str, partition: str) -> list[str]:
        """Committed array names in a partition (sorted)."""
        directory = self.partition_dir(asset, partition)
        if not directory.is_dir():
            return []
        out = []
        for p in directory.iterdir():
            stem = p.name[: -len(".json")] if p.name.endswith(".json") else None
            if stem and _NAME_RE.fullmatch(stem) and (directory / f"{stem}.npy").exists():
                out.append(stem)
        return sorted(out)

    def partitions(self, asset: str) -> list[str]:
        """Partition keys present for an asset (sorted)."""
        directory = self.base_dir / validate_asset_name(asset)
        if not directory.is_dir():
            return []
        return sorted(
            p.name
            for p in directory.iterdir()
            if p.is_dir() and _PARTITION_RE.fullmatch(p.name) and ".." not in p.name
        )

    def load(self, asset: str, partition: str, name: str, *, mmap: bool = True) -> StoredArray:
        """Load a committed array: read-only ``np.memmap`` (``mmap=True``) or an in-memory copy.

        Raises :class:`MatrixNotFoundError` if it was never committed and
        :class:`CorruptMatrixError` (naming the file) if the files are unreadable, truncated
        or disagree with the sidecar.
        """
        npy = self.array_path(asset, partition, name)
        side = npy.with_suffix(".json")
        last_problem = ""
        orphan = False
        for attempt in range(_CONSISTENCY_ATTEMPTS):
            if attempt:
                time.sleep(_CONSISTENCY_SLEEP_S)
            meta = _read_json_file(side, "sidecar")
            try:
                f = open(npy, "rb")
            except FileNotFoundError:
                if meta is None:
                    raise MatrixNotFoundError(
                        f"no array {asset}/{partition}/{name} in the store ({npy} does not exist)",
                        npy,
                    ) from None
                orphan = False
                last_problem = f"sidecar {side} exists but array {npy} does not"
                continue
            with f:
                ident = _identity(os.fstat(f.fileno()))
                if meta is None or meta.get("array_file") != ident:
                    pending_meta = self._find_pending_sidecar(side, ident)
                    if pending_meta is not None:
                        meta = pending_meta
                    elif meta is None:
                        orphan = True
                        last_problem = f"array {npy} exists but its sidecar {side} does not"
                        continue
                    else:
                        orphan = False
                        last_problem = (
                            f"array {npy} (inode {ident['inode']}) does not match its sidecar "
                            f"{side} (inode {meta.get('array_file', {}).get('inode')})"
                        )
                        continue
                return self._check_and_map(asset, partition, name, npy, f, ident, meta, mmap)
        if orphan:
            raise MatrixNotFoundError(
                f"no committed array {asset}/{partition}/{name}: {last_problem} (orphan file)",
                npy,
            )
        raise CorruptMatrixError(
            f"inconsistent array {asset}/{partition}/{name}: {last_problem}", npy
        )

    def _open_verified(
        self, asset: str, partition: str, name: str, npy: Path, meta: dict[str, Any], *, mmap: bool
    ) -> StoredArray:
        with open(npy, "rb") as f:
            ident = _identity(os.fstat(f.fileno()))
            if meta.get("array_file") != ident:
                raise CorruptMatrixError(f"array {npy} changed while being published", npy)
            return self._check_and_map(asset, partition, name, npy, f, ident, meta, mmap)

    def _find_pending_sidecar(self, side: Path, ident: dict[str, int]) -> dict[str, Any] | None:
        """A complete temp sidecar (writer between its two renames) matching ``ident``."""
        prefix = f".{side.name}.tmp-"
        try:
            candidates = [p for p in side.parent.iterdir() if p.name.startswith(prefix)]
        except FileNotFoundError:
            return None
        for cand in candidates:
            try:
                meta = _read_json_file(cand, "sidecar")
            except CorruptMatrixError:
                continue  # a temp sidecar is complete once renamed only; skip torn ones
            if meta is not None and meta.get("array_file") == ident:
                return meta
        return None

    def _check_and_map(
        self,
        asset: str,
        partition: str,
        name: str,
        npy: Path,
        f: Any,
        ident: dict[str, int],
        meta: dict[str, Any],
        mmap: bool,
    ) -> StoredArray:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except (ValueError, OSError, SyntaxError) as exc:
            raise CorruptMatrixError(
                f"array {npy} has an unreadable .npy header: {exc}", npy
            ) from exc
        try:
            want_shape = tuple(int(s) for s in meta["shape"])
            want_dtype = _descr_to_dtype(meta["dtype"])
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
        if ident["size"] != offset + nbytes:
            raise CorruptMatrixError(
                f"array {npy} is {ident['size']} bytes, expected {offset + nbytes} "
                f"(header {offset} + data {nbytes}): truncated or corrupt",
                npy,
            )
        order = "F" if fortran else "C"
        if mmap:
            array: np.ndarray = np.memmap(  # type: ignore[call-overload]
                f, dtype=dtype, mode="r", shape=tuple(shape), offset=offset, order=order
            )
        else:
            count = math.prod(shape)
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

    def current_version(self, asset: str, partition: str, name: str) -> str | None:
        """Version id of the committed array (``None`` if absent); cheap (sidecar only)."""
        meta = _read_json_file(self.sidecar_path(asset, partition, name), "sidecar")
        return None if meta is None else str(meta.get("version"))

    # ---- deleting and cleaning -----------------------------------------------------------

    def delete(self, asset: str, partition: str, name: str) -> bool:
        """Remove a committed array (sidecar first, so it disappears atomically). True if it existed."""
        npy = self.array_path(asset, partition, name)
        directory = npy.parent
        if not directory.is_dir():
            return False
        with self._lock(directory, name):
            existed = npy.with_suffix(".json").exists()
            _unlink_quiet(npy.with_suffix(".json"))
            _unlink_quiet(npy)
        _fsync_dir(directory)
        return existed

    def cleanup_stale_temps(
        self,
        *,
        asset: str | None = None,
        partition: str | None = None,
        max_age_seconds: float | None = None,
    ) -> list[Path]:
        """Delete temp files of writers that are gone; returns the paths removed.

        Scans the whole store, or only ``asset`` (and ``partition``) when given.
        :meth:`allocate` runs it on its own partition directory, so a re-materialization after
        a crash removes the crashed attempt's leftovers.

        A temp file ``.<file>.tmp-<pid>-<hex>`` is stale when process ``<pid>`` no longer
        exists on this host or (if ``max_age_seconds`` is given, e.g. for a store shared by
        several hosts) when it is older than that. A stale temp *sidecar* whose array was
        already committed (the writer died between its two renames) is rolled forward into
        place instead of deleted, so array and sidecar agree again.
        """
        if partition is not None and asset is None:
            raise ValueError("cleanup_stale_temps: partition given without asset")
        if asset is None:
            asset_dirs = sorted(p for p in self.base_dir.iterdir() if p.is_dir())
        else:
            asset_dirs = [self.base_dir / validate_asset_name(asset)]
        removed: list[Path] = []
        now = time.time()
        for asset_dir in asset_dirs:
            if not _ASSET_RE.fullmatch(asset_dir.name) or not asset_dir.is_dir():
                continue
            if partition is None:
                part_dirs = sorted(p for p in asset_dir.iterdir() if p.is_dir())
            else:
                part_dirs = [self.partition_dir(asset_dir.name, partition)]
            for part_dir in part_dirs:
                if not _PARTITION_RE.fullmatch(part_dir.name) or not part_dir.is_dir():
                    continue
                for p in sorted(part_dir.iterdir()):
                    m = _TEMP_RE.fullmatch(p.name)
                    if not m:
                        continue
                    stale = not _pid_alive(int(m["pid"]))
                    if not stale and max_age_seconds is not None:
                        with contextlib.suppress(FileNotFoundError):
                            stale = now - p.stat().st_mtime > max_age_seconds
                    if not stale:
                        continue
                    target = part_dir / m["target"]
                    if target.suffix == ".json" and _NAME_RE.fullmatch(target.stem):
                        if self._roll_forward(part_dir, target, p):
                            continue
                    _unlink_quiet(p)
                    removed.append(p)
        return removed

    def _roll_forward(self, directory: Path, side_final: Path, side_temp: Path) -> bool:
        try:
            meta = _read_json_file(side_temp, "sidecar")
        except CorruptMatrixError:
            return False
        if meta is None:
            return False
        with self._lock(directory, side_final.stem):
            try:
                st = os.stat(side_final.with_suffix(".npy"))
            except FileNotFoundError:
                return False
            if meta.get("array_file") != _identity(st):
                return False
            current = _read_json_file(side_final, "sidecar") if side_final.exists() else None
            if current is not None and current.get("array_file") == _identity(st):
                return False
            os.replace(side_temp, side_final)
        _fsync_dir(directory)
        return True

    # ---- bundles (the unit the Dagster IO manager hands over) --------------------------

    def save_bundle(self, asset: str, partition: str, bundle: MatrixBundle) -> BundleWriteReport:
        """Store every array of ``bundle`` under ``<asset>/<partition>`` and commit its manifest.

        Per array ``name``:

        * a :class:`StoredArray` already committed at ``<asset>/<partition>/<name>`` whose
          version is still the current one (what :meth:`PendingArray.commit` returned)
          is **reused as is** — no byte is copied (the zero-copy hand-off);
        * another :class:`StoredArray` is hard-linked (:meth:`link`, zero copy);
        * anything else is converted with ``np.asarray`` and copied (:meth:`save`), with the
          bundle's labels/params in its sidecar.

        Then ``bundle.manifest.json`` (names, versions, shapes, dtypes, labels, params) is
        replaced atomically — the commit point of the bundle — and arrays of the partition
        that are not in the bundle (left by an earlier materialization) are deleted.
        """
        for name in bundle.arrays:  # every key is checked before anything touches the disk
            _validate_name(name)
        directory = self._ensure_dir(asset, partition)
        # Writers of one bundle take turns: storing the arrays and committing the manifest is
        # one critical section, so two concurrent materializations of the same partition cannot
        # leave a manifest naming array versions the other one has replaced meanwhile (a bundle
        # that load_bundle would refuse until the partition is re-materialized). The lock file
        # name has a dot, so it can never be an array's own commit lock.
        with self._lock(directory, "bundle.writer"):
            return self._save_bundle_locked(asset, partition, directory, bundle)

    def _save_bundle_locked(
        self, asset: str, partition: str, directory: Path, bundle: MatrixBundle
    ) -> BundleWriteReport:
        stored: dict[str, StoredArray] = {}
        reused: list[str] = []
        linked: list[str] = []
        copied: list[str] = []
        copied_bytes = 0
        for name, value in bundle.arrays.items():
            _validate_name(name)
            if isinstance(value, PendingArray):
                raise MatrixStoreError(
                    f"bundle array {name!r} is a PendingArray in state {value.state}: "
                    "call commit() and put the returned StoredArray in the bundle",
                    value.path,
                )
            if isinstance(value, StoredArray):
                if (
                    value.location == (asset, partition, name)
                    and self.current_version(asset, partition, name) == value.version
                ):
                    stored[name] = value
                    reused.append(name)
                else:
                    stored[name] = self.link(
                        value, asset, partition, name, labels=value.labels, params=value.params
                    )
                    linked.append(name)
            else:
                arr = np.asarray(value)
                stored[name] = self.save(
                    asset, partition, name, arr, labels=bundle.labels, params=bundle.params
                )
                copied.append(name)
                copied_bytes += int(arr.nbytes)
        manifest = {
            "format": FORMAT_VERSION,
            "asset": asset,
            "partition": partition,
            "created_at": _now_iso(),
            "labels": _jsonable(dict(bundle.labels), "bundle.labels"),
            "params": _jsonable(dict(bundle.params), "bundle.params"),
            "arrays": {
                name: {
                    "version": s.version,
                    "shape": list(s.shape),
                    "dtype": _dtype_descr(s.dtype),
                }
                for name, s in stored.items()
            },
        }
        final = directory / MANIFEST_FILE
        temp = _temp_path(final)
        try:
            with self._lock(directory, "bundle"):
                _write_json_file(temp, manifest)
                os.replace(temp, final)
            _fsync_dir(directory)
        except OSError as exc:
            _unlink_quiet(temp)
            raise _space_or_io_error("writing the bundle manifest", final, exc) from exc
        removed = [n for n in self.names(asset, partition) if n not in stored]
        for n in removed:
            self.delete(asset, partition, n)
        out = MatrixBundle(
            arrays=dict(stored), labels=manifest["labels"], params=manifest["params"]
        )
        return BundleWriteReport(
            bundle=out,
            directory=directory,
            reused=reused,
            linked=linked,
            copied=copied,
            removed=removed,
            nbytes=int(sum(s.array.nbytes for s in stored.values())),
            copied_bytes=copied_bytes,
        )

    def has_bundle(self, asset: str, partition: str) -> bool:
        return (self.partition_dir(asset, partition) / MANIFEST_FILE).is_file()

    def load_bundle(self, asset: str, partition: str, *, mmap: bool = True) -> MatrixBundle:
        """Load the bundle last committed by :meth:`save_bundle` (arrays as :class:`StoredArray`).

        Every array's version must equal the manifest's; a concurrent re-materialization is
        retried, anything else raises :class:`CorruptMatrixError`.
        """
        path = self.partition_dir(asset, partition) / MANIFEST_FILE
        problem = ""
        for attempt in range(_CONSISTENCY_ATTEMPTS):
            if attempt:
                time.sleep(_CONSISTENCY_SLEEP_S)
            manifest = _read_json_file(path, "bundle manifest")
            if manifest is None:
                raise MatrixNotFoundError(
                    f"no bundle for {asset}/{partition}: {path} does not exist "
                    "(was the asset materialized through the matrix-store IO manager?)",
                    path,
                )
            arrays: dict[str, np.ndarray | StoredArray] = {}
            try:
                entries = dict(manifest["arrays"])
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptMatrixError(f"bundle manifest {path} lacks 'arrays'", path) from exc
            for name, entry in entries.items():
                try:
                    s = self.load(asset, partition, name, mmap=mmap)
                except MatrixNotFoundError:
                    problem = f"array {name!r} listed in {path} is missing"
                    break
                if s.version != entry.get("version"):
                    problem = (
                        f"array {name!r} is version {s.version}, {path} expects "
                        f"{entry.get('version')}"
                    )
                    break
                arrays[name] = s
            else:
                return MatrixBundle(
                    arrays=arrays,
                    labels=dict(manifest.get("labels") or {}),
                    params=dict(manifest.get("params") or {}),
                )
        raise CorruptMatrixError(f"bundle {asset}/{partition} is inconsistent: {problem}", path)
