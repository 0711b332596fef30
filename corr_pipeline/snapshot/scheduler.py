"""Which Dask scheduler a run may use, and how it is reached (docs/operations.md, threat model).

The scheduler is deployment configuration (``$CORR_PIPELINE_DASK_SCHEDULER``), never run config.
Whoever reaches a scheduler can run code on its workers, and a worker's result is a pickle that
the step process loads: a rogue worker or client runs code as the pipeline's user. So:

- ``tcp://`` (plain text, no authentication) is accepted on the loopback interface only
  (``127.0.0.0/8``, ``::1``, ``localhost``): one machine, one user;
- any other address is reached over ``tls://`` with Dask's ``Security``, encryption required,
  the client presenting its certificate and checking the scheduler's against the certificate
  authority that signed both (``$CORR_PIPELINE_DASK_TLS_CA_FILE``, ``_CERT``, ``_KEY``); only
  the holders of certificates from that authority join the cluster. The key must be readable
  by its owner alone;
- any other scheme is refused.

A refused address fails the step with one line before anything connects.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corr_pipeline import settings

__all__ = ["SchedulerError", "check_scheduler", "scheduler_security"]

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class SchedulerError(ValueError):
    """A Dask scheduler address or its TLS files that the pipeline refuses (module docstring)."""


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_scheduler(address: str) -> dict[str, Path] | None:
    """Refuse (:class:`SchedulerError`, one line naming the setting to change) what the module
    docstring refuses; the TLS files for a ``tls://`` address, None for a loopback ``tcp://``
    one. Connects to nothing."""
    where = f"{settings.ENV_DASK_SCHEDULER}={address!r}"
    parts = urlsplit(address)
    host = parts.hostname or ""
    if parts.scheme == "tcp":
        if _is_loopback(host):
            return None
        raise SchedulerError(
            f"{where}: plain tcp:// is accepted on the loopback interface only; reach a "
            f"scheduler on {host} over tls:// with {settings.ENV_DASK_TLS_CA_FILE}, "
            f"{settings.ENV_DASK_TLS_CERT} and {settings.ENV_DASK_TLS_KEY} (docs/operations.md)"
        )
    if parts.scheme != "tls":
        raise SchedulerError(f"{where}: the scheme must be tcp:// (loopback) or tls://")
    files = settings.dask_tls_files()
    names = {
        "ca_file": settings.ENV_DASK_TLS_CA_FILE,
        "cert": settings.ENV_DASK_TLS_CERT,
        "key": settings.ENV_DASK_TLS_KEY,
    }
    missing = [names[k] for k, path in files.items() if path is None or not path.is_file()]
    if missing:
        raise SchedulerError(f"{where}: tls:// needs {', '.join(missing)} (readable files)")
    found = {k: path for k, path in files.items() if path is not None}
    if stat.S_IMODE(os.stat(found["key"]).st_mode) & 0o077:
        raise SchedulerError(
            f"{names['key']}={str(found['key'])!r}: the client's key must be readable by its "
            f"owner alone (chmod 600 {found['key']})"
        )
    return found


def scheduler_security(address: str) -> Any:
    """The ``distributed.Security`` to reach ``address`` with (:func:`check_scheduler` first):
    None for ``tcp://`` on the loopback interface, TLS with the settings' files for
    ``tls://``, encryption required."""
    files = check_scheduler(address)
    if files is None:
        return None
    from distributed.security import Security

    return Security(
        tls_ca_file=str(files["ca_file"]),
        tls_client_cert=str(files["cert"]),
        tls_client_key=str(files["key"]),
        require_encryption=True,
    )
