"""A certificate authority and certificates for a Dask cluster over TLS (``openssl``), for tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROLES = ("scheduler", "worker", "client")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> dict[str, Path]:
    """``ca`` (certificate) and ``<role>_cert`` / ``<role>_key`` for every role of
    :data:`ROLES`, signed by that authority, in ``directory`` (keys 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=corr-pipeline-test-ca", cwd=directory,
    )  # fmt: skip
    files = {"ca": directory / "ca.pem"}
    for role in ROLES:
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{role}.key", "-out",
            f"{role}.csr", "-subj", f"/CN={role}", cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{role}.pem", "-days", "2", cwd=directory,
        )  # fmt: skip
        files[f"{role}_cert"] = directory / f"{role}.pem"
        files[f"{role}_key"] = directory / f"{role}.key"
        files[f"{role}_key"].chmod(0o600)
    return files
