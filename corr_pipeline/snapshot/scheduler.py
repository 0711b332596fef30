"""Which Dask scheduler a run may use, and how it is reached (docs/operations.md, threat model).

The scheduler is deployment configuration (``$CORR_PIPELINE_DASK_SCHEDULER``), never run config.
Whoever reaches a scheduler can run code on its workers, and a worker's result is a pickle that
the step process loads: a rogue worker or client runs code as the pipeline's user, and so does a
rogue scheduler that took the port first. The loopback interface is no exception: every user
of the machine reaches it. So:

- only ``tls://`` is used, on every host, loopback included, with Dask's ``Security``,
  encryption required: the client presents its certificate and checks the scheduler's against
  the certificate authority that signed both (``$CORR_PIPELINE_DASK_TLS_CA_FILE``, ``_CERT``,
  ``_KEY``; ``corr-pipeline dask certs`` makes a private one,
  :mod:`corr_pipeline.snapshot.scheduler_certs`); only the holders of certificates from that
  authority join the cluster or serve it. The key must be readable by its owner alone;
- ``tcp://`` (plain text, no authentication) and every other scheme are refused.

A refused address fails the step with one line, saying what to use instead, before anything
connects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corr_pipeline import settings

__all__ = ["SchedulerError", "check_scheduler", "scheduler_security"]

#: Where a client's TLS files come from, for the messages.
_MADE_BY = "corr-pipeline dask certs makes them"


class SchedulerError(ValueError):
    """A Dask scheduler address or its TLS files that the pipeline refuses (module docstring)."""


def check_scheduler(address: str) -> dict[str, Path]:
    """Refuse (:class:`SchedulerError`, one line naming the setting to change and what to use
    instead) what the module docstring refuses; the TLS files for a ``tls://`` address.
    Connects to nothing."""
    where = f"{settings.ENV_DASK_SCHEDULER}={address!r}"
    parts = urlsplit(address)
    if parts.scheme != "tls":
        why = (
            "plain tcp:// lets whoever reaches the port (on loopback: every user of this "
            "machine) run code as you"
            if parts.scheme == "tcp"
            else "the scheme must be tls://"
        )
        raise SchedulerError(
            f"{where}: {why}; use tls://{parts.netloc or 'HOST:PORT'} with "
            f"{settings.ENV_DASK_TLS_CA_FILE}, {settings.ENV_DASK_TLS_CERT} and "
            f"{settings.ENV_DASK_TLS_KEY} ({_MADE_BY})"
        )
    files = settings.dask_tls_files()
    names = {
        "ca_file": settings.ENV_DASK_TLS_CA_FILE,
        "cert": settings.ENV_DASK_TLS_CERT,
        "key": settings.ENV_DASK_TLS_KEY,
    }
    missing = [names[k] for k, path in files.items() if path is None or not path.is_file()]
    if missing:
        raise SchedulerError(
            f"{where}: tls:// needs {', '.join(missing)} (readable files; {_MADE_BY})"
        )
    found = {k: path for k, path in files.items() if path is not None}
    if stat.S_IMODE(os.stat(found["key"]).st_mode) & 0o077:
        raise SchedulerError(
            f"{names['key']}={str(found['key'])!r}: the client's key must be readable by its "
            f"owner alone (chmod 600 {found['key']})"
        )
    return found


def scheduler_security(address: str) -> Any:
    """The ``distributed.Security`` to reach ``address`` with (:func:`check_scheduler` first):
    mutual TLS with the settings' files, encryption required."""
    files = check_scheduler(address)
    from distributed.security import Security

    return Security(
        tls_ca_file=str(files["ca_file"]),
        tls_client_cert=str(files["cert"]),
        tls_client_key=str(files["key"]),
        require_encryption=True,
    )
