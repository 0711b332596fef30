"""File locks of the matrix store: who is writing, who is using a partition.

Every lock is a whole-file lock on an open file *description* (``fcntl``):

* on Linux, open-file-description locks (``F_OFD_SETLK``, Linux 3.15+): POSIX record locks,
  so an NFS server arbitrates them between hosts, but owned by the open file description like
  ``flock`` locks, so two descriptions conflict even inside one process and closing another
  descriptor of the same file never drops them, and a shared lock upgrades to an exclusive one
  atomically;
* elsewhere, ``flock`` (same ownership rules; upgrades are not atomic there).

A lock dies with its holder: the kernel releases it when the last descriptor of the
description is closed, so a SIGKILLed or crashed writer never leaves a lock behind. That is how
the store decides that a writer is gone (:func:`is_locked`) without looking at process ids,
which mean nothing on a store shared by several hosts.

Two kinds of locks are used (see :mod:`corr_pipeline.store.matrix_store`):

* the writer of a temp file, and then of the version it becomes, holds a (shared) lock on
  that very file (:class:`FileLock`) until the version is named by a manifest (or abandoned);
  cleaners probe with an exclusive lock, so they see every holder;
* users of a partition directory hold a shared lock on its ``.partition.lock``, through the
  per-process registry :func:`hold` (one description per path and process, reference counted,
  so nested holders of one process share it and can upgrade it); retention and garbage
  collection take it exclusively, without waiting, and leave a busy partition alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FileLock",
    "Hold",
    "create_locked",
    "hold",
    "is_locked",
    "lock_fd",
    "probe",
    "unlock_fd",
]

#: struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (+ padding).
_FLOCK = "hhqqi4x"
_OFD = (
    sys.platform.startswith("linux")
    and hasattr(fcntl, "F_OFD_SETLK")
    and struct.calcsize("P") == 8
    and struct.calcsize(_FLOCK) == 32
)
_BUSY = {errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK}


def lock_fd(fd: int, *, exclusive: bool, blocking: bool) -> bool:
    """Lock the whole file open as ``fd`` (shared or exclusive); False when ``blocking`` is
    False and another description holds a conflicting lock. A shared lock needs ``fd`` open for
    reading, an exclusive one for writing."""
    try:
        if _OFD:
            kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
            command = fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK
            fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0))
        else:  # pragma: no cover - non-Linux
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
    except OSError as exc:
        if not blocking and exc.errno in _BUSY:
            return False
        raise
    return True


def unlock_fd(fd: int) -> None:
    """Release this description's lock on ``fd`` (closing the last descriptor does too)."""
    if _OFD:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))
    else:  # pragma: no cover - non-Linux
        fcntl.flock(fd, fcntl.LOCK_UN)


class FileLock:
    """A lock on one file, held through its own descriptor until :meth:`release`
    (or garbage collection of this object, or the end of the process)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # pragma: no cover - depends on the garbage collector
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"FileLock({self.path}, {'held' if self.held else 'released'})"


def create_locked(path: Path, mode: int = 0o600) -> FileLock:
    """Create ``path`` (it must not exist), locked (shared) by the returned :class:`FileLock`,
    with exactly ``mode`` whatever the umask. A writer's lock is shared so that a hard link of
    a version (same inode) can be locked by its own writer too; the probes of
    :func:`is_locked` are exclusive, so any holder counts.

    Creating and locking are two system calls; a cleaner that deletes unlocked temp files could
    run in between. So after locking, the name must still lead to the locked file (else it was
    deleted meanwhile): ``FileExistsError`` is never expected (names are random), and a lost
    race raises ``FileNotFoundError`` for the caller to retry with a new name.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        lock_fd(fd, exclusive=False, blocking=True)
        st = os.fstat(fd)
        try:
            same = os.stat(path).st_ino == st.st_ino and st.st_nlink > 0
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(errno.ENOENT, "removed while being locked", str(path))
    except BaseException:
        os.close(fd)
        raise
    return FileLock(fd, path)


@contextlib.contextmanager
def probe(path: Path) -> Iterator[bool | None]:
    """An exclusive probe lock on ``path``, taken without waiting and held for the ``with``
    block: yields True when taken (no description holds a lock on the file: its writer is
    gone), False when another description holds one, None when the file does not exist. A
    description of *this* process counts like any other.

    A cleaner deletes the file inside the block: a writer that locks the file just after the
    probe finds the name gone and takes another one."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        yield lock_fd(fd, exclusive=True, blocking=False)
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool | None:
    """Whether some description holds a lock on ``path`` (None: the file does not exist);
    the :func:`probe` lock is released at once."""
    with probe(path) as free:
        return None if free is None else not free


# --------------------------------------------------------------------------------------------
# per-process registry of partition locks
# --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    fd: int
    shared: int = 0
    exclusive: int = 0


_registry: dict[str, _Entry] = {}
_mutex = threading.RLock()


class Hold:
    """One holder's share of a registry lock (:func:`hold`); :meth:`release` it once."""

    def __init__(self, path: str, exclusive: bool) -> None:
        self.path = path
        self.exclusive = exclusive
        self._released = False

    def release(self) -> None:
        with _mutex:
            if self._released:
                return
            self._released = True
            entry = _registry.get(self.path)
            if entry is None:  # pragma: no cover - defensive
                return
            if self.exclusive:
                entry.exclusive -= 1
            else:
                entry.shared -= 1
            if entry.exclusive == 0 and entry.shared == 0:
                del _registry[self.path]
                os.close(entry.fd)
            elif entry.exclusive == 0 and self.exclusive:
                lock_fd(entry.fd, exclusive=False, blocking=True)  # downgrade: never waits

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Hold({self.path}, {'exclusive' if self.exclusive else 'shared'})"


def _open_lock_file(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:  # pragma: no cover - a lock file created by another user of a shared store
        pass
    return fd


def hold(
    path: Path, *, exclusive: bool, blocking: bool, allow_upgrade: bool = False
) -> Hold | None:
    """Take a shared or exclusive share of the lock file ``path`` (created if missing, in an
    existing directory); None when it is busy and ``blocking`` is False.

    Shares of one process on one path use one open file description: shared holders stack; an
    exclusive request of a process that already holds the lock shared is refused (busy) unless
    ``allow_upgrade``, in which case the description is upgraded atomically (if no other process
    holds it) and downgraded again when the exclusive share is released. Exclusive requests
    never wait when the process already holds the lock.

    The lock file's directory may be removed by an exclusive holder (retention); a lock taken
    on a file that is no longer at ``path`` is dropped and taken again on a new file, and
    ``FileNotFoundError`` is raised when the directory itself is gone (the caller re-creates it
    and asks again).
    """
    key = os.fspath(path)
    # The handle exists before the registry counts it, and counting it is the last step before
    # it is returned: a KeyboardInterrupt (Ctrl-C) between the two would leave a share no
    # handle can release, and the process itself would then find its partition busy.
    handle = Hold(key, exclusive)
    with _mutex:
        entry = _registry.get(key)
        if entry is not None:
            if not exclusive:
                entry.shared += 1
                return handle
            if entry.exclusive:
                entry.exclusive += 1
                return handle
            if not allow_upgrade or not lock_fd(entry.fd, exclusive=True, blocking=False):
                return None
            entry.exclusive += 1
            return handle
        while True:
            fd = _open_lock_file(key)
            try:
                if not lock_fd(fd, exclusive=exclusive, blocking=blocking):
                    os.close(fd)
                    return None
                try:
                    same = os.stat(key).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                break
            os.close(fd)  # the file was removed (with its directory) while we waited
        _registry[key] = _Entry(fd, shared=0 if exclusive else 1, exclusive=1 if exclusive else 0)
        return handle


def held_by_this_process(path: Path) -> bool:
    """Whether this process holds a share of the registry lock ``path``."""
    with _mutex:
        return os.fspath(path) in _registry
