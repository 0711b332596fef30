"""The store's layout (see :mod:`corr_pipeline.store.matrix_store`): file names, the
validation of asset, partition, name and version keys, and new version ids."""

from __future__ import annotations

import datetime as _dt
import re
import secrets

from corr_pipeline.store.errors import (
    InvalidStoreKeyError,
)

FORMAT_VERSION = 2
"""Sidecar / manifest format written into every JSON file (``"format"``); format 1 (one
replaceable ``<name>.npy`` per array, identified by inode) is refused with a clear message."""

MANIFEST_FILE = "bundle.manifest.json"
PARTITION_LOCK = ".partition.lock"
MANIFEST_LOCK = ".manifest.lock"
RETENTION_DIR = ".retention"

ASSET_RE = re.compile(r"[A-Za-z0-9_]{1,200}")
NAME_RE = ASSET_RE
PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
VERSION_PATTERN = r"\d{8}T\d{12}Z-[0-9a-f]{8}"
VERSION_RE = re.compile(VERSION_PATTERN)
VERSION_FILE_RE = re.compile(
    rf"(?P<name>[A-Za-z0-9_]{{1,200}})\.(?P<version>{VERSION_PATTERN})\.(?P<kind>npy|json)"
)
TEMP_RE = re.compile(r"\.(?P<target>.+)\.tmp-(?P<uid>[0-9a-f]{32})")
#: Files of the format-1 layout (one replaceable ``<name>.npy`` + ``<name>.json`` per array,
#: ``.<name>.lock`` / ``.bundle.writer.lock`` / ``.bundle.lock`` commit locks).
LEGACY_FILE_RE = re.compile(
    r"[A-Za-z0-9_]{1,200}\.(npy|json)|\.(?:[A-Za-z0-9_]{1,200}|bundle\.writer|bundle)\.lock"
)


def validate_asset_name(asset: str) -> str:
    """``asset`` if it is a valid asset directory name (``^[A-Za-z0-9_]+$``, 1-200 characters);
    :class:`InvalidStoreKeyError` otherwise."""
    if not isinstance(asset, str) or not ASSET_RE.fullmatch(asset):
        raise InvalidStoreKeyError(
            f"invalid asset name {asset!r}: must match ^[A-Za-z0-9_]+$ (1-200 chars)"
        )
    return asset


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidStoreKeyError(
            f"invalid array name {name!r}: must match ^[A-Za-z0-9_]+$ (1-200 chars)"
        )
    return name


def validate_partition(partition: str) -> str:
    if not isinstance(partition, str) or not PARTITION_RE.fullmatch(partition) or ".." in partition:
        raise InvalidStoreKeyError(
            f"invalid partition key {partition!r}: must match ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ "
            "(e.g. an ISO date 2024-03-28), at most 200 chars, without '..'"
        )
    return partition


def validate_version(version: str) -> str:
    """``version`` if it is a version id of this store (``YYYYMMDDTHHMMSSffffffZ-<8 hex>``);
    :class:`InvalidStoreKeyError` otherwise."""
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise InvalidStoreKeyError(
            f"invalid version {version!r}: expected YYYYMMDDTHHMMSSffffffZ-<8 hex digits>"
        )
    return version


def new_version() -> str:
    """A fresh version id: UTC time of now to the microsecond, then 32 random bits."""
    now = _dt.datetime.now(_dt.UTC)
    return f"{now.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(4)}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
