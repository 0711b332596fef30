"""Matrix store: immutable, versioned, memory-mapped ``.npy`` arrays with JSON sidecars (SPEC §8).

Layout
------
::

    <base_dir>/                                      0700, like every directory of the store
      <asset>/<partition>/                           one directory per asset and partition
        bundle.manifest.json                         the CURRENT pointer: which version of each
                                                     array (+ the bundle's labels, params, inputs)
        <name>.<version>.npy                         one immutable version of an array (standard
                                                     .npy); files are 0600
        <name>.<version>.json                        its sidecar: labels, shape, dtype, params,
                                                     version, size, sampled fingerprint and
                                                     full checksum
        .<file>.tmp-<hex32>                          a temp file being written (locked by its writer)
        .partition.lock                              shared by users of the directory, exclusive
                                                     for retention and garbage collection
        .manifest.lock                               serializes manifest updates
      .retention/<partition>.json                    what retention removed from a partition

``asset`` and array ``name`` match ``^[A-Za-z0-9_]+$``; ``partition`` matches
``^[A-Za-z0-9_][A-Za-z0-9_.-]*$`` (an ISO date such as ``2024-03-28`` qualifies) and may not
contain ``..``; ``version`` is ``YYYYMMDDTHHMMSSffffffZ-<8 hex>`` (UTC time of the commit, then
random), so versions sort by age. Every path is checked to lie inside ``base_dir``, so no key can
steer a write or a read outside the store.

Versions and the current pointer
--------------------------------
A committed version is never modified, renamed or replaced: a new result is a new version
next to the old ones. What is *current* is only what ``bundle.manifest.json`` says, and the
manifest changes by one ``os.replace`` (then a directory ``fsync``): a reader sees the whole old
bundle or the whole new one. :meth:`MatrixStore.load` reads the current version of an array
(``version=None``) or exactly the version asked for (a *pinned* version, e.g. the one a published
snapshot records); :meth:`MatrixStore.load_bundle` reads the current bundle and exposes the
versions it read (``bundle.versions``). A manifest may record ``inputs``: the versions of other
assets of the partition the bundle was computed from.

Old versions stay on disk until :meth:`MatrixStore.collect_garbage` finds that nothing needs them:
a version is deleted only when no current manifest of its partition names it (as an array or as
an input), the caller's ``pinned`` set (the versions recorded by published snapshots, which the
store does not read itself) does not name it, and no live writer holds it. Retention removes whole
partitions (:meth:`MatrixStore.remove_partition`) and records what it removed in ``.retention/``.

Writing (producer side)
-----------------------
Large arrays are written in place, tile by tile, without a second copy in RAM::

    with store.allocate("correlation_matrix", "2024-03-28", "corr", (n, n), np.float32,
                        labels={"symbols": symbols}) as pending:
        pairwise_correlation(R, min_overlap=30, out_corr=pending.array, ...)
        stored = pending.commit()          # -> StoredArray: a new immutable version
    store.save_bundle("correlation_matrix", "2024-03-28", MatrixBundle({"corr": stored}))

:meth:`MatrixStore.allocate` creates the temp file ``.<name>.<version>.npy.tmp-<hex>`` in the
partition directory (same file system, so the final rename is atomic), **locked** by the writer
(``fcntl``, see :mod:`corr_pipeline.store.locks`), writes the ``.npy`` header, **reserves the disk
blocks** with ``posix_fallocate`` (a full disk is reported now, as a clean
:class:`MatrixStoreSpaceError`, instead of a ``SIGBUS`` when a page of the map is first touched)
and maps it writable (fresh contents are zero). :meth:`PendingArray.commit`:

1. ``flush()`` (``msync``) the map, ``fsync`` the file, fingerprint it (sampled, and the full
   SHA-256);
2. write the sidecar ``<name>.<version>.json`` (temp file, ``fsync``, rename);
3. rename the array to ``<name>.<version>.npy``, ``fsync`` the directory.

The version now exists but is not current: :meth:`MatrixStore.save_bundle` (the IO manager's
hand-off, reusing the committed file without a copy) or :meth:`MatrixStore.set_current` names it
in the manifest — the commit point. Until then its writer keeps the lock on the version file, so
garbage collection leaves it alone; once named, the manifest protects it. :meth:`MatrixStore.save`
does all of it for an in-memory array.

A step's large *working* array that is not a result (the clustering step's distances) can live
in the store too, out of anonymous memory: :meth:`MatrixStore.scratch` is the same locked temp
file, never committed, deleted when its ``with`` block ends, however it ends.

Any failure, exception or ``KeyboardInterrupt`` before the commit removes the temp files (and a
:class:`PendingArray` dropped without commit or abort removes its temp file when it is garbage
collected or the interpreter exits). A SIGKILL leaves a temp file whose lock died with its
writer: :meth:`MatrixStore.cleanup_stale_temps` (run by every :meth:`allocate` on its partition
and by garbage collection) deletes temp files nobody holds locked — never one whose writer is
alive, on this host or another one sharing the store.

Reading (consumer side)
-----------------------
:meth:`MatrixStore.load` checks the sidecar against the data: the sidecar's version and name
against the file name, the ``.npy`` header's shape and dtype against the sidecar's, the file size
against the header and the sidecar, and a *sampled* content fingerprint (SHA-256 of the size
and 17 blocks of 64 KiB spread over the file: :mod:`corr_pipeline.store.checksum`) against the
sidecar's. The sidecar also records the SHA-256 of the whole file, computed at commit; a load
does not read every byte, ``corr-pipeline store verify`` does
(:mod:`corr_pipeline.store.verify`). Nothing in the sidecar
depends on the inode, the mtime or the path, so a faithful copy of the store (``cp -a``,
``rsync -a``, a restored ``tar``) loads, while a sidecar that does not match its data is reported
as :class:`CorruptMatrixError`. The array comes back as a read-only ``np.memmap`` (``mmap=True``)
of the checked file. A map held by a reader stays valid even after garbage collection deletes its
file (POSIX keeps an unlinked file until its last map closes).

Durability
----------
New directories are created 0700 and ``fsync``ed into their parents; files are created 0600
(``fchmod``, whatever the umask); every file is ``fsync``ed before its rename and every rename is
followed by an ``fsync`` of the directory. A SIGKILL at any point therefore leaves: the previous
manifest (naming complete versions) or the new one (naming complete versions); at worst some
unreferenced version or temp files, which garbage collection removes.

Labels and params are JSON: numpy arrays become lists, ``datetime.date`` / ``datetime64``
become ISO strings, numpy scalars become Python numbers. They come back in that JSON form
(e.g. dates as ``"2024-03-28"`` strings).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import math
import mmap
import os
import re
import secrets
import socket
import time
import uuid
import weakref
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store import locks, memory
from corr_pipeline.store.checksum import full_checksum, sampled_fingerprint

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "BundleWriteReport",
    "CorruptMatrixError",
    "GarbageReport",
    "InvalidStoreKeyError",
    "MatrixBundle",
    "MatrixNotFoundError",
    "MatrixStore",
    "MatrixStoreError",
    "MatrixStoreSpaceError",
    "PartitionBusyError",
    "PendingArray",
    "RemovalReport",
    "StoredArray",
    "VersionInfo",
    "VersionNotFoundError",
    "validate_asset_name",
    "validate_version",
]

FORMAT_VERSION = 2
"""Sidecar / manifest format written into every JSON file (``"format"``); format 1 (one
replaceable ``<name>.npy`` per array, identified by inode) is refused with a clear message."""

MANIFEST_FILE = "bundle.manifest.json"
PARTITION_LOCK = ".partition.lock"
MANIFEST_LOCK = ".manifest.lock"
RETENTION_DIR = ".retention"

_ASSET_RE = re.compile(r"[A-Za-z0-9_]{1,200}")
_NAME_RE = _ASSET_RE
_PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_VERSION_PATTERN = r"\d{8}T\d{12}Z-[0-9a-f]{8}"
_VERSION_RE = re.compile(_VERSION_PATTERN)
_VERSION_FILE_RE = re.compile(
    rf"(?P<name>[A-Za-z0-9_]{{1,200}})\.(?P<version>{_VERSION_PATTERN})\.(?P<kind>npy|json)"
)
_TEMP_RE = re.compile(r"\.(?P<target>.+)\.tmp-(?P<uid>[0-9a-f]{32})")
#: Files of the format-1 layout (one replaceable ``<name>.npy`` + ``<name>.json`` per array,
#: ``.<name>.lock`` / ``.bundle.writer.lock`` / ``.bundle.lock`` commit locks).
_LEGACY_FILE_RE = re.compile(
    r"[A-Za-z0-9_]{1,200}\.(npy|json)|\.(?:[A-Za-z0-9_]{1,200}|bundle\.writer|bundle)\.lock"
)

_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_MANIFEST_ATTEMPTS = 40
_MANIFEST_SLEEP_S = 0.025
_DIR_MODE = 0o700
_FILE_MODE = 0o600


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


class MatrixStoreError(Exception):
    """Base class of every matrix-store error; ``.path`` names the file concerned."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)


class InvalidStoreKeyError(MatrixStoreError, ValueError):
    """An asset name, partition key, array name or version that is not allowed (path safety)."""


class MatrixNotFoundError(MatrixStoreError, FileNotFoundError):
    """The requested array (or bundle manifest) was never committed, or was deleted."""


class VersionNotFoundError(MatrixNotFoundError):
    """An explicitly requested version is not in the store (garbage-collected or removed by
    retention: see :meth:`MatrixStore.pruned`)."""

    def __init__(
        self, message: str, path: str | os.PathLike[str], asset: str, partition: str,
        name: str, version: str,
    ) -> None:  # fmt: skip
        super().__init__(message, path)
        self.asset, self.partition, self.name, self.version = asset, partition, name, version


class CorruptMatrixError(MatrixStoreError):
    """Files exist but are unreadable or disagree with each other (truncated, bad JSON, ...)."""


class PartitionBusyError(MatrixStoreError):
    """Another process uses the partition (a writer, a run in flight): nothing was removed."""


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


def validate_version(version: str) -> str:
    """``version`` if it is a version id of this store (``YYYYMMDDTHHMMSSffffffZ-<8 hex>``);
    :class:`InvalidStoreKeyError` otherwise."""
    if not isinstance(version, str) or not _VERSION_RE.fullmatch(version):
        raise InvalidStoreKeyError(
            f"invalid version {version!r}: expected YYYYMMDDTHHMMSSffffffZ-<8 hex digits>"
        )
    return version


def new_version() -> str:
    """A fresh version id: UTC time of now to the microsecond, then 32 random bits."""
    now = _dt.datetime.now(_dt.UTC)
    return f"{now.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(4)}"


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
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: Path) -> bool:
    """Create one directory 0700 (exactly, whatever the umask) and fsync it into its parent;
    False if it existed."""
    try:
        os.mkdir(path, _DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(path, _DIR_MODE)
    _fsync_dir(path.parent)
    return True


def _mkdirs(path: Path) -> None:
    """``mkdir -p`` where every directory created is 0700 and fsynced into its parent."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for directory in reversed(missing):
        _mkdir(directory)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))


def _advise_huge_pages(array: np.ndarray) -> None:
    """``madvise(MADV_HUGEPAGE)`` on a ``np.memmap``'s map; a no-op where unsupported."""
    mapped = getattr(array, "_mmap", None)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if mapped is not None and advice is not None:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(advice)


def _unlink_quiet(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex}")


def _create_temp(final: Path) -> tuple[Path, locks.FileLock]:
    """A new temp file for ``final``, 0600, exclusively locked by the caller."""
    for _ in range(8):
        temp = _temp_path(final)
        try:
            return temp, locks.create_locked(temp, _FILE_MODE)
        except FileNotFoundError:
            if not final.parent.is_dir():
                raise
            continue  # a cleaner raced us between create and lock: take another name
    raise MatrixStoreError(f"could not create a temp file next to {final}", final)


def _space_or_io_error(action: str, path: Path, exc: OSError) -> MatrixStoreError:
    if exc.errno in _SPACE_ERRNOS:
        return MatrixStoreSpaceError(
            f"out of disk space while {action} {path}: {exc.strerror or exc} "
            f"(errno {exc.errno}); the partial file was removed, the previous version is intact",
            path,
            exc.errno,
        )
    return MatrixStoreError(f"I/O error while {action} {path}: {exc}", path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_json_atomic(
    final: Path, obj: Mapping[str, Any], *, sync_dir: bool = True, durable: bool = True
) -> None:
    """Write ``obj`` as JSON to ``final`` atomically: locked 0600 temp file, fsync, rename
    (then fsync of the directory). Temp file removed on any failure. ``durable`` False: no
    fsync at all (the rename still makes it appear whole; a power loss may lose it)."""
    data = json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")
    temp, lock = _create_temp(final)
    try:
        assert lock.fd is not None
        _write_all(lock.fd, data)
        if durable:
            os.fsync(lock.fd)
        os.replace(temp, final)
    except BaseException:
        _unlink_quiet(temp)
        raise
    finally:
        lock.release()
    if sync_dir and durable:
        _fsync_dir(final.parent)


def _read_json_file(path: Path, what: str) -> dict[str, Any] | None:
    """Parse a store JSON file; ``None`` if it does not exist; CorruptMatrixError if unreadable
    or of another format."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptMatrixError(f"{what} {path} is not valid JSON: {exc}", path) from exc
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if fmt == 1:
        raise CorruptMatrixError(
            f"{what} {path} was written by an older corr_pipeline (matrix-store format 1, one "
            "replaceable file per array): re-materialize the partition to rewrite it in "
            f"format {FORMAT_VERSION}",
            path,
        )
    if not isinstance(obj, dict) or fmt != FORMAT_VERSION:
        raise CorruptMatrixError(
            f"{what} {path} is not a matrix-store v{FORMAT_VERSION} file (format={fmt!r})", path
        )
    return obj


def _dtype_descr(dtype: np.dtype) -> Any:
    return np.lib.format.dtype_to_descr(dtype)


def _descr_to_dtype(descr: Any) -> np.dtype:
    # JSON turns the tuples of a structured descr into lists; descr_to_dtype wants tuples.
    def fix(d: Any) -> Any:
        if isinstance(d, list):
            return [tuple(fix(x) for x in item) if isinstance(item, list) else item for item in d]
        return d

    return np.lib.format.descr_to_dtype(fix(descr))


def _check_inputs(inputs: Mapping[str, Mapping[str, str]], where: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for asset, arrays in inputs.items():
        validate_asset_name(asset)
        out[asset] = {}
        for name, version in arrays.items():
            out[asset][_validate_name(name)] = validate_version(str(version))
    return out


# --------------------------------------------------------------------------------------
# value types
# --------------------------------------------------------------------------------------


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
    """What :meth:`MatrixStore.collect_garbage` deleted (or, with ``dry_run``, would delete)."""

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
    """What :meth:`MatrixStore.remove_partition` removed (or, with ``dry_run``, would remove)."""

    partition: str
    assets: list[str]
    versions: list[VersionInfo]
    bytes: int
    dry_run: bool = False


def _discard_temp(path: Path, lock: locks.FileLock, pid: int) -> None:
    """Finalizer of a :class:`PendingArray` left neither committed nor aborted (in the process
    that created it: a forked child exiting normally must not delete its parent's temp file)."""
    if os.getpid() == pid:
        _unlink_quiet(path)
        lock.release()


class PendingArray:
    """A writable array being produced inside the store; see :meth:`MatrixStore.allocate`.

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
        store: MatrixStore,
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
        self.store = store
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
        self._finalizer = weakref.finalize(self, _discard_temp, temp_path, lock, os.getpid())

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
        _unlink_quiet(self.temp_path)
        for path in extra:
            _unlink_quiet(path)
        self._lock.release()

    def commit(self) -> StoredArray:
        """Flush, fsync and publish as a new immutable version (not yet current: see
        :meth:`MatrixStore.save_bundle` / :meth:`MatrixStore.set_current`)."""
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
            meta = self.store._make_meta(
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
            _write_json_atomic(sidecar, meta, sync_dir=False)
            wrote_sidecar = True
            os.replace(self.temp_path, self.path)
            self._lock.path = self.path
            _fsync_dir(self.path.parent)
            stored = self.store._open_version(
                self.asset, self.partition, self.name, self.version, mmap=True
            )
        except OSError as exc:
            self._fail(*([sidecar, self.path] if wrote_sidecar else []))
            raise _space_or_io_error("committing", self.path, exc) from exc
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


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------


class MatrixStore:
    """Directory of versioned arrays, one sub-directory per asset and partition (SPEC §8).

    Stateless apart from ``base_dir``: any number of processes (and hosts sharing the directory)
    may open the same store. See the module docstring for the layout and the protocols.
    """

    def __init__(self, base_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        base = Path(base_dir).expanduser()
        if create:
            _mkdirs(base.absolute())
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

    def memory_partition_dir(
        self, asset: str, partition: str, *, create: bool = False
    ) -> Path | None:
        """``<memory area>/<asset>/<partition>`` (:mod:`corr_pipeline.store.memory`), None
        without a usable memory area; ``create``: make it."""
        area = memory.store_area(self.base_dir, create=create)
        if area is None:
            return None
        path = area / validate_asset_name(asset) / _validate_partition(partition)
        if create:
            _mkdir(path.parent)
            _mkdir(path)
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
        file = f"{_validate_name(name)}.{validate_version(version)}.npy"
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
            _mkdir(self.base_dir / asset)
            _mkdir(directory)
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
                _mkdir(directory.parent)
                _mkdir(directory)
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
        fd = os.open(directory / MANIFEST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        try:
            with contextlib.suppress(OSError):
                os.fchmod(fd, _FILE_MODE)
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
        self.partition_dir(asset, partition)
        _validate_name(name)
        labels_j = _jsonable(dict(labels or {}), f"{name}.labels")
        params_j = _jsonable(dict(params or {}), f"{name}.params")
        version = new_version()
        directory = self.partition_dir(asset, partition)
        with contextlib.suppress(OSError):  # best effort: free what a crashed attempt left
            self.cleanup_stale_temps(asset=asset, partition=partition)
        target = directory
        if in_memory:
            area = self.memory_partition_dir(asset, partition, create=True)
            if area is not None and memory.has_room(area, math.prod(shp) * dt.itemsize):
                target = area
        held = self._hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        final = target / f"{name}.{version}.npy"
        try:
            temp, lock = _create_temp(final)
        except OSError as exc:
            held.release()
            raise _space_or_io_error("allocating", final, exc) from exc
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
            _unlink_quiet(temp)
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
            raise _space_or_io_error("allocating", final, exc) from exc
        except BaseException:
            _unlink_quiet(temp)
            lock.release()
            raise
        finally:
            held.release()
        return PendingArray(
            self, asset, partition, name, version, final, temp, lock, mm, labels_j, params_j
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
        collection removes (:meth:`cleanup_stale_temps`). ``in_memory``: in the store's memory
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
            _advise_huge_pages(pending.array)
            yield pending.array
        finally:
            pending.abort()

    def _save_version(
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
        (:meth:`set_current`)."""
        stored = self._save_version(asset, partition, name, array, labels, params)
        self.set_current(stored)
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
        stored = self._link_version(source, asset, partition, name, labels=labels, params=params)
        self.set_current(stored)
        return stored

    def _link_version(
        self,
        source: StoredArray,
        asset: str,
        partition: str,
        name: str,
        *,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> StoredArray:
        self.partition_dir(asset, partition)
        _validate_name(name)
        labels_j = _jsonable(dict(source.labels if labels is None else labels), "labels")
        params_j = _jsonable(dict(source.params if params is None else params), "params")
        version = new_version()
        directory = self.partition_dir(asset, partition)
        held = self._hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        final = directory / f"{name}.{version}.npy"
        sidecar = final.with_suffix(".json")
        temp = _temp_path(final)
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
            _unlink_quiet(temp)
            held.release()
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT):
                return self._save_version(asset, partition, name, source.array, labels_j, params_j)
            raise _space_or_io_error("linking", final, exc) from exc
        try:
            size = os.fstat(fd).st_size
            fingerprint = sampled_fingerprint(fd, size)
            recorded = source.meta.get("array_file", {})
            if recorded.get("fingerprint") != fingerprint:
                raise OSError(errno.ENOENT, "the source file changed", str(source.path))
            # the same inode: its full checksum is the source's (computed when that has none)
            checksum = recorded.get("checksum") or full_checksum(fd, size)
            meta = self._make_meta(
                asset, partition, name, version, source.shape, source.dtype, labels_j, params_j,
                size, fingerprint, checksum,
            )  # fmt: skip
            _write_json_atomic(sidecar, meta, sync_dir=False)
            os.replace(temp, final)
            lock.path = final
            _fsync_dir(directory)
            stored = self._open_version(asset, partition, name, version, mmap=True)
        except OSError as exc:
            _unlink_quiet(temp)
            _unlink_quiet(final)
            _unlink_quiet(sidecar)
            lock.release()
            if exc.errno == errno.ENOENT:
                return self._save_version(asset, partition, name, source.array, labels_j, params_j)
            raise _space_or_io_error("linking", final, exc) from exc
        except BaseException:
            _unlink_quiet(temp)
            _unlink_quiet(final)
            _unlink_quiet(sidecar)
            lock.release()
            raise
        finally:
            held.release()
        return StoredArray(**{**stored.__dict__, "writer_lock": lock})

    def _make_meta(
        self,
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
        return {
            "format": FORMAT_VERSION,
            "version": version,
            "asset": asset,
            "partition": partition,
            "name": name,
            "shape": [int(s) for s in shape],
            "dtype": _dtype_descr(np.dtype(dtype)),
            "labels": labels,
            "params": params,
            "created_at": _now_iso(),
            "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            "array_file": {"size": int(size), "fingerprint": fingerprint, "checksum": checksum},
        }

    # ---- manifests (the current pointer) ------------------------------------------------

    def _read_manifest(self, directory: Path) -> dict[str, Any] | None:
        manifest = _read_json_file(directory / MANIFEST_FILE, "bundle manifest")
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
        names must exist; ``durable``: written through to the disk (:func:`_write_json_atomic`).
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
                    _write_json_atomic(final, manifest, durable=durable)
                except OSError as exc:
                    raise _space_or_io_error("writing the bundle manifest", final, exc) from exc
        finally:
            held.release()
        return previous, manifest

    @staticmethod
    def _entry(stored: StoredArray) -> dict[str, Any]:
        return {
            "version": stored.version,
            "shape": list(stored.shape),
            "dtype": _dtype_descr(stored.dtype),
            "nbytes": int(stored.array.nbytes),
        }

    def _new_manifest(self, asset: str, partition: str) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "asset": asset,
            "partition": partition,
            "created_at": _now_iso(),
            "labels": {},
            "params": {},
            "inputs": {},
            "arrays": {},
        }

    def set_current(self, stored: StoredArray) -> None:
        """Make ``stored`` (a version of its own location) the current version of its name; the
        other entries of the manifest stay as they are."""
        asset, partition, name = stored.location
        directory = self.partition_dir(asset, partition)

        def update(previous: dict[str, Any] | None) -> dict[str, Any]:
            manifest = previous or self._new_manifest(asset, partition)
            manifest["arrays"][name] = self._entry(stored)
            manifest["created_at"] = _now_iso()
            return manifest

        self._commit_manifest(asset, partition, directory, update)
        stored.release_writer_lock()

    def delete(self, asset: str, partition: str, name: str) -> bool:
        """Drop ``name`` from the current manifest (True if it was there). Its versions stay on
        disk until garbage collection finds nothing needs them (a published snapshot may pin
        one)."""
        _validate_name(name)
        directory = self.partition_dir(asset, partition)
        if not (directory / MANIFEST_FILE).is_file():
            return False
        found = []

        def update(previous: dict[str, Any] | None) -> dict[str, Any]:
            manifest = previous or self._new_manifest(asset, partition)
            found.append(manifest["arrays"].pop(name, None) is not None)
            return manifest

        self._commit_manifest(asset, partition, directory, update)
        return bool(found and found[0])

    # ---- bundles (the unit the Dagster IO manager hands over) --------------------------

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
        (:meth:`allocate`). Then ``bundle.manifest.json`` (names, versions, shapes, dtypes,
        labels, params, inputs) replaces the previous one atomically — the commit point of the
        bundle; when every version it names lives in the memory area, which a reboot empties,
        it is written without waiting for the disk. Names of the
        previous manifest missing from the bundle are dropped (``removed``); their versions,
        like the superseded ones, are left to :meth:`collect_garbage`.
        """
        for name in bundle.arrays:  # every key is checked before anything touches the disk
            _validate_name(name)
        directory = self.partition_dir(asset, partition)
        inputs = _check_inputs(bundle.inputs, "bundle.inputs")
        labels = _jsonable(dict(bundle.labels), "bundle.labels")
        params = _jsonable(dict(bundle.params), "bundle.params")
        held = self._hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        try:
            stored: dict[str, StoredArray] = {}
            reused: list[str] = []
            linked: list[str] = []
            copied: list[str] = []
            copied_bytes = 0
            for name, value in bundle.arrays.items():
                if isinstance(value, PendingArray):
                    raise MatrixStoreError(
                        f"bundle array {name!r} is a PendingArray in state {value.state}: "
                        "call commit() and put the returned StoredArray in the bundle",
                        value.path,
                    )
                if isinstance(value, StoredArray):
                    if value.location == (asset, partition, name) and self._has_version(
                        asset, partition, name, value.version
                    ):
                        stored[name] = value
                        reused.append(name)
                    else:
                        stored[name] = self._link_version(
                            value, asset, partition, name, labels=value.labels, params=value.params
                        )
                        linked.append(name)
                else:
                    arr = np.asarray(value)
                    stored[name] = self._save_version(
                        asset,
                        partition,
                        name,
                        arr,
                        bundle.labels,
                        bundle.params,
                        in_memory=in_memory,
                    )
                    copied.append(name)
                    copied_bytes += int(arr.nbytes)

            def update(previous: dict[str, Any] | None) -> dict[str, Any]:
                manifest = self._new_manifest(asset, partition)
                manifest.update(
                    labels=labels,
                    params=params,
                    inputs=inputs,
                    arrays={name: self._entry(s) for name, s in stored.items()},
                )
                return manifest

            # versions that all live in the memory area do not survive a reboot: neither need
            # the manifest naming them
            in_area = all(not s.path.is_relative_to(self.base_dir) for s in stored.values())
            previous, manifest = self._commit_manifest(
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
            reused=reused,
            linked=linked,
            copied=copied,
            removed=sorted(n for n in before if n not in stored),
            nbytes=int(sum(s.array.nbytes for s in stored.values())),
            copied_bytes=copied_bytes,
            superseded={
                n: str(e.get("version"))
                for n, e in before.items()
                if n in stored and e.get("version") != stored[n].version
            },
        )

    def has_bundle(self, asset: str, partition: str) -> bool:
        return (self.partition_dir(asset, partition) / MANIFEST_FILE).is_file()

    def load_bundle(self, asset: str, partition: str, *, mmap: bool = True) -> MatrixBundle:
        """Load the current bundle (arrays as :class:`StoredArray`, ``bundle.versions`` = the
        versions read). A manifest replaced while it is being read is read again; a manifest
        naming a version that is not on disk raises :class:`CorruptMatrixError`."""
        directory = self.partition_dir(asset, partition)
        path = directory / MANIFEST_FILE
        problem = ""
        previous_manifest: dict[str, Any] | None = None
        for attempt in range(_MANIFEST_ATTEMPTS):
            if attempt:
                time.sleep(_MANIFEST_SLEEP_S)
            manifest = self._read_manifest(directory)
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
                    arrays[name] = self._open_version(
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

    # ---- reading -----------------------------------------------------------------------

    def current_version(self, asset: str, partition: str, name: str) -> str | None:
        """Version the current manifest names for the array (``None`` if none)."""
        manifest = self.manifest(asset, partition)
        entry = (manifest or {}).get("arrays", {}).get(_validate_name(name))
        return None if entry is None else str(entry.get("version"))

    def exists(self, asset: str, partition: str, name: str) -> bool:
        """True when the current manifest names a version of the array."""
        try:
            return self.current_version(asset, partition, name) is not None
        except CorruptMatrixError:
            return False

    def has_version(self, asset: str, partition: str, name: str, version: str) -> bool:
        """True when that version's files are on disk."""
        return self._has_version(asset, partition, _validate_name(name), validate_version(version))

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
            p.name for p in self.base_dir.iterdir() if p.is_dir() and _ASSET_RE.fullmatch(p.name)
        )

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
                m = _VERSION_FILE_RE.fullmatch(p.name)
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
        _validate_partition(partition)
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
        directory = self.partition_dir(asset, partition)
        _validate_name(name)
        if version is not None:
            return self._open_version(asset, partition, name, validate_version(version), mmap=mmap)
        seen: str | None = None
        for attempt in range(_MANIFEST_ATTEMPTS):
            if attempt:
                time.sleep(_MANIFEST_SLEEP_S)
            manifest = self._read_manifest(directory)
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
                return self._open_version(asset, partition, name, current, mmap=mmap)
            except VersionNotFoundError:
                seen = current  # replaced and collected meanwhile? read the manifest again
        raise CorruptMatrixError(
            f"the current manifest of {asset}/{partition} names version {seen} of {name!r}, "
            "which is not on disk (deleted outside the store's protocol)",
            directory / MANIFEST_FILE,
        )

    def _open_version(
        self, asset: str, partition: str, name: str, version: str, *, mmap: bool
    ) -> StoredArray:
        npy = self.array_path(asset, partition, name, version)
        side = npy.with_suffix(".json")
        meta = _read_json_file(side, "sidecar")
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

    # ---- temp files -----------------------------------------------------------------------

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
            if not _TEMP_RE.fullmatch(p.name):
                continue
            try:
                fd = os.open(p, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                # the probe lock is held while unlinking: a writer that locks its new temp file
                # just after our probe finds the name gone and takes another one
                if locks.lock_fd(fd, exclusive=True, blocking=False):
                    if dry_run or _unlink_quiet(p):
                        removed.append(p)
            finally:
                os.close(fd)
        return removed

    # ---- garbage collection and removal ---------------------------------------------------

    @contextlib.contextmanager
    def exclusive_partition(self, partition: str, *, allow_upgrade: bool = False) -> Iterator[bool]:
        """Hold every ``<asset>/<partition>`` directory exclusively while the block runs, or
        nothing: yields False (holding nothing) when one is in use by another process (a Dagster
        step, a writer, retention elsewhere). ``allow_upgrade`` lets this process upgrade the
        shared holds it has itself (the partition a step is publishing). Never waits."""
        _validate_partition(partition)
        held: list[locks.Hold] = []
        ok = True
        try:
            for asset in self.assets():
                directory = self.base_dir / asset / partition
                if not directory.is_dir():
                    continue
                h = self._hold(
                    directory,
                    exclusive=True,
                    blocking=False,
                    create=False,
                    allow_upgrade=allow_upgrade,
                )
                if h is None:
                    if directory.is_dir():
                        ok = False
                        break
                    continue
                held.append(h)
            if not ok:
                for h in reversed(held):
                    h.release()
                held = []
            yield ok
        finally:
            for h in reversed(held):
                h.release()

    def needed_versions(
        self, partition: str, pinned: Mapping[str, Mapping[str, Any]] | None = None
    ) -> dict[str, dict[str, set[str]]]:
        """``{asset: {name: versions}}`` of ``partition`` that garbage collection keeps: named by
        a current manifest (as an array, or as an input of another asset's bundle) or by
        ``pinned`` (``{asset: {name: version or versions}}``)."""
        needed: dict[str, dict[str, set[str]]] = {}

        def add(asset: str, name: str, version: Any) -> None:
            versions = [version] if isinstance(version, str) else list(version)
            needed.setdefault(asset, {}).setdefault(name, set()).update(str(v) for v in versions)

        for asset, arrays in (pinned or {}).items():
            for name, version in (arrays or {}).items():
                add(asset, name, version)
        for asset in self.assets():
            directory = self.base_dir / asset / partition
            if not directory.is_dir():
                continue
            manifest = self._read_manifest(directory)  # CorruptMatrixError: the caller keeps all
            for name, entry in (manifest or {}).get("arrays", {}).items():
                add(asset, name, str(entry.get("version")))
            for input_asset, arrays in ((manifest or {}).get("inputs") or {}).items():
                for name, version in (arrays or {}).items():
                    add(input_asset, name, version)
        return needed

    def collect_garbage(
        self,
        pinned: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
        *,
        partitions: Collection[str] | None = None,
        dry_run: bool = False,
        allow_upgrade: Collection[str] = (),
    ) -> GarbageReport:
        """Delete the versions nothing needs, and stale temp files, in ``partitions`` (default:
        all). ``pinned``: ``{partition: {asset: {name: version}}}``, the versions published
        snapshots record (the caller reads them from PostgreSQL; the store does not).

        A version is deleted only if no current manifest of its partition names it (as an
        array or an input), ``pinned`` does not name it, and no writer holds it (a version
        committed but not yet named by a manifest). A partition used by another process is
        skipped whole (``busy_partitions``); ``allow_upgrade``: partitions this process holds
        itself (see :meth:`exclusive_partition`).
        """
        report = GarbageReport(dry_run=dry_run)
        keys = self.partition_keys() if partitions is None else list(partitions)
        for partition in keys:
            with self.exclusive_partition(
                partition, allow_upgrade=partition in allow_upgrade
            ) as ok:
                if not ok:
                    report.busy_partitions.append(partition)
                    continue
                report.merge(
                    self._collect_locked(partition, (pinned or {}).get(partition), dry_run)
                )
        return report

    def _collect_locked(
        self, partition: str, pinned: Mapping[str, Mapping[str, Any]] | None, dry_run: bool
    ) -> GarbageReport:
        """Garbage collection of one partition whose directories the caller holds exclusively."""
        report = GarbageReport(dry_run=dry_run)
        try:
            needed = self.needed_versions(partition, pinned)
        except CorruptMatrixError:
            report.unreadable.append(partition)  # unreadable manifest: keep everything
            return report
        for asset in self.assets():
            directory = self.base_dir / asset / partition
            if not directory.is_dir():
                continue
            live_temps: set[str] = set()
            for version_dir in self._version_dirs(asset, partition):
                report.temps_removed += self._cleanup_dir(version_dir, dry_run=dry_run)
                live_temps |= {
                    m["target"]
                    for p in version_dir.iterdir()
                    if (m := _TEMP_RE.fullmatch(p.name)) and p.exists()
                }
            keep = needed.get(asset, {})
            touched: set[Path] = set()
            # files of the format-1 layout: no format-2 manifest or pin can name them
            for p in sorted(directory.iterdir()):
                if _LEGACY_FILE_RE.fullmatch(p.name) and p.name not in (
                    PARTITION_LOCK,
                    MANIFEST_LOCK,
                ):
                    if dry_run or _unlink_quiet(p):
                        report.legacy_removed.append(p)
                        if not dry_run:
                            touched.add(directory)
            for info in self.versions(asset, partition):
                if info.version in keep.get(info.name, ()):
                    continue
                npy = (info.directory or directory) / f"{info.name}.{info.version}.npy"
                side = npy.with_suffix(".json")
                if not npy.exists():
                    if npy.name in live_temps:  # its writer is still writing the data
                        report.kept_busy.append(info)
                        continue
                    if not dry_run:
                        _unlink_quiet(side)
                        touched.add(npy.parent)
                    report.deleted.append(info)
                    continue
                try:
                    fd = os.open(npy, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    if not locks.lock_fd(fd, exclusive=True, blocking=False):
                        report.kept_busy.append(info)  # committed, not yet in a manifest
                        continue
                    if not dry_run:
                        _unlink_quiet(side)
                        _unlink_quiet(npy)
                        touched.add(npy.parent)
                    report.deleted.append(info)
                finally:
                    os.close(fd)
            for changed in touched:
                _fsync_dir(changed)
        return report

    def pruned(self, partition: str) -> dict[str, Any] | None:
        """What retention removed from ``partition`` (``.retention/<partition>.json``: when,
        why, and ``versions`` ``{asset: {name: [versions]}}``), or None."""
        path = self.base_dir / RETENTION_DIR / f"{_validate_partition(partition)}.json"
        try:
            return _read_json_file(path, "retention record")
        except CorruptMatrixError:
            return None

    def remove_partition(
        self,
        partition: str,
        *,
        reason: str | None = None,
        dry_run: bool = False,
    ) -> RemovalReport:
        """Remove every asset directory of ``partition`` (all versions, manifests, locks).

        Takes the partition exclusively first; raises :class:`PartitionBusyError` (removing
        nothing) when another process uses it or a writer holds one of its files. With a
        ``reason`` (retention), the removed versions are recorded in
        ``.retention/<partition>.json`` *before* anything is deleted, so a reader that finds a
        pinned version missing can tell it was pruned. Manifests go first, so a partition is
        never left half-removed with a manifest naming missing versions.
        """
        report = RemovalReport(partition, [], [], 0, dry_run)
        with self.exclusive_partition(partition) as ok:
            if not ok:
                raise PartitionBusyError(
                    f"partition {partition} is in use by another process; nothing removed",
                    self.base_dir,
                )
            directories = [
                self.base_dir / asset / partition
                for asset in self.assets()
                if (self.base_dir / asset / partition).is_dir()
            ]
            in_memory = [
                d
                for directory in directories
                for d in self._version_dirs(directory.parent.name, partition)[1:]
            ]
            for directory in in_memory:
                for p in directory.iterdir():
                    if _TEMP_RE.fullmatch(p.name) or p.name.endswith(".npy"):
                        if locks.is_locked(p):
                            raise PartitionBusyError(
                                f"{p} is held by a live writer; partition {partition} not removed",
                                p,
                            )
                    with contextlib.suppress(FileNotFoundError):
                        report.bytes += p.stat().st_size
            for directory in directories:
                for p in directory.iterdir():
                    busy = (
                        _TEMP_RE.fullmatch(p.name) or p.name.endswith(".npy")
                    ) and locks.is_locked(p)
                    if busy:
                        raise PartitionBusyError(
                            f"{p} is held by a live writer; partition {partition} not removed", p
                        )
                report.assets.append(directory.parent.name)
                report.versions += self.versions(directory.parent.name, partition)
                for p in directory.iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        report.bytes += p.stat().st_size
            if dry_run or not directories:
                return report
            if reason is not None:
                self._record_removal(partition, reason, report.versions)
            for directory in directories:  # manifests first: nothing current names a gap
                _unlink_quiet(directory / MANIFEST_FILE)
                _fsync_dir(directory)
            for directory in in_memory + directories:
                for p in directory.iterdir():
                    _unlink_quiet(p)
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                _fsync_dir(directory.parent)
        return report

    def _record_removal(self, partition: str, reason: str, versions: list[VersionInfo]) -> None:
        retention_dir = self.base_dir / RETENTION_DIR
        _mkdir(retention_dir)
        path = retention_dir / f"{partition}.json"
        try:
            record = _read_json_file(path, "retention record") or {}
        except CorruptMatrixError:
            record = {}
        recorded: dict[str, dict[str, list[str]]] = record.get("versions") or {}
        for v in versions:
            names = recorded.setdefault(v.asset, {}).setdefault(v.name, [])
            if v.version not in names:
                names.append(v.version)
        _write_json_atomic(
            path,
            {
                "format": FORMAT_VERSION,
                "partition": partition,
                "pruned_at": _now_iso(),
                "reason": reason,
                "versions": recorded,
            },
        )
