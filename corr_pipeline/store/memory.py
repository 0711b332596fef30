"""The store's memory area: where the versions of sessions that retention will not keep live.

A backfill computes many sessions whose matrices retention removes as soon as they are
published (SPEC §8: only the newest ``keep_matrices`` sessions keep them). Their ``corr`` and
``overlap`` versions are written to a memory file system instead of the store's disk, so a
10-year backfill writes to disk only the matrices it keeps::

    <memory dir>/corr_pipeline-<uid>/            0700, owned by the user (checked, never followed)
      <store id>/<asset>/<partition>/            store id: the first 16 hex digits of the
        <name>.<version>.npy / .json             SHA-256 of the store's absolute path

The memory dir is :func:`corr_pipeline.settings.memory_dir` (``/dev/shm`` when it is a
``tmpfs``). The user's directory sits in a world-writable directory, so it is used only when
it is a real directory (not a symbolic link) owned by the user with no access for anyone
else; otherwise there is no memory area and every version goes to disk. Its pages are shared
memory (``RssShmem``, counted like the page cache of the same matrices on disk by
:mod:`corr_pipeline.snapshot.sizing`); a reboot empties it, which only loses matrices that
retention would have removed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from corr_pipeline import settings

__all__ = ["area_budget_bytes", "free_bytes", "has_room", "store_area"]

#: What the memory file system keeps free beyond a version it takes.
_MARGIN = 256 * 2**20
_CGROUP = Path("/sys/fs/cgroup")


def _private_dir(path: Path, *, create: bool) -> bool:
    """Whether ``path`` is a directory of this user that nobody else may enter (made 0700 when
    missing and ``create``); never follows a symbolic link."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and stat.S_IMODE(info.st_mode) & 0o077 == 0
    )


def _user_dir_name() -> str:
    return f"corr_pipeline-{os.geteuid()}"


def store_area(base_dir: Path, *, create: bool = False) -> Path | None:
    """The memory area of the store at ``base_dir`` (module docstring), or None when there is no
    usable one (``create``: make the directories that are missing)."""
    root = settings.memory_dir()
    if root is None or not root.is_dir():
        return None
    user_dir = root / _user_dir_name()
    if not _private_dir(user_dir, create=create):
        return None
    area = user_dir / hashlib.sha256(os.fsencode(base_dir)).hexdigest()[:16]
    if not _private_dir(area, create=create):
        return None
    return area


def free_bytes(area: Path) -> int:
    """Bytes the memory file system of ``area`` can still take."""
    info = os.statvfs(area)
    return info.f_bavail * info.f_frsize


def _meminfo() -> tuple[int, int]:
    """``(MemTotal, MemAvailable)`` in bytes, the cgroup's limit and headroom where lower."""
    values: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            values[name] = int(rest.split()[0]) * 1024
    total, available = values["MemTotal"], values.get("MemAvailable", values["MemFree"])
    try:
        limit = _CGROUP.joinpath("memory.max").read_text().strip()
        used = int(_CGROUP.joinpath("memory.current").read_text().strip())
    except (OSError, ValueError):
        return total, available
    if limit.isdigit() and int(limit) < total:
        total, available = int(limit), min(available, int(limit) - used)
    return total, available


def _used_bytes(area: Path) -> int:
    """Bytes the memory file system of ``area`` holds (every user's: an upper bound of this
    store's, found without walking its files)."""
    info = os.statvfs(area)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


#: The share of the machine's (or cgroup's) memory the user's memory area may hold: a run keeps
#: at most two sessions' matrices there, and the clusters' scratch distances (at N = 24,000:
#: 2 x 3.46 GB + 2.3 GB of 24 GiB).
AREA_SHARE = 2
#: The share of the memory that must stay available once a version is in the area (pages in
#: the area cannot be evicted; the kept sessions' matrices on disk go through the page cache).
AVAILABLE_SHARE = 4


def area_budget_bytes() -> int:
    """The most the user's memory area may hold: ``1 / AREA_SHARE`` of the machine's (or its
    cgroup's) memory."""
    return _meminfo()[0] // AREA_SHARE


def has_room(area: Path, nbytes: int) -> bool:
    """Whether ``nbytes`` more in ``area`` (a directory of the memory area) fit the memory
    area's budget: its memory file system holds at most ``1 / AREA_SHARE`` of the machine's
    (or its cgroup's) memory, and ``1 / AVAILABLE_SHARE`` of the memory stays available after
    it."""
    if free_bytes(area) < nbytes + _MARGIN:
        return False
    try:
        total, available = _meminfo()
    except (OSError, ValueError, KeyError):
        return False
    if available - nbytes < total // AVAILABLE_SHARE:
        return False
    return _used_bytes(area) + nbytes <= total // AREA_SHARE
