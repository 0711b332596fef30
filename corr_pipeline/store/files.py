"""The store's files (:class:`StoreFiles`): where a key's directory and version files are, the
partition holds, what the store holds (assets, partitions, versions, bytes), and the removal of
temp files whose writer is gone. The layout is in :mod:`corr_pipeline.store.matrix_store`."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from corr_pipeline.store import locks, memory
from corr_pipeline.store.arrays import VersionInfo
from corr_pipeline.store.durable import make_dir, make_dirs, unlink_quiet
from corr_pipeline.store.errors import InvalidStoreKeyError, MatrixStoreError
from corr_pipeline.store.layout import (
    ASSET_RE,
    PARTITION_LOCK,
    PARTITION_RE,
    TEMP_RE,
    VERSION_FILE_RE,
    validate_asset_name,
    validate_name,
    validate_partition,
    validate_version,
)


class StoreFiles:
    """The directories and files under ``base_dir``: paths checked to stay inside it, the
    ``fcntl`` partition holds (:mod:`corr_pipeline.store.locks`), listings, stale temp files.

    It reads no manifest and writes no version: the other parts of the store do, through it.
    """

    def __init__(self, base_dir: str | os.PathLike[str], *, create: bool = True) -> None:
        base = Path(base_dir).expanduser()
        if create:
            make_dirs(base.absolute())
        elif not base.is_dir():
            raise MatrixStoreError(f"matrix store directory {base} does not exist", base)
        self.base_dir = base.resolve()

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

    def version_dirs(self, asset: str, partition: str) -> list[Path]:
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

    def has_version(self, asset: str, partition: str, name: str, version: str) -> bool:
        """True when both files of that version (array and sidecar) are in one of its
        directories; ``name`` and ``version`` are taken as they are (the caller checked them)."""
        return any(
            (directory / f"{name}.{version}.npy").is_file()
            and (directory / f"{name}.{version}.json").is_file()
            for directory in self.version_dirs(asset, partition)
        )

    def hold(
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

    def share(self, directory: Path) -> locks.Hold:
        """A shared hold on ``directory`` (created if missing), waiting for an exclusive holder
        (retention, garbage collection) to finish."""
        held = self.hold(directory, exclusive=False, blocking=True, create=True)
        assert held is not None
        return held

    def hold_partition(self, asset: str, partition: str) -> locks.Hold:
        """A shared hold on ``<asset>/<partition>`` (created if missing) for as long as the caller
        uses it: retention and garbage collection leave the partition alone meanwhile. Call
        ``.release()`` when done (the Dagster resources hold it for a step)."""
        return self.share(self.partition_dir(asset, partition))

    def hold_existing_partition(self, asset: str, partition: str) -> locks.Hold | None:
        """Like :meth:`hold_partition`, but None (nothing created) when ``<asset>/<partition>``
        does not exist, e.g. after retention removed it."""
        return self.hold(
            self.partition_dir(asset, partition), exclusive=False, blocking=True, create=False
        )

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

    def partition_dirs_of(self, partition: str) -> list[Path]:
        """``<base>/<asset>/<partition>`` of every asset that has ``partition`` (in asset order)."""
        validate_partition(partition)
        return [
            self.base_dir / asset / partition
            for asset in self.assets()
            if (self.base_dir / asset / partition).is_dir()
        ]

    def versions(self, asset: str, partition: str) -> list[VersionInfo]:
        """The versions in ``<asset>/<partition>`` and its memory area (oldest first), current
        or not."""
        found: dict[tuple[str, str], list[Path]] = {}
        for directory in self.version_dirs(asset, partition):
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
        usage: dict[str, int] = {}
        for directory in self.partition_dirs_of(partition):
            total = 0
            for p in directory.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    total += p.stat().st_size
            usage[directory.parent.name] = total
        return usage

    def cleanup_stale_temps(
        self, *, asset: str | None = None, partition: str | None = None
    ) -> list[Path]:
        """Delete temp files whose writer is gone; returns the paths removed.

        Scans the whole store, or only ``asset`` (and ``partition``) when given.
        Every allocation runs it on its own partition directory, so a re-materialization after
        a crash removes the crashed attempt's leftovers. A temp file is stale when no open file
        description holds a lock on it: its writer (on this host or another one sharing the
        store) released it or died. A live writer's temp file is never removed, however old.
        """
        if partition is not None and asset is None:
            raise ValueError("cleanup_stale_temps: partition given without asset")
        removed: list[Path] = []
        for part_dir in self._partition_dirs(asset, partition):
            removed += self.cleanup_dir(part_dir)
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
                out += self.version_dirs(asset_dir.name, key)
        return [p for p in out if p.is_dir()]

    def cleanup_dir(self, part_dir: Path, *, dry_run: bool = False) -> list[Path]:
        """Delete the temp files of ``part_dir`` that no writer holds locked (``dry_run``: only
        list them); returns their paths."""
        removed: list[Path] = []
        try:
            entries = sorted(part_dir.iterdir())
        except FileNotFoundError:
            return removed
        for p in entries:
            if not TEMP_RE.fullmatch(p.name):
                continue
            with locks.probe(p) as free:  # held while unlinking
                if free and (dry_run or unlink_quiet(p)):
                    removed.append(p)
        return removed
