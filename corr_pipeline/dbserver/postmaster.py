"""The postmaster of a data directory: recognising it (``postmaster.pid`` and its process),
clearing a stale ``postmaster.pid``, starting and stopping it."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from corr_pipeline import settings
from corr_pipeline.dbserver import owned_files
from corr_pipeline.dbserver.accounts import Account, last_line, run_as
from corr_pipeline.dbserver.datadir import SECURITY_SETTINGS
from corr_pipeline.dbserver.directories import (
    SOCKET_PORT,
    SOCKET_ROOT_PREFIX,
    private_dir_problem,
    socket_dir_for,
)
from corr_pipeline.dbserver.errors import DatabaseUnavailableError
from corr_pipeline.dbserver.locks import alive, has_users, is_live_postgres, legacy_users

logger = logging.getLogger(__name__)

#: Waits for ``pg_ctl start`` and for a stop.
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 60.0
#: How long start-up waits for the processes of a crashed server to leave its shared memory.
ORPHAN_WAIT_SECONDS = 15.0


@dataclass(frozen=True)
class PidFile:
    """``pgdata/postmaster.pid`` as PostgreSQL writes it (lines appear as start-up proceeds)."""

    pid: int | None
    start_time: int | None
    port: int | None
    socket_dir: Path | None
    listen: str
    shm_id: int | None
    status: str

    @classmethod
    def read(cls, pgdata: Path) -> PidFile | None:
        try:
            lines = owned_files.read_text(pgdata / "postmaster.pid", "replace").splitlines()
        except FileNotFoundError:
            return None
        lines += [""] * (8 - len(lines))

        def number(text: str) -> int | None:
            text = text.strip()
            return int(text) if text.isdigit() else None

        shm = lines[6].split()
        return cls(
            pid=number(lines[0]),
            start_time=number(lines[2]),
            port=number(lines[3]),
            socket_dir=Path(lines[4].strip()) if lines[4].strip() else None,
            listen=lines[5].strip(),
            shm_id=number(shm[1]) if len(shm) == 2 else None,
            status=lines[7].strip(),
        )


def postmaster_process(pgdata: Path, pid_file: PidFile | None = None) -> psutil.Process | None:
    """The live postmaster serving ``pgdata``, or None: the pid of ``postmaster.pid`` must be a
    live ``postgres`` process whose working directory is ``pgdata`` (where that cannot be read,
    whose start time is the one recorded). A pid reused by another process does not count."""
    pid_file = pid_file or PidFile.read(pgdata)
    if pid_file is None or pid_file.pid is None:
        return None
    try:
        proc = psutil.Process(pid_file.pid)
        if proc.status() == psutil.STATUS_ZOMBIE or proc.name() != "postgres":
            return None
        try:
            return proc if os.path.samefile(proc.cwd(), pgdata) else None
        except psutil.AccessDenied:
            started = pid_file.start_time
            return proc if started is not None and abs(proc.create_time() - started) <= 2 else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return None


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # exited; its parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def wait_gone(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_postmaster(proc: psutil.Process, pgdata: Path, why: str) -> None:
    """Fast shutdown (SIGINT: sessions are ended, transactions rolled back, a checkpoint
    written); immediate shutdown, then SIGKILL, if it does not finish in time."""
    logger.info("stopping the embedded PostgreSQL in %s (pid %s): %s", pgdata, proc.pid, why)
    for sig, wait in (
        (signal.SIGINT, STOP_TIMEOUT_SECONDS),
        (signal.SIGQUIT, 10.0),
        (signal.SIGKILL, 10.0),
    ):
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            return
        if wait_gone(proc, wait):
            return
    logger.warning("the embedded PostgreSQL in %s (pid %s) did not stop", pgdata, proc.pid)


def remove_socket_dir(socket_dir: Path | None, pgdata: Path) -> None:
    """Remove a socket directory of ours once its server is gone, and its parent (the data
    directory's own ``corr_pipeline-<uid>-<secret>``), each only if empty."""
    if socket_dir is None or socket_dir == pgdata:
        return
    if not socket_dir.parent.name.startswith(SOCKET_ROOT_PREFIX):
        return
    with contextlib.suppress(OSError):
        socket_dir.rmdir()
        socket_dir.parent.rmdir()


def _shm_attached(shm_id: int) -> int:
    """Processes attached to System V shared memory segment ``shm_id`` (Linux; 0 elsewhere)."""
    try:
        text = Path("/proc/sysvipc/shm").read_text()
    except OSError:
        return 0
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 6 and fields[1] == str(shm_id):
            return int(fields[6])
    return 0


def _clear_stale_pid_file(pgdata: Path, pid_file: PidFile, account: Account) -> None:
    """``postmaster.pid`` names no live postmaster of ``pgdata``.

    PostgreSQL refuses to start while the pid in ``postmaster.pid``, or in the socket's lock
    file, exists ("lock file ... already exists"): another process now has it, or it is the
    crashed postmaster as a zombie its parent has not reaped (common in containers whose init
    does not reap). A pid that no longer exists is left to PostgreSQL, which then checks the old
    shared memory itself. Otherwise, once no process of the crashed server is attached to its
    shared memory any more (checked on Linux), ``postmaster.pid`` is removed. The socket and its
    lock file in our private socket directory are removed unless a live postgres holds them.
    """
    if pid_file.pid is None or psutil.pid_exists(pid_file.pid):
        if pid_file.shm_id is not None:
            deadline = time.monotonic() + ORPHAN_WAIT_SECONDS
            while (attached := _shm_attached(pid_file.shm_id)) > 0:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailableError(
                        f"the embedded PostgreSQL in {pgdata} stopped without cleaning up, and "
                        f"{attached} process(es) are still attached to its shared memory (System "
                        f"V segment {pid_file.shm_id}; `ipcs -m -p` lists them): end them, then "
                        "run again"
                    )
                time.sleep(0.2)
        if pid_file.pid is None:
            why = "it names no process"
        elif alive(pid_file.pid):
            why = f"pid {pid_file.pid} is now another process"
        else:
            why = f"pid {pid_file.pid} has exited but was not reaped by its parent"
        logger.warning(
            "embedded PostgreSQL: removing the stale %s: %s", pgdata / "postmaster.pid", why
        )
        with contextlib.suppress(FileNotFoundError):
            (pgdata / "postmaster.pid").unlink()
    socket_dir, port = pid_file.socket_dir, pid_file.port or SOCKET_PORT
    if socket_dir is None or private_dir_problem(socket_dir, account.uid) is not None:
        return
    lock = socket_dir / f".s.PGSQL.{port}.lock"
    try:
        owner = owned_files.read_text(lock, "replace").split("\n", 1)[0].strip()
    except OSError:
        return
    if not (owner.isdigit() and is_live_postgres(int(owner))):
        for stale in (lock, socket_dir / f".s.PGSQL.{port}"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def _socket_problem(pid_file: PidFile, account: Account) -> str | None:
    """Why the running server cannot be used as it is, or None (it is private)."""
    if pid_file.listen:
        return f"listens on TCP ({pid_file.listen})"
    if pid_file.socket_dir is None or pid_file.port is None:
        return "has no Unix socket"
    problem = private_dir_problem(pid_file.socket_dir, account.uid)
    if problem is not None:
        return f"has its socket in {pid_file.socket_dir}, {problem}"
    if not (pid_file.socket_dir / f".s.PGSQL.{pid_file.port}").exists():
        return f"has lost its socket {pid_file.socket_dir}/.s.PGSQL.{pid_file.port}"
    return None


def running_server(pgdata: Path, account: Account) -> PidFile | None:
    """The ready, private server of ``pgdata`` if one runs. Waits for one starting or stopping;
    clears a stale ``postmaster.pid``; stops a server without users that is not private (started
    by an older version) and returns None; refuses one that is in use."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        pid_file = PidFile.read(pgdata)
        if pid_file is None:
            return None
        proc = postmaster_process(pgdata, pid_file)
        if proc is None:
            _clear_stale_pid_file(pgdata, pid_file, account)
            return None
        if pid_file.status == "ready":
            break
        if time.monotonic() > deadline:
            raise DatabaseUnavailableError(
                f"the embedded PostgreSQL in {pgdata} (pid {proc.pid}) has been "
                f"'{pid_file.status or 'starting'}' for {START_TIMEOUT_SECONDS} s: see "
                f"{pgdata / 'log'}; if it hangs, stop it (`kill -INT {proc.pid}`) and run again"
            )
        time.sleep(0.2)
    problem = _socket_problem(pid_file, account)
    if problem is None:
        return pid_file
    users = (["corr_pipeline processes"] if has_users(pgdata) else []) + [
        f"pid {pid}" for pid in legacy_users(pgdata)
    ]
    if users:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL in {pgdata} (pid {proc.pid}) {problem}, and "
            f"{', '.join(users)} still use it: stop them, then stop the server "
            f"(`kill -INT {proc.pid}`) and run again; it restarts with a private socket"
        )
    stop_postmaster(proc, pgdata, f"restarting it privately: it {problem}")
    remove_socket_dir(pid_file.socket_dir, pgdata)
    return None


def start_postmaster(pgdata: Path, bin_path: Path, account: Account) -> PidFile:
    socket_dir = socket_dir_for(pgdata, account)
    options = [
        "-p",
        str(SOCKET_PORT),
        "-h",
        "''",
        "-k",
        shlex.quote(str(socket_dir)),
        "-c",
        f"unix_socket_permissions={SECURITY_SETTINGS['unix_socket_permissions']}",
    ]
    log = pgdata / "log"
    code, output = run_as(
        bin_path / "pg_ctl",
        (
            "-w",
            "-t",
            str(START_TIMEOUT_SECONDS),
            "-D",
            str(pgdata),
            "-l",
            str(log),
            "-o",
            " ".join(options),
            "start",
        ),
        account,
        timeout=START_TIMEOUT_SECONDS + 30,
    )
    pid_file = PidFile.read(pgdata)
    if code != 0 or pid_file is None or postmaster_process(pgdata, pid_file) is None:
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL in {pgdata}: "
            f"{_last_server_error(log) or last_line(output)} (server log: {log}); or set "
            f"{settings.ENV_DATABASE_URL} to use an existing PostgreSQL server"
        )
    return pid_file


def _last_server_error(log: Path) -> str | None:
    """The last FATAL/PANIC/ERROR line of the server log (with its HINT), if any."""
    try:
        lines = owned_files.read_bytes(log, last=16384).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for index in range(len(lines) - 1, -1, -1):
        if any(level in lines[index] for level in ("FATAL:", "PANIC:", "ERROR:")):
            text = " ".join(lines[index].split())
            if index + 1 < len(lines) and "HINT:" in lines[index + 1]:
                text += " " + " ".join(lines[index + 1].split())
            return text
    return None
