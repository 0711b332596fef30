"""The embedded PostgreSQL's data directory: ``initdb``, its ownership and mode, and the managed
block of ``postgresql.conf`` and ``pg_hba.conf`` written before every start."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.dbserver import owned_files
from corr_pipeline.dbserver.accounts import (
    SERVER_ACCOUNT_WHEN_ROOT,
    Account,
    last_line,
    run_as,
)
from corr_pipeline.dbserver.directories import own_directory
from corr_pipeline.dbserver.errors import DatabaseUnavailableError

logger = logging.getLogger(__name__)

EMBEDDED_DATABASE = "corr_pipeline"
EMBEDDED_USER = "postgres"
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


def _write_owned(path: Path, text: str, account: Account) -> None:
    """Replace ``path`` atomically with ``text`` (mode 0600, owned by ``account``), never
    through a link (:func:`owned_files.replace_text`)."""
    if account.name is None:
        owned_files.replace_text(path, text)
    else:
        owned_files.replace_text(path, text, account.uid, account.gid)


def init_data_dir(pgdata: Path, bin_path: Path, account: Account) -> None:
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
    own_directory(pgdata, account)
    code, output = run_as(
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
            f"{last_line(output)}"
        )


def check_data_dir(pgdata: Path, account: Account) -> None:
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


def managed_config(text: str) -> str:
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


def write_managed_config(pgdata: Path, account: Account) -> None:
    conf = pgdata / "postgresql.conf"
    text = owned_files.read_text(conf)
    managed = managed_config(text)
    if managed != text:
        _write_owned(conf, managed, account)
    hba = pgdata / "pg_hba.conf"
    try:
        current = owned_files.read_text(hba)
    except (FileNotFoundError, owned_files.NotAPlainFileError):
        current = None
    if current != PG_HBA:
        _write_owned(hba, PG_HBA, account)
