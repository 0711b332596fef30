"""Garbage collection and retention (:class:`GarbageCollector`): what versions are needed,
collecting the others, removing whole partitions and recording it. The protocol is in
:mod:`corr_pipeline.store.matrix_store`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from corr_pipeline.store import locks
from corr_pipeline.store.arrays import (
    GarbageReport,
    RemovalReport,
    VersionInfo,
)
from corr_pipeline.store.durable import (
    fsync_dir,
    make_dir,
    read_json_file,
    unlink_quiet,
    write_json_atomic,
)
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    PartitionBusyError,
)
from corr_pipeline.store.files import StoreFiles
from corr_pipeline.store.layout import (
    FORMAT_VERSION,
    LEGACY_FILE_RE,
    MANIFEST_FILE,
    MANIFEST_LOCK,
    PARTITION_LOCK,
    RETENTION_DIR,
    TEMP_RE,
    now_iso,
    validate_partition,
)
from corr_pipeline.store.manifests import Manifests


class GarbageCollector:
    """Deletes what nothing needs from the directories of ``files`` (what a current manifest
    names is read through ``manifests``) and removes whole partitions for retention."""

    def __init__(self, files: StoreFiles, manifests: Manifests) -> None:
        self.files = files
        self.manifests = manifests

    @contextlib.contextmanager
    def exclusive_partition(self, partition: str, *, allow_upgrade: bool = False) -> Iterator[bool]:
        """Hold every ``<asset>/<partition>`` directory exclusively while the block runs, or
        nothing: yields False (holding nothing) when one is in use by another process (a Dagster
        step, a writer, retention elsewhere). ``allow_upgrade`` lets this process upgrade the
        shared holds it has itself (the partition a step is publishing). Never waits."""
        validate_partition(partition)
        held: list[locks.Hold] = []
        ok = True
        try:
            for asset in self.files.assets():
                directory = self.files.base_dir / asset / partition
                if not directory.is_dir():
                    continue
                h = self.files.hold(
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
        for directory in self.files.partition_dirs_of(partition):
            manifest = self.manifests.read(directory)  # CorruptMatrixError: the caller keeps all
            for name, entry in (manifest or {}).get("arrays", {}).items():
                add(directory.parent.name, name, str(entry.get("version")))
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
        keys = self.files.partition_keys() if partitions is None else list(partitions)
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
        for directory in self.files.partition_dirs_of(partition):
            asset = directory.parent.name
            live_temps: set[str] = set()
            for version_dir in self.files.version_dirs(asset, partition):
                report.temps_removed += self.files.cleanup_dir(version_dir, dry_run=dry_run)
                live_temps |= {
                    m["target"]
                    for p in version_dir.iterdir()
                    if (m := TEMP_RE.fullmatch(p.name)) and p.exists()
                }
            keep = needed.get(asset, {})
            touched: set[Path] = set()
            # files of the format-1 layout: no format-2 manifest or pin can name them
            for p in sorted(directory.iterdir()):
                if LEGACY_FILE_RE.fullmatch(p.name) and p.name not in (
                    PARTITION_LOCK,
                    MANIFEST_LOCK,
                ):
                    if dry_run or unlink_quiet(p):
                        report.legacy_removed.append(p)
                        if not dry_run:
                            touched.add(directory)
            for info in self.files.versions(asset, partition):
                if info.version in keep.get(info.name, ()):
                    continue
                npy = (info.directory or directory) / f"{info.name}.{info.version}.npy"
                side = npy.with_suffix(".json")
                if not npy.exists():
                    if npy.name in live_temps:  # its writer is still writing the data
                        report.kept_busy.append(info)
                        continue
                    if not dry_run:
                        unlink_quiet(side)
                        touched.add(npy.parent)
                    report.deleted.append(info)
                    continue
                with locks.probe(npy) as free:
                    if free is None:
                        continue
                    if not free:
                        report.kept_busy.append(info)  # committed, not yet in a manifest
                        continue
                    if not dry_run:
                        unlink_quiet(side)
                        unlink_quiet(npy)
                        touched.add(npy.parent)
                    report.deleted.append(info)
            for changed in touched:
                fsync_dir(changed)
        return report

    def pruned(self, partition: str) -> dict[str, Any] | None:
        """What retention removed from ``partition`` (``.retention/<partition>.json``: when,
        why, and ``versions`` ``{asset: {name: [versions]}}``), or None."""
        path = self.files.base_dir / RETENTION_DIR / f"{validate_partition(partition)}.json"
        try:
            return read_json_file(path, "retention record")
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
                    self.files.base_dir,
                )
            directories = self.files.partition_dirs_of(partition)
            in_memory = [
                d
                for directory in directories
                for d in self.files.version_dirs(directory.parent.name, partition)[1:]
            ]
            for directory in in_memory:
                for p in directory.iterdir():
                    if TEMP_RE.fullmatch(p.name) or p.name.endswith(".npy"):
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
                        TEMP_RE.fullmatch(p.name) or p.name.endswith(".npy")
                    ) and locks.is_locked(p)
                    if busy:
                        raise PartitionBusyError(
                            f"{p} is held by a live writer; partition {partition} not removed", p
                        )
                report.assets.append(directory.parent.name)
                report.versions += self.files.versions(directory.parent.name, partition)
                for p in directory.iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        report.bytes += p.stat().st_size
            if dry_run or not directories:
                return report
            if reason is not None:
                self._record_removal(partition, reason, report.versions)
            for directory in directories:  # manifests first: nothing current names a gap
                unlink_quiet(directory / MANIFEST_FILE)
                fsync_dir(directory)
            for directory in in_memory + directories:
                for p in directory.iterdir():
                    unlink_quiet(p)
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                fsync_dir(directory.parent)
        return report

    def _record_removal(self, partition: str, reason: str, versions: list[VersionInfo]) -> None:
        retention_dir = self.files.base_dir / RETENTION_DIR
        make_dir(retention_dir)
        path = retention_dir / f"{partition}.json"
        try:
            record = read_json_file(path, "retention record") or {}
        except CorruptMatrixError:
            record = {}
        recorded: dict[str, dict[str, list[str]]] = record.get("versions") or {}
        for v in versions:
            names = recorded.setdefault(v.asset, {}).setdefault(v.name, [])
            if v.version not in names:
                names.append(v.version)
        write_json_atomic(
            path,
            {
                "format": FORMAT_VERSION,
                "partition": partition,
                "pruned_at": now_iso(),
                "reason": reason,
                "versions": recorded,
            },
        )
