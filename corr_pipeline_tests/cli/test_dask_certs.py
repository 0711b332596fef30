"""``corr-pipeline dask certs``: private files of a new authority, never overwritten, and printed
commands that start a scheduler and workers which only holders of its certificates reach.

The cluster is the real ``dask scheduler`` / ``dask worker`` commands as printed (over
``tls://127.0.0.1``, encryption required); the pipeline reaches it with the printed settings.
A plain TCP client, a TLS client without a certificate, a client of another authority, and the
pipeline pointed at a scheduler of another authority (one that took the port first) all fail.
Reading the files as another user needs root (``runuser``); the rest runs as any user.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corr_pipeline import settings
from corr_pipeline.snapshot.scheduler import scheduler_security
from corr_pipeline.snapshot.scheduler_certs import (
    FILE_NAMES,
    ClusterCertificates,
    make_certificates,
)
from corr_pipeline_tests.fixtures.commands import run_cli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="reads as the user nobody (runuser)")


def _free_port() -> int:
    """A port free now whose next one is free too (the dashboard's)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind(("127.0.0.1", port + 1))
            return port


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.lstat().st_mode) for p in [directory, *directory.iterdir()]}


def test_the_files_are_their_owners_alone_and_never_overwritten(tmp_path):
    top = tmp_path / "open"
    top.mkdir(mode=0o755)
    top.chmod(0o755)
    directory = top / "dask-tls"
    made = run_cli("dask", "certs", str(directory))
    assert made.returncode == 0, made.stderr
    assert _modes(directory) == {
        "dask-tls": 0o700,
        **dict.fromkeys(FILE_NAMES, 0o600),
        "worker-space": 0o700,
    }
    assert all(p.stat().st_uid == os.geteuid() for p in directory.iterdir())
    assert b"PRIVATE KEY" in (directory / "client.key").read_bytes()
    assert not any(
        b"PRIVATE KEY" in (directory / n).read_bytes() for n in FILE_NAMES if ".pem" in n
    )

    before = {n: (directory / n).read_bytes() for n in FILE_NAMES}
    again = run_cli("dask", "certs", str(directory))
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "already holds ca.pem" in again.stderr
    assert {n: (directory / n).read_bytes() for n in FILE_NAMES} == before


def test_the_certificates_chain_to_the_new_authority_only(tmp_path):
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.x509.oid import ExtendedKeyUsageOID

    certs, other = (make_certificates(tmp_path / name) for name in ("one", "other"))
    ca, other_ca = (x509.load_pem_x509_certificate(c.ca.read_bytes()) for c in (certs, other))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.subject != other_ca.subject  # each authority its own name, even made together
    for path, uses in (
        (certs.cluster_cert, {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}),
        (certs.client_cert, {ExtendedKeyUsageOID.CLIENT_AUTH}),  # cannot serve as a scheduler
    ):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca)
        with pytest.raises((ValueError, InvalidSignature)):
            cert.verify_directly_issued_by(other_ca)
        assert set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == uses
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_link_or_another_users_directory_is_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    refused = run_cli("dask", "certs", str(tmp_path / "link"))
    assert refused.returncode == 2 and "symbolic link is refused" in refused.stderr
    assert list(target.iterdir()) == []
    (tmp_path / "file").write_text("")
    refused = run_cli("dask", "certs", str(tmp_path / "file" / "below"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        refused = run_cli("dask", "certs", str(theirs))
        assert refused.returncode == 2 and "belongs to uid 65534" in refused.stderr
        assert list(theirs.iterdir()) == []


@needs_root
def test_another_user_cannot_read_the_certificates():
    top = Path(tempfile.mkdtemp(prefix="corr_pipeline_dask_", dir="/tmp"))
    try:
        top.chmod(0o755)  # a world-searchable parent, as a home directory often is
        directory = top / "dask-tls"
        assert run_cli("dask", "certs", str(directory)).returncode == 0
        for what in (["ls", str(directory)], *(["cat", str(directory / n)] for n in FILE_NAMES)):
            read = subprocess.run(
                ["runuser", "-u", "nobody", "--", *what], capture_output=True, text=True
            )
            assert read.returncode != 0 and "Permission denied" in read.stderr, what
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def _printed_cluster(certs_dir: Path, port: int) -> Iterator[tuple[dict[str, str], list[int]]]:
    """``corr-pipeline dask certs``'s scheduler and worker commands running: the settings it
    printed, the processes' ids."""
    made = run_cli("dask", "certs", str(certs_dir), "--port", str(port))
    assert made.returncode == 0, made.stderr
    lines = [line for line in made.stdout.splitlines() if not line.startswith("#")]
    commands = [shlex.split(line) for line in lines if " dask " in line]
    exports = [shlex.split(line)[1] for line in lines if line.startswith("export ")]
    assert [c[1:3] for c in commands] == [["dask", "scheduler"], ["dask", "worker"]]
    dask = str(Path(sys.executable).with_name("dask"))
    processes = []
    try:
        for assignment, _, *rest in commands:
            name, value = assignment.split("=", 1)
            processes.append(
                subprocess.Popen(
                    [dask, *rest],
                    env={**os.environ, name: value},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        yield dict(e.split("=", 1) for e in exports), [p.pid for p in processes]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_only_holders_of_the_printed_certificates_reach_the_printed_cluster(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    import dask
    from distributed.security import Security

    from corr_pipeline.compute.parallel.dask_runner import connect

    port = _free_port()
    certs = ClusterCertificates(tmp_path / "dask-tls")
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "10s"}),
        _printed_cluster(certs.directory, port) as (printed, pids),
    ):
        assert printed[settings.ENV_DASK_SCHEDULER] == f"tls://127.0.0.1:{port}"
        for name, value in printed.items():
            monkeypatch.setenv(name, value)
        address = settings.dask_scheduler()
        security = scheduler_security(address)
        with connect(address, security) as runner:
            runner.client.wait_for_workers(2, timeout=120)
            assert runner.client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
            workers = runner.client.scheduler_info()["workers"]
            assert all(w.startswith("tls://127.0.0.1:") for w in workers), workers
            spaces = runner.client.run(lambda dask_worker: dask_worker.local_directory)
            assert all(Path(s).is_relative_to(certs.worker_space) for s in spaces.values())
        listening = _listening(pids)  # scheduler, nanny, workers and every dashboard
        assert len(listening) >= 7 and {ip for ip, _ in listening} == {"127.0.0.1"}, listening

        with pytest.raises(OSError):  # plain TCP: refused by the scheduler
            distributed.Client(f"tcp://127.0.0.1:{port}", timeout=5, set_as_default=False)

        # A raw TLS connection: the scheduler greets a holder of the client certificate first
        # thing; one with the authority's certificate but none of its own is refused in the
        # handshake. TLS 1.2, so that the refusal ends the client's own handshake (under 1.3
        # the client's side completes first and the alert can race the socket's closing).
        def probe(with_client_certificate: bool) -> bytes:
            context = ssl.create_default_context(cafile=str(certs.ca))
            context.check_hostname = False
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            if with_client_certificate:
                context.load_cert_chain(certs.client_cert, certs.client_key)
            with (
                socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
                context.wrap_socket(raw) as tls,
            ):
                return tls.recv(1)

        assert len(probe(with_client_certificate=True)) == 1
        with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
            probe(with_client_certificate=False)
        other = make_certificates(tmp_path / "other")  # another authority's client
        stranger = Security(
            tls_ca_file=str(other.ca),
            tls_client_cert=str(other.client_cert),
            tls_client_key=str(other.client_key),
            require_encryption=True,
        )
        with pytest.raises(OSError):
            distributed.Client(address, security=stranger, timeout=5, set_as_default=False)

        # the other authority's scheduler on a port the pipeline is pointed at: never used
        squatter_port = _free_port()
        squatter = subprocess.Popen(
            [str(Path(sys.executable).with_name("dask")), "scheduler", "--host",
             "tls://127.0.0.1", "--port", str(squatter_port), "--no-dashboard",
             "--tls-ca-file", str(other.ca), "--tls-cert", str(other.cluster_cert),
             "--tls-key", str(other.cluster_key)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_for_listener(squatter_port)
            rogue = f"tls://127.0.0.1:{squatter_port}"
            with pytest.raises(OSError), connect(rogue, scheduler_security(rogue)):
                pass
        finally:
            squatter.terminate()
            squatter.wait(timeout=30)


def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """The addresses the processes ``pids`` and their children listen on."""
    import psutil

    processes = [psutil.Process(pid) for pid in pids]
    processes += [c for p in list(processes) for c in p.children(recursive=True)]
    return {
        (c.laddr.ip, c.laddr.port)
        for p in processes
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def _wait_for_listener(port: int) -> None:
    for _ in range(600):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")
