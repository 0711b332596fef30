"""The watchdog: one small process per data directory that stops the server once no process has
used it for :data:`WATCHDOG_IDLE_SECONDS` (see :mod:`corr_pipeline.dbserver`)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.dbserver import owned_files
from corr_pipeline.dbserver.errors import DatabaseUnavailableError
from corr_pipeline.dbserver.locks import has_users, open_lock_file, start_lock
from corr_pipeline.dbserver.postmaster import (
    PidFile,
    postmaster_process,
    remove_socket_dir,
    stop_postmaster,
)

#: How long the watchdog lets a server run without any process using it.
WATCHDOG_IDLE_SECONDS = 10.0
WATCHDOG_POLL_SECONDS = 1.0
WATCHDOG_LOCK = "corr_pipeline.watchdog.lock"
WATCHDOG_LOG = "corr_pipeline.watchdog.log"


def ensure_watchdog(pgdata: Path) -> None:
    """Start the watchdog of ``pgdata`` unless one runs (it holds the watchdog lock)."""
    fd = open_lock_file(pgdata / WATCHDOG_LOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
    finally:
        os.close(fd)
    env = settings.child_environment(str(Path(__file__).resolve().parents[3]))
    with os.fdopen(owned_files.open_append(pgdata / WATCHDOG_LOG), "ab") as log:
        # The first process takes the lock, forks the watchdog and exits: when it has exited,
        # the watchdog holds the lock.
        subprocess.run(
            [sys.executable, "-m", "corr_pipeline.dbserver", "watch", str(pgdata)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            env=env,
            start_new_session=True,
            timeout=60,
            check=False,
        )


def watch(pgdata: Path) -> int:
    """The watchdog (``python -m corr_pipeline.dbserver watch PGDATA``): stops the server of
    ``pgdata`` once no process has used it for :data:`WATCHDOG_IDLE_SECONDS`; exits when the
    server is gone. Returns at once if another watchdog runs."""
    fd = open_lock_file(pgdata / WATCHDOG_LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    if os.fork() > 0:
        os._exit(0)  # the child keeps the lock (same open file)
    inode = os.stat(pgdata).st_ino
    idle_since: float | None = None
    while True:
        time.sleep(WATCHDOG_POLL_SECONDS)
        try:
            if os.stat(pgdata).st_ino != inode:
                return 0  # the data directory was replaced: not ours any more
            with start_lock(pgdata):
                pid_file = PidFile.read(pgdata)
                proc = postmaster_process(pgdata, pid_file)
                if pid_file is None or proc is None:
                    return 0  # stopped by its last user (or it crashed)
                if has_users(pgdata):
                    idle_since = None
                    continue
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                if now - idle_since < WATCHDOG_IDLE_SECONDS:
                    continue
                print(
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')} watchdog: no process has used the "
                    f"embedded PostgreSQL in {pgdata} for {WATCHDOG_IDLE_SECONDS:.0f} s; "
                    f"stopping it (pid {proc.pid})",
                    flush=True,
                )
                stop_postmaster(proc, pgdata, "no process uses it any more")
                remove_socket_dir(pid_file.socket_dir, pgdata)
                return 0
        except FileNotFoundError:
            return 0  # the data directory (or its parent) is gone
        except DatabaseUnavailableError:
            continue  # the start lock is busy for long: look again
