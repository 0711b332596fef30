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

Old versions stay on disk until :meth:`GarbageCollector.collect_garbage` finds that nothing
needs them: a version is deleted only when no current manifest of its partition names it (as an
array or as an input), the caller's ``pinned`` set (the versions recorded by published snapshots,
which the store does not read itself) does not name it, and no live writer holds it. Retention
removes whole partitions (:meth:`GarbageCollector.remove_partition`) and records what it removed
in ``.retention/`` (:meth:`MatrixStore.pruned` reads it back).

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
hand-off, reusing the committed file without a copy) or :meth:`Manifests.set_current` names it
in the manifest — the commit point. Until then its writer keeps the lock on the version file, so
garbage collection leaves it alone; once named, the manifest protects it. :meth:`MatrixStore.save`
does all of it for an in-memory array.

A step's large *working* array that is not a result (the clustering step's distances) can live
in the store too, out of anonymous memory: :meth:`MatrixStore.scratch` is the same locked temp
file, never committed, deleted when its ``with`` block ends, however it ends.

Any failure, exception or ``KeyboardInterrupt`` before the commit removes the temp files (and a
:class:`PendingArray` dropped without commit or abort removes its temp file when it is garbage
collected or the interpreter exits). A SIGKILL leaves a temp file whose lock died with its
writer: :meth:`StoreFiles.cleanup_stale_temps` (run by every :meth:`allocate` on its partition
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

import functools
import os
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from corr_pipeline.store.arrays import (
    BundleWriteReport,
    GarbageReport,
    MatrixBundle,
    RemovalReport,
    StoredArray,
    VersionInfo,
    sources,
)
from corr_pipeline.store.bundles import Bundles
from corr_pipeline.store.collection import GarbageCollector
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    InvalidStoreKeyError,
    MatrixNotFoundError,
    MatrixStoreError,
    MatrixStoreSpaceError,
    PartitionBusyError,
    VersionNotFoundError,
)
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    validate_asset_name,
    validate_name,
    validate_version,
)
from corr_pipeline.store.manifests import Manifests
from corr_pipeline.store.reading import VersionReader
from corr_pipeline.store.writing import PendingArray, VersionWriter

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
    "sources",
    "validate_asset_name",
    "validate_version",
]

Params = ParamSpec("Params")
Result = TypeVar("Result")


def delegate(
    part: str, method: Callable[Concatenate[Any, Params], Result]
) -> Callable[Concatenate[Any, Params], Result]:
    """A method of :class:`MatrixStore` that calls ``method`` (by its name) on the store's
    attribute ``part``, with ``method``'s signature and docstring."""

    @functools.wraps(method)
    def call(store: Any, *args: Params.args, **kwargs: Params.kwargs) -> Result:
        return getattr(getattr(store, part), method.__name__)(*args, **kwargs)

    return call


class MatrixStore:
    """Directory of versioned arrays, one sub-directory per asset and partition (SPEC §8).

    Stateless apart from ``base_dir``: any number of processes (and hosts sharing the directory)
    may open the same store. See the module docstring for the layout and the protocols.

    Its methods are what producers and consumers of arrays use; each is done by one of the
    parts the store is made of, public for what goes beyond them:

    * :attr:`files` (:class:`StoreFiles`): paths, partition holds, listings (assets,
      partitions, versions, bytes), stale temp files;
    * :attr:`manifests` (:class:`Manifests`): the current pointer of each partition;
    * :attr:`reader` (:class:`VersionReader`): a version checked and mapped;
    * :attr:`writer` (:class:`VersionWriter`): versions allocated, saved, linked;
    * :attr:`bundles` (:class:`Bundles`): a partition's arrays saved or loaded together;
    * :attr:`collector` (:class:`GarbageCollector`): garbage collection and the removal of
      partitions (retention).
    """

    def __init__(self, base_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        self.files = StoreFiles(base_dir, create=create)
        self.base_dir = self.files.base_dir
        self.manifests = Manifests(self.files)
        self.reader = VersionReader(self.files, self.manifests)
        self.writer = VersionWriter(self.files, self.manifests, self.reader)
        self.bundles = Bundles(self.files, self.manifests, self.reader, self.writer)
        self.collector = GarbageCollector(self.files, self.manifests)

    def __repr__(self) -> str:
        return f"MatrixStore({str(self.base_dir)!r})"

    allocate = delegate("writer", VersionWriter.allocate)
    scratch = delegate("writer", VersionWriter.scratch)
    save = delegate("writer", VersionWriter.save)
    save_bundle = delegate("bundles", Bundles.save_bundle)
    load_bundle = delegate("bundles", Bundles.load_bundle)
    load = delegate("reader", VersionReader.load)
    exists = delegate("manifests", Manifests.exists)
    hold_partition = delegate("files", StoreFiles.hold_partition)
    hold_existing_partition = delegate("files", StoreFiles.hold_existing_partition)
    pruned = delegate("collector", GarbageCollector.pruned)

    def has_version(self, asset: str, partition: str, name: str, version: str) -> bool:
        """True when that version's files are on disk."""
        return self.files.has_version(
            asset, partition, validate_name(name), validate_version(version)
        )
