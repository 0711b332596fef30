"""Files private to their owner: the umask of the project's processes and the modes of the
Dagster instance's storage directories.

A run's results are not only in the database and the matrix store (both already 0700): Dagster
keeps every run's events (the metadata, the Markdown tables and pictures the UI shows), its
compute logs and the run storage as files under ``$DAGSTER_HOME``, created by whichever process
writes first (the webserver, the daemon, a run worker, a step process). Two rules keep them
private:

- :func:`private_umask`: the ``corr-pipeline`` command runs with ``umask`` 077 (added to the
  caller's, never loosened), so every file it and its children create (``corr-pipeline ui``'s
  webserver, daemon, code server, run workers and step processes; the backfill's runs; the
  benchmarks' outputs) is 0600 and every directory 0700;
- :func:`private_instance_storage`: the code location narrows Dagster's storage directories
  under ``$DAGSTER_HOME`` (:data:`INSTANCE_STORAGE_DIRS`) to 0700 when it loads, and creates
  the missing ones 0700, so an instance started by ``dg dev`` or ``dagster dev`` directly (with
  the shell's umask) keeps its files out of other users' reach as well: a 0644 file in a 0700
  directory is readable by its owner only.

Both act only on what the current user owns: a directory of another account, or a symbolic
link in place of one, is left alone (:func:`private_instance_storage` says which).

What the project reads configuration or data from must be the user's own and closed to writes by
anyone else: :func:`untrusted_reason` is that one rule (the project's ``.env``, the repository's
``dagster.yaml`` and its directory), :func:`check_own_directory` applies it to a directory the
project is about to use (the home, the store) and refuses it in one line that says what to fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "INSTANCE_STORAGE_DIRS",
    "PRIVATE_UMASK",
    "UntrustedDirectoryError",
    "check_own_directory",
    "private_instance_storage",
    "private_umask",
    "untrusted_reason",
]

#: The permission bits a private process never grants: everything for group and others.
PRIVATE_UMASK = 0o077

#: Dagster's file storage under ``$DAGSTER_HOME`` with the default (SQLite) storage and compute
#: log manager: run storage (``history/``), per-run event logs and compute logs (``storage/``),
#: schedule and sensor storage (``schedules/``), the daemon's and webserver's logs (``logs/``,
#: ``.logs_queue/``).
INSTANCE_STORAGE_DIRS = ("history", "storage", "schedules", "logs", ".logs_queue")


@contextlib.contextmanager
def private_umask() -> Iterator[int]:
    """Run the block with ``umask`` = the current one | 077 and yield it; the previous umask
    is restored afterwards (so a command run in-process, as the tests do, leaves the caller's
    umask as it was)."""
    previous = os.umask(PRIVATE_UMASK)
    os.umask(previous | PRIVATE_UMASK)
    try:
        yield previous | PRIVATE_UMASK
    finally:
        os.umask(previous)


def private_instance_storage(home: str | os.PathLike[str] | None) -> list[str]:
    """Make each of :data:`INSTANCE_STORAGE_DIRS` under the Dagster instance directory
    ``home`` a 0700 directory: an existing one owned by this user is narrowed with ``fchmod``
    on a descriptor opened with ``O_NOFOLLOW`` (a symbolic link is never followed), a missing
    one is created 0700. Returns the problems, one line each (a directory of another account,
    a link or a file in its place, a directory that cannot be created), for the caller to log;
    nothing when ``home`` is unset or not an existing directory (an ephemeral instance), and
    nothing for a missing directory on a read-only file system (a pod with a read-only root,
    where no process can write one)."""
    if not home or not os.path.isdir(home):
        return []
    problems = []
    for name in INSTANCE_STORAGE_DIRS:
        path = Path(home) / name
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno == errno.EROFS:  # a read-only root (a hardened pod): nothing to guard
                continue
            problems.append(f"{path}: cannot be created ({exc.strerror})")
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            problems.append(f"{path}: not a private directory ({exc.strerror})")
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                problems.append(f"{path}: owned by uid {st.st_uid}, left as it is")
            elif stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    return problems


def untrusted_reason(path: str | os.PathLike[str], st: os.stat_result) -> tuple[str, str] | None:
    """``(what is wrong, what fixes it)`` when the file or directory ``path`` with status ``st``
    belongs to another user or may be written by its group or by others; None when it is this
    user's own and nobody else may write it. The one rule for what the project trusts."""
    if st.st_uid != os.geteuid():
        return (
            f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
            "remove it, or use one of your own",
        )
    if st.st_mode & 0o022:
        return (
            f"may be written by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            f"chmod go-w {path}",
        )
    return None


class UntrustedDirectoryError(PermissionError):
    """A directory the project would use that another user owns or may write."""


def check_own_directory(path: Path, setting: str) -> None:
    """Refuse ``path`` (:class:`UntrustedDirectoryError`, one line: the path, the owner or mode
    found, the ``chmod`` or the setting that fixes it) unless it is missing (it will be created
    0700) or a directory, not a symbolic link, of this user that nobody else may write
    (:func:`untrusted_reason`). ``setting``: the variable that chooses another directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
        raise UntrustedDirectoryError(
            f"{path} {what}: not used; remove it, or set {setting} to a directory of your own"
        )
    problem = untrusted_reason(path, st)
    if problem is not None:
        what, fix = problem
        instead = f"set {setting} to a directory of your own"
        fix = instead if st.st_uid != os.geteuid() else f"{fix}, or {instead}"
        raise UntrustedDirectoryError(f"{path} {what}: not used; {fix}")
