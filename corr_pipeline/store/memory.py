"""The store's memory area: where the versions of sessions that retention will not keep live.

A backfill computes many sessions whose matrices retention removes as soon as they are
published (SPEC §8: only the newest ``keep_matrices`` sessions keep them). Their ``corr`` and
``overlap`` versions are written to a memory file system instead of the store's disk, so a
10-year backfill writes to disk only the matrices it keeps::

    <memory dir>/corr_pipeline-<uid>-<random>/   the store's area: 0700, the user's, made by
      <asset>/<partition>/                       mkdtemp (a name no one else can guess or take
        <name>.<version>.npy / .json             first), checked before every use
    <store>/.memory_areas/<key>.json             where it is: one record per memory file system
                                                 (key: the machine's boot and the file system)

The memory dir is :func:`corr_pipeline.settings.memory_dir` (``/dev/shm`` when it is a
``tmpfs``). It is shared with other users, so it is used only when others cannot remove or
rename what the user puts in it (owned by root or the user; if others may write it, with the
sticky bit), and the area only when it is a real directory (not a symbolic link) of the user
with no access for anyone else. Every process that uses the store on this machine finds the
area through the record (in the store, the user's private directory); each machine, and each
pod with its own ``/dev/shm``, has its own. When there is no usable area every version goes to
disk, and a warning names the cause. Its pages are shared memory (``RssShmem``, counted like the
page cache of the same matrices on disk by :mod:`corr_pipeline.snapshot.sizing`); a reboot
empties it, which only loses matrices that retention would have removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import tempfile
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.store import locks
from corr_pipeline.store.durable import make_dir, read_json_file, write_json_atomic
from corr_pipeline.store.errors import CorruptMatrixError
from corr_pipeline.store.layout import FORMAT_VERSION

__all__ = ["RECORDS_DIR", "area_budget_bytes", "free_bytes", "has_room", "store_area"]

#: What the memory file system keeps free beyond a version it takes.
_MARGIN = 256 * 2**20
_CGROUP = Path("/sys/fs/cgroup")
#: The store's directory of records (not an asset name: the store's listings skip it).
RECORDS_DIR = ".memory_areas"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_LOG = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        _LOG.warning("%s", message)


def _area_prefix() -> str:
    return f"corr_pipeline-{os.geteuid()}-"


def _root_problem(root: Path) -> str | None:
    """Why the memory dir ``root`` cannot hold the user's area, or None: it must be a directory
    owned by root or the user, and one others may write must have the sticky bit (else they
    could rename the area and put their own in its place)."""
    try:
        st = os.stat(root)
    except OSError as exc:
        return f"{root}: {exc.strerror}"
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"{root} belongs to uid {st.st_uid} (mode {mode:04o})"
    if mode & 0o022 and not mode & stat.S_ISVTX:
        return f"{root} may be written by others and has no sticky bit (mode {mode:04o})"
    return None


def _area_problem(path: Path) -> str | None:
    """Why ``path`` is not a directory of this user that nobody else may enter, or None; never
    follows a symbolic link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid} (mode {mode:04o})"
    if mode & 0o077:
        return f"{path} is open to others (mode {mode:04o})"
    return None


def _record_path(base_dir: Path, root: Path) -> Path:
    """The record of the store at ``base_dir`` for the memory file system at ``root``: keyed
    by this boot of the machine and the file system's device (each pod's ``/dev/shm`` has its
    own)."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    key = f"{boot}\0{os.stat(root).st_dev}\0{root}"
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    return base_dir / RECORDS_DIR / f"{name}.json"


def _recorded(record: Path, root: Path) -> Path | None:
    """The area ``record`` names, when it names one of this user's in ``root``."""
    try:
        data = read_json_file(record, "memory area record")
    except (CorruptMatrixError, OSError):
        return None
    raw = data.get("path") if data else None
    if not isinstance(raw, str):
        return None
    path = Path(raw)
    pattern = re.escape(_area_prefix()) + r"[A-Za-z0-9_]+"
    if path.parent != root or not re.fullmatch(pattern, path.name):
        return None
    return path


def _new_area(base_dir: Path, root: Path, record: Path) -> Path | None:
    """The recorded area, or a new one (mkdtemp: 0700, a random name) recorded for every
    process of the store, under the record directory's lock; None (with a warning) when none
    can be made."""
    make_dir(base_dir / RECORDS_DIR)
    fd = os.open(base_dir / RECORDS_DIR / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        locks.lock_fd(fd, exclusive=True, blocking=True)
        area = _recorded(record, root)
        if area is not None:
            problem = _area_problem(area)
            if problem is None:
                return area
            if area.exists():
                _warn_once(f"the store's memory area {problem}: not used; a new one is made")
        try:
            area = Path(tempfile.mkdtemp(prefix=_area_prefix(), dir=root))
        except OSError as exc:
            _warn_once(
                f"no memory area in {root} ({exc.strerror}): every matrix goes to disk; "
                f"set {settings.ENV_MEMORY_DIR} to a memory file system you may write, or off"
            )
            return None
        try:
            write_json_atomic(record, {"format": FORMAT_VERSION, "path": str(area)})
        except BaseException:
            os.rmdir(area)
            raise
        return area
    finally:
        os.close(fd)


def store_area(base_dir: Path, *, create: bool = False) -> Path | None:
    """The memory area of the store at ``base_dir`` (module docstring), or None when there is no
    usable one (``create``: make it when missing; a warning names what keeps it from use)."""
    root = settings.memory_dir()
    if root is None:
        return None
    problem = _root_problem(root)
    if problem is not None:
        if create:
            _warn_once(
                f"no memory area: {problem}: every matrix goes to disk; set "
                f"{settings.ENV_MEMORY_DIR} to a memory file system that is not, or off"
            )
        return None
    record = _record_path(base_dir, root)
    area = _recorded(record, root)
    if area is not None and _area_problem(area) is None:
        return area
    if not create:
        return None
    try:
        return _new_area(base_dir, root, record)
    except OSError as exc:
        _warn_once(f"no memory area for the store {base_dir} ({exc}): every matrix goes to disk")
        return None


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
