"""The matrix store's errors: each names the file concerned (``.path``)."""

from __future__ import annotations

import os
from pathlib import Path


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
