"""Durable file operations of the store: private directories and files, ``fsync``ed writes
and renames, JSON documents of the current format, temp files and disk-space errors."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import mmap
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from corr_pipeline.store import locks
from corr_pipeline.store.errors import (
    CorruptMatrixError,
    MatrixStoreError,
    MatrixStoreSpaceError,
)
from corr_pipeline.store.layout import (
    FORMAT_VERSION,
    validate_asset_name,
    validate_name,
    validate_version,
)

SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
MANIFEST_ATTEMPTS = 40
MANIFEST_SLEEP_S = 0.025
DIR_MODE = 0o700
FILE_MODE = 0o600


def jsonable(value: Any, where: str) -> Any:
    """Convert labels/params to plain JSON types (see module docstring)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        if isinstance(value, np.datetime64):
            return str(np.datetime_as_string(value))
        return jsonable(value.item(), where)
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "M":
            return [str(s) for s in np.datetime_as_string(value).ravel().tolist()]
        if value.dtype.kind == "O":
            return [jsonable(v, where) for v in value.tolist()]
        return jsonable(value.tolist(), where)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: JSON object keys must be str, got {k!r}")
            out[k] = jsonable(v, f"{where}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [jsonable(v, f"{where}[]") for v in value]
    raise TypeError(
        f"{where}: value of type {type(value).__name__} is not JSON-serialisable "
        "(use str, numbers, lists, dicts, dates or numpy arrays)"
    )


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: Path) -> bool:
    """Create one directory 0700 (exactly, whatever the umask) and fsync it into its parent;
    False if it existed."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(path, DIR_MODE)
    fsync_dir(path.parent)
    return True


def make_dirs(path: Path) -> None:
    """``mkdir -p`` where every directory created is 0700 and fsynced into its parent."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for directory in reversed(missing):
        make_dir(directory)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))


def advise_huge_pages(array: np.ndarray) -> None:
    """``madvise(MADV_HUGEPAGE)`` on a ``np.memmap``'s map; a no-op where unsupported."""
    mapped = getattr(array, "_mmap", None)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if mapped is not None and advice is not None:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(advice)


def unlink_quiet(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex}")


def create_temp(final: Path) -> tuple[Path, locks.FileLock]:
    """A new temp file for ``final``, 0600, exclusively locked by the caller."""
    for _ in range(8):
        temp = temp_path(final)
        try:
            return temp, locks.create_locked(temp, FILE_MODE)
        except FileNotFoundError:
            if not final.parent.is_dir():
                raise
            continue  # a cleaner raced us between create and lock: take another name
    raise MatrixStoreError(f"could not create a temp file next to {final}", final)


def space_or_io_error(action: str, path: Path, exc: OSError) -> MatrixStoreError:
    if exc.errno in SPACE_ERRNOS:
        return MatrixStoreSpaceError(
            f"out of disk space while {action} {path}: {exc.strerror or exc} "
            f"(errno {exc.errno}); the partial file was removed, the previous version is intact",
            path,
            exc.errno,
        )
    return MatrixStoreError(f"I/O error while {action} {path}: {exc}", path)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_json_atomic(
    final: Path, obj: Mapping[str, Any], *, sync_dir: bool = True, durable: bool = True
) -> None:
    """Write ``obj`` as JSON to ``final`` atomically: locked 0600 temp file, fsync, rename
    (then fsync of the directory). Temp file removed on any failure. ``durable`` False: no
    fsync at all (the rename still makes it appear whole; a power loss may lose it)."""
    data = json.dumps(obj, indent=1, sort_keys=True).encode("utf-8")
    temp, lock = create_temp(final)
    try:
        assert lock.fd is not None
        write_all(lock.fd, data)
        if durable:
            os.fsync(lock.fd)
        os.replace(temp, final)
    except BaseException:
        unlink_quiet(temp)
        raise
    finally:
        lock.release()
    if sync_dir and durable:
        fsync_dir(final.parent)


def read_json_file(path: Path, what: str) -> dict[str, Any] | None:
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


def dtype_descr(dtype: np.dtype) -> Any:
    return np.lib.format.dtype_to_descr(dtype)


def descr_to_dtype(descr: Any) -> np.dtype:
    # JSON turns the tuples of a structured descr into lists; descr_to_dtype wants tuples.
    def fix(d: Any) -> Any:
        if isinstance(d, list):
            return [tuple(fix(x) for x in item) if isinstance(item, list) else item for item in d]
        return d

    return np.lib.format.descr_to_dtype(fix(descr))


def check_inputs(inputs: Mapping[str, Mapping[str, str]], where: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for asset, arrays in inputs.items():
        validate_asset_name(asset)
        out[asset] = {}
        for name, version in arrays.items():
            out[asset][validate_name(name)] = validate_version(str(version))
    return out
