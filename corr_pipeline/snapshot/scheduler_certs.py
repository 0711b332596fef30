"""A private certificate authority and the certificates of one Dask cluster, for mutual TLS
(``corr-pipeline dask certs``; which addresses the pipeline uses: :mod:`.scheduler`).

:func:`make_certificates` writes, into a directory of its own (mode 0700, its user's):

- ``ca.pem``: the authority's certificate, which every party checks the others' against;
- ``cluster.pem`` / ``cluster.key``: the scheduler's and the workers' certificate and key
  (server and client use);
- ``client.pem`` / ``client.key``: the pipeline's (client use only: it cannot serve as a
  scheduler);
- ``worker-space/``: an empty directory for the workers' files (``--local-directory``).

Every file is 0600. The authority's own key exists only in memory while the two certificates
are signed and is never written: nobody, the directory's owner included, can issue another
certificate of this authority; a new set is made by running it again into another directory.
Nothing is written until every certificate is made, and a directory that already holds one of
the files, is a symbolic link or belongs to another user is refused in one line.

The keys are ECDSA P-256, the certificates valid for ``days`` from now. Needs ``cryptography``
(the ``dask`` extra).
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corr_pipeline import settings

__all__ = [
    "DEFAULT_DAYS",
    "FILE_NAMES",
    "CertificatesError",
    "ClusterCertificates",
    "client_environment",
    "cluster_security",
    "make_certificates",
]

#: How long the certificates are valid by default.
DEFAULT_DAYS = 365
#: The files :func:`make_certificates` writes, in the order it writes them.
FILE_NAMES = ("ca.pem", "cluster.pem", "cluster.key", "client.pem", "client.key")
WORKER_SPACE = "worker-space"


class CertificatesError(ValueError):
    """Where the certificates cannot go, or ``cryptography`` is missing (one line)."""


@dataclass(frozen=True)
class ClusterCertificates:
    """The files of one cluster's certificates in ``directory`` (module docstring)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def cluster_cert(self) -> Path:
        return self.directory / "cluster.pem"

    @property
    def cluster_key(self) -> Path:
        return self.directory / "cluster.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def worker_space(self) -> Path:
        return self.directory / WORKER_SPACE


def client_environment(certs: ClusterCertificates) -> dict[str, str]:
    """The settings that make the pipeline reach a scheduler with ``certs``' client files
    (the scheduler's address itself, ``$CORR_PIPELINE_DASK_SCHEDULER``, is not among them)."""
    return {
        settings.ENV_DASK_TLS_CA_FILE: str(certs.ca),
        settings.ENV_DASK_TLS_CERT: str(certs.client_cert),
        settings.ENV_DASK_TLS_KEY: str(certs.client_key),
    }


def cluster_security(certs: ClusterCertificates) -> Any:
    """The ``distributed.Security`` of a cluster run in one program (a ``LocalCluster``): its
    scheduler and workers with ``certs``' cluster certificate, its client with the client's,
    encryption required."""
    from distributed.security import Security

    return Security(
        tls_ca_file=str(certs.ca),
        tls_scheduler_cert=str(certs.cluster_cert),
        tls_scheduler_key=str(certs.cluster_key),
        tls_worker_cert=str(certs.cluster_cert),
        tls_worker_key=str(certs.cluster_key),
        tls_client_cert=str(certs.client_cert),
        tls_client_key=str(certs.client_key),
        require_encryption=True,
    )


def _pem_files(days: int) -> dict[str, bytes]:
    """The contents of :data:`FILE_NAMES`, made in memory."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise CertificatesError(
            "making Dask certificates needs the cryptography package: pip install -e '.[dask]'"
        ) from None

    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def usage(*, sign_certificates: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=sign_certificates,
            crl_sign=sign_certificates, encipher_only=False, decipher_only=False,
        )  # fmt: skip

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"corr-pipeline Dask authority {os.urandom(8).hex()}")  # its own name
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(sign_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {"ca.pem": ca.public_bytes(serialization.Encoding.PEM)}
    purposes = {
        "cluster": [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        "client": [ExtendedKeyUsageOID.CLIENT_AUTH],
    }
    for role, uses in purposes.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(f"corr-pipeline Dask {role}"))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage(sign_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(uses), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        files[f"{role}.pem"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{role}.key"] = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    return files


def _private_directory(directory: Path) -> None:
    """``directory`` created 0700, or an existing one of this user's narrowed to 0700; refused
    (:class:`CertificatesError`) when it is a symbolic link, not a directory, another user's, or
    already holds one of :data:`FILE_NAMES`."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(directory):
            directory.mkdir(mode=0o700)
        info = directory.lstat()
    except OSError as exc:
        raise CertificatesError(
            f"{directory}: cannot create it ({exc.strerror}: {exc.filename})"
        ) from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CertificatesError(f"{directory}: not a directory (a symbolic link is refused too)")
    if info.st_uid != os.geteuid():
        raise CertificatesError(f"{directory}: belongs to uid {info.st_uid}, not to this user")
    held = [n for n in (*FILE_NAMES, WORKER_SPACE) if os.path.lexists(directory / n)]
    if held:
        raise CertificatesError(
            f"{directory} already holds {', '.join(held)}: choose another directory "
            "(or remove the old set)"
        )
    directory.chmod(0o700)


def make_certificates(directory: Path, *, days: int = DEFAULT_DAYS) -> ClusterCertificates:
    """A new authority's certificates in ``directory`` (module docstring); the files as
    :class:`ClusterCertificates`. Raises :class:`CertificatesError` (one line) before writing
    anything when it cannot."""
    if days < 1:
        raise CertificatesError(f"the certificates must be valid for at least 1 day (got {days})")
    contents = _pem_files(days)
    directory = Path(os.path.abspath(directory))
    _private_directory(directory)
    written: list[Path] = []
    try:
        for file_name in FILE_NAMES:
            path = directory / file_name
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(path, flags, 0o600)
            written.append(path)
            with os.fdopen(fd, "wb") as out:
                out.write(contents[file_name])
            os.chmod(path, 0o600)  # whatever the umask
        (directory / WORKER_SPACE).mkdir(mode=0o700)
        written.append(directory / WORKER_SPACE)
        (directory / WORKER_SPACE).chmod(0o700)
    except BaseException:
        for path in reversed(written):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        raise
    return ClusterCertificates(directory)
