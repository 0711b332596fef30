"""Plain files in a directory that another account owns, read and written without following a
link.

Run as root, the embedded server's data directory and socket directory belong to the account
``pgserver``, which can put anything in them: a symbolic link named like a file root is about
to write (``postgresql.conf``, the watchdog's log) would make root write, chmod or chown the
link's target, anywhere; a link or a second hard link to a file root can read (``/etc/shadow``)
would make root copy it into a file ``pgserver`` reads. So every such file is opened with
``O_NOFOLLOW`` and accepted only when the descriptor is a regular file with one link; modes
and owners are changed on the descriptor; a file is replaced by writing a new one created with
``O_CREAT | O_EXCL`` (which never follows a link) under a random name and renaming it over the
old one (a rename replaces a link, it never writes through it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["NotAPlainFileError", "open_append", "read_bytes", "read_text", "replace_text"]

_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class NotAPlainFileError(OSError):
    """A name that is a symbolic link, or a file with more than one name, or no regular file."""


def _open_plain(path: Path, flags: int, mode: int = 0o600) -> int:
    try:
        fd = os.open(path, flags | _OPEN, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotAPlainFileError(errno.ELOOP, f"{path} is a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "a file with other names"
        raise NotAPlainFileError(errno.EPERM, f"{path} is {what}")
    return fd


def read_bytes(path: Path, last: int | None = None) -> bytes:
    """The content of the plain file ``path`` (its ``last`` bytes when given);
    :class:`NotAPlainFileError` for a link, FileNotFoundError when there is none."""
    fd = _open_plain(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        if last is not None:
            handle.seek(max(0, os.fstat(fd).st_size - last))
        return handle.read()


def read_text(path: Path, errors: str = "strict") -> str:
    """:func:`read_bytes` decoded as UTF-8."""
    return read_bytes(path).decode("utf-8", errors=errors)


def replace_text(path: Path, text: str, uid: int | None = None, gid: int | None = None) -> None:
    """Replace ``path`` atomically with ``text``: a new file, mode 0600 (owned by ``uid:gid``
    when given), created exclusively beside it under a random name, fsynced, renamed over
    ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(fd, 0o600)
            if uid is not None:
                os.fchown(fd, uid, -1 if gid is None else gid)
            handle.write(text)
            handle.flush()
            os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def open_append(path: Path) -> int:
    """A descriptor appending to the plain file ``path`` (created 0600 if missing). A link or a
    many-named file in its place is removed first (unlinking a name never touches a target) and a
    new file is created exclusively."""
    try:
        return _open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except NotAPlainFileError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return _open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
