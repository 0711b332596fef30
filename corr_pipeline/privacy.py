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
    "private_instance_storage",
    "private_umask",
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
