"""Who reaches what ``corr-pipeline ui`` serves: the real command started from a copy of the
repository root, asked over HTTP and websockets by its owner (with and without the token it
printed) and by the unprivileged user ``nobody`` (``curl`` through ``runuser``; skipped when not
root): GraphQL reads and a launch mutation are refused without the token, a websocket without
the cookie is closed; with the token everything works, except launching under ``--read-only``.
``--no-token`` answers anyone, after a warning."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.slow  # the UI: outside `pytest -m "not slow"`

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="asks as the user nobody")

RUNS_AND_ASSETS = "{ runsOrError { ... on Runs { results { runId } } } assetNodes { id } }"
LAUNCH = """mutation {
  launchRun(executionParams: {
    selector: {repositoryLocationName: "corr_pipeline", repositoryName: "__repository__",
               jobName: "%s"},
    runConfigData: {}
  }) { __typename ... on PythonError { message } }
}"""


@dataclass
class Ui:
    port: int
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def output(self) -> str:
        return self.log.read_text()

    @property
    def token(self) -> str:
        found = re.search(r"\?token=([A-Za-z0-9_-]+)", self.output)
        assert found, f"corr-pipeline ui printed no token:\n{self.output}"
        return found.group(1)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _project(tmp: Path) -> Path:
    root = (tmp / "repo").resolve()
    root.mkdir()
    for name in ("pyproject.toml", "dagster.yaml", "workspace.yaml"):
        (root / name).write_bytes((REPO / name).read_bytes())
    (root / "corr_pipeline").symlink_to(REPO / "corr_pipeline")
    return root


@contextlib.contextmanager
def serving(root: Path, *args: str) -> Iterator[Ui]:
    """``corr-pipeline ui --port P ARGS`` from ``root`` until its web server answers (any
    status); stopped by SIGTERM afterwards."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORR_PIPELINE_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    log = root / f"ui-{port}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corr_pipeline.cli", "ui", "--port", str(port), *args],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ui = Ui(port, log, proc)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _status(ui.url("/server_info")) is None:
            assert proc.poll() is None, f"exited with {proc.returncode}:\n{ui.output}"
            assert time.monotonic() < deadline, f"no answer in {START_TIMEOUT_S} s:\n{ui.output}"
            time.sleep(0.5)
        yield ui
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _graphql(ui: Ui, query: str, **headers: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        ui.url("/graphql"),
        data=json.dumps({"query": query}).encode(),
        headers={"content-type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _graphql_as_nobody(ui: Ui, query: str) -> tuple[str, str]:
    """(HTTP status, body) of a GraphQL POST by the user ``nobody``."""
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", "curl", "-s", "-o", "-", "-w", "\n%{http_code}",
         "-H", "content-type: application/json", "--data-binary", json.dumps({"query": query}),
         ui.url("/graphql")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition("\n")
    return status, body


def _websocket_status(ui: Ui, **headers: str) -> int:
    """101 when the websocket handshake on /graphql is accepted, else the refusal's status."""
    try:
        with connect(
            f"ws://127.0.0.1:{ui.port}/graphql",
            subprotocols=["graphql-ws"],  # type: ignore[list-item]
            additional_headers=headers,
            open_timeout=30,
        ):
            return 101
    except InvalidStatus as exc:
        return int(exc.response.status_code)


def _login(ui: Ui) -> str:
    """The cookie header the token's address sets (and where it redirects)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirect:
        opener.open(ui.url(f"/?token={ui.token}"), timeout=30)
    assert redirect.value.code == 302 and redirect.value.headers["location"] == "/"
    cookie = redirect.value.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    return cookie.split(";", 1)[0]


@needs_root
def test_only_the_holder_of_the_token_reads_and_launches(tmp_path: Path) -> None:
    root = _project(tmp_path)
    with serving(root) as ui:
        # another local user: no results, no launch, not even the server's version
        assert _graphql_as_nobody(ui, RUNS_AND_ASSETS)[0] == "401"
        assert _graphql_as_nobody(ui, LAUNCH % "snapshot_job")[0] == "401"
        # the owner without the token: the same
        assert _graphql(ui, RUNS_AND_ASSETS)[0] == 401
        assert _status(ui.url("/server_info")) == 401
        assert _websocket_status(ui) == 403
        assert _websocket_status(ui, Cookie=f"corr_pipeline_ui_{ui.port}=wrong") == 403
        # the owner with the token: a cookie, then everything
        cookie = _login(ui)
        status, answer = _graphql(ui, RUNS_AND_ASSETS, Cookie=cookie)
        assert status == 200 and answer["data"]["runsOrError"]["results"] == [], answer
        assert answer["data"]["assetNodes"], answer
        assert _websocket_status(ui, Cookie=cookie) == 101
        # a mutation reaches Dagster (a job that does not exist: nothing is launched)
        status, answer = _graphql(ui, LAUNCH % "no_such_job", Authorization=f"Bearer {ui.token}")
        assert answer["data"]["launchRun"]["__typename"] == "PipelineNotFoundError", answer
        # a wrong bearer token is refused
        assert _graphql(ui, RUNS_AND_ASSETS, Authorization="Bearer x" + ui.token)[0] == 401
    assert ui.token not in (root / "dagster.yaml").read_text()


def test_read_only_refuses_a_launch_even_with_the_token(tmp_path: Path) -> None:
    root = _project(tmp_path)
    with serving(root, "--read-only") as ui:
        cookie = _login(ui)
        status, answer = _graphql(ui, RUNS_AND_ASSETS, Cookie=cookie)
        assert status == 200 and answer["data"]["assetNodes"], answer
        status, answer = _graphql(ui, LAUNCH % "snapshot_job", Cookie=cookie)
        assert answer["data"]["launchRun"]["__typename"] == "UnauthorizedError", answer
        status, answer = _graphql(ui, RUNS_AND_ASSETS, Cookie=cookie)
        assert answer["data"]["runsOrError"]["results"] == [], answer
        assert _graphql(ui, RUNS_AND_ASSETS)[0] == 401


def test_no_token_answers_anyone_after_a_warning(tmp_path: Path) -> None:
    root = _project(tmp_path)
    with serving(root, "--no-token") as ui:
        status, answer = _graphql(ui, RUNS_AND_ASSETS)
        assert status == 200 and answer["data"]["assetNodes"], answer
        assert "?token=" not in ui.output
        warning = [line for line in ui.output.splitlines() if "WARNING: --no-token" in line]
        assert warning and "launch and terminate runs" in warning[0], ui.output


# ------------------------------------------------------------------------------------------------
# The project's .env: checked before anything starts, never applied by the UI's processes
# ------------------------------------------------------------------------------------------------


def _attempt(root: Path, wait: float = 90.0) -> tuple[int | None, str]:
    """Run ``corr-pipeline ui`` from ``root`` for at most ``wait`` seconds: (exit status or
    None when it was still running, then killed with its group; output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORR_PIPELINE_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "corr_pipeline.cli", "ui", "--port", str(_free_port())],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=wait)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out + err


def _payload(tmp: Path) -> tuple[Path, Path]:
    """(a directory whose sitecustomize.py creates a marker when Python starts with it on
    PYTHONPATH, the marker)."""
    site, marker = tmp / "site", tmp / "payload_ran"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return site, marker


def test_an_env_file_with_other_keys_stops_the_ui_before_it_starts(tmp_path: Path) -> None:
    root = _project(tmp_path)
    site, marker = _payload(tmp_path)
    (root / ".env").write_text(f"CORR_PIPELINE_KEEP_MATRICES=3\nPYTHONPATH={site}\n")
    (root / ".env").chmod(0o600)
    code, output = _attempt(root)
    assert code == 2, output
    assert output.count("\n") == 1 and output.startswith("corr-pipeline: error:"), output
    assert f"{root / '.env'} sets PYTHONPATH" in output, output
    assert "move the others out of the file" in output, output
    assert not marker.exists()
    assert not (root / "history").exists() and not (root / "storage").exists()  # no instance


def test_an_env_file_others_may_write_stops_the_ui(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / ".env").write_text("CORR_PIPELINE_KEEP_MATRICES=3\n")
    (root / ".env").chmod(0o620)
    code, output = _attempt(root)
    assert code == 2 and output.count("\n") == 1, output
    assert "mode 0620" in output and "chmod go-w" in output, output
    assert not (root / "history").exists()


def test_the_uis_processes_run_where_no_env_file_is(tmp_path: Path) -> None:
    """With a ``.env`` of allowed keys the UI starts; neither the web server, the daemon nor
    their code servers run in the repository root, so none of them applies its ``.env`` (as
    Dagster's commands do with the ``.env`` of their working directory, every key of it), now
    or after the file changes."""
    root = _project(tmp_path)
    (root / ".env").write_text("CORR_PIPELINE_KEEP_MATRICES=3\nDAGSTER_PROJECT_ENV_FILE_PATHS={}\n")
    (root / ".env").chmod(0o600)
    import psutil

    with serving(root) as ui:
        deadline = time.monotonic() + 120
        while True:  # the web server, the daemon and a code server for each
            tree = psutil.Process(ui.proc.pid).children(recursive=True)
            servers = [p for p in tree if "grpc" in " ".join(p.cmdline())]
            if len(servers) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(tree) >= 4 and servers, [p.cmdline() for p in tree]
        for proc in tree:
            cwd = Path(proc.cwd())
            assert cwd != root and not (cwd / ".env").exists(), (proc.cmdline(), cwd)
            assert "DAGSTER_PROJECT_ENV_FILE_PATHS" not in proc.environ(), proc.cmdline()
            assert ui.token not in " ".join(proc.cmdline())
            assert ui.token not in "".join(proc.environ().values())
