"""A stand-in Kubernetes API server, reached as a pod reaches the real one.

:class:`JobRecorder` serves HTTPS on a loopback port with a certificate of its own, and points
the ``kubernetes`` client's in-cluster configuration at it (``KUBERNETES_SERVICE_HOST`` / ``_PORT``,
a service-account token and CA file): a ``K8sRunLauncher`` built with ``load_incluster_config``
then sends its requests over real HTTPS, serialized by the real client, to this server. The
server answers ``POST /apis/batch/v1/namespaces/<namespace>/jobs`` like the API server (201, the
Job back) and records the Job; every other request gets 404, so an unexpected call fails loudly.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes
import pytest

__all__ = ["JobRecorder"]

_JOBS_PATH = re.compile(r"^/apis/batch/v1/namespaces/([a-z0-9-]+)/jobs$")


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (subject alternative name) signed by its own key."""
    cert, key = directory / "api.crt", directory / "api.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=kubernetes",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


class JobRecorder:
    """The API server of one test: :attr:`jobs` holds ``(namespace, job)`` for every Job
    created, ``job`` as the JSON the client sent. Use as a context manager, then
    :meth:`serve_in_cluster` before the launcher is built."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.refused: list[str] = []
        self._cert, key = _self_signed_certificate(directory)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._cert, key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> JobRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        kubernetes.client.Configuration.set_default(None)  # nothing points here any more

    def serve_in_cluster(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make ``kubernetes.config.load_incluster_config()`` find this server: its address
        in the service environment variables, a token and this server's certificate as the
        cluster's CA."""
        token = self.directory / "token"
        token.write_text("stand-in-token")
        incluster = kubernetes.config.incluster_config
        monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(token))
        monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(self._cert))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(self._server.server_address[1]))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                match = _JOBS_PATH.match(self.path.split("?", 1)[0])
                authorization = (self.headers.get("Authorization") or "").lower()
                if not match or authorization != "bearer stand-in-token":
                    recorder.refused.append(f"POST {self.path}")
                    self._answer(404, {"kind": "Status", "code": 404})
                    return
                job = json.loads(body)
                recorder.jobs.append((match.group(1), job))
                self._answer(201, job)

            def do_GET(self) -> None:
                recorder.refused.append(f"GET {self.path}")
                self._answer(404, {"kind": "Status", "code": 404})

            def _answer(self, status: int, document: dict[str, Any]) -> None:
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # no request lines on the test's stderr

        return Handler
