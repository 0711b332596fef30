"""Search permission on a directory for one account alone: a POSIX access ACL entry.

Run as root, the embedded PostgreSQL runs as the account ``pgserver``, which must traverse the
directories above its data directory and the wheel's binaries. Adding the search bit for others
(``o+x``) would open those directories to every account (root's home would become 0701); an ACL
entry ``user:<uid>:--x`` grants it to that account only, as ``setfacl -m u:pgserver:x DIR``
does. The entry is written into the directory's ``system.posix_acl_access`` attribute through a
descriptor opened with ``O_NOFOLLOW``; existing entries are kept, the mask is recomputed as
``setfacl`` does (the union of the group class: named users, the owning group, named groups),
so no other account's permission changes.

The attribute's format (``linux/posix_acl_xattr.h``): a little-endian ``u32`` version 2, then
entries of ``(u16 tag, u16 perm, u32 id)`` sorted by tag and id.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

__all__ = ["AclUnsupportedError", "grant_search"]

XATTR = "system.posix_acl_access"
VERSION = 2
UNDEFINED_ID = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
SEARCH = 0o1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")


class AclUnsupportedError(OSError):
    """The file system of a directory keeps no POSIX ACLs."""


def _entries_from_mode(mode: int) -> dict[tuple[int, int], int]:
    """The minimal ACL equivalent to the permission bits ``mode``."""
    return {
        (USER_OBJ, UNDEFINED_ID): (mode >> 6) & 7,
        (GROUP_OBJ, UNDEFINED_ID): (mode >> 3) & 7,
        (OTHER, UNDEFINED_ID): mode & 7,
    }


def _parse(data: bytes) -> dict[tuple[int, int], int]:
    (version,) = _HEADER.unpack_from(data)
    if version != VERSION or (len(data) - _HEADER.size) % _ENTRY.size:
        raise ValueError(f"unknown POSIX ACL format (version {version}, {len(data)} bytes)")
    return {(tag, ident): perm for tag, perm, ident in _ENTRY.iter_unpack(data[_HEADER.size :])}


def _pack(entries: dict[tuple[int, int], int]) -> bytes:
    ordered = sorted(entries.items())
    return _HEADER.pack(VERSION) + b"".join(
        _ENTRY.pack(tag, perm, ident) for (tag, ident), perm in ordered
    )


def grant_search(directory: Path, uid: int) -> None:
    """Add search permission for the account ``uid`` alone to ``directory`` (an ACL entry
    ``user:uid:--x`` merged into its access ACL; nothing else changes but the mask, which
    becomes the union of the group class as with ``setfacl -m``); nothing is written when the
    account has the right by its entry already. :class:`AclUnsupportedError`
    when its file system keeps no ACLs; OSError when ``directory`` is a symbolic link or not a
    directory."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            entries = _parse(os.getxattr(fd, XATTR))
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                entries = _entries_from_mode(stat.S_IMODE(os.fstat(fd).st_mode))
            elif exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise AclUnsupportedError(exc.errno, f"{directory}: no POSIX ACLs here") from None
            else:
                raise
        if entries.get((USER, uid), 0) & entries.get((MASK, UNDEFINED_ID), 0) & SEARCH:
            return  # granted already (by an earlier start): nothing is rewritten
        entries[(USER, uid)] = entries.get((USER, uid), 0) | SEARCH
        group_class = [
            perm for (tag, _), perm in entries.items() if tag in (USER, GROUP_OBJ, GROUP)
        ]
        entries[(MASK, UNDEFINED_ID)] = 0
        for perm in group_class:
            entries[(MASK, UNDEFINED_ID)] |= perm
        try:
            os.setxattr(fd, XATTR, _pack(entries))
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise AclUnsupportedError(exc.errno, f"{directory}: no POSIX ACLs here") from None
            raise
    finally:
        os.close(fd)
