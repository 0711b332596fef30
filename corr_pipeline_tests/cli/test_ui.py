"""``corr-pipeline ui``'s process handling (corr_pipeline.cli.ui), on small stand-in programs.

The real ``dg dev`` started, answering and stopped by SIGTERM from a non-interactive background
job is in ``test_documented_commands.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from corr_pipeline import settings
from corr_pipeline.cli.ui import stop_process_group

pytestmark = pytest.mark.slow  # the UI: outside `pytest -m "not slow"`

#: A parent and a child that both sleep; with IGNORE, both ignore SIGINT (as a background job of
#: a non-interactive shell does). The parent writes the pids and its dispositions to argv[1].
TREE = textwrap.dedent(
    """
    import json, signal, subprocess, sys, time
    ignore = len(sys.argv) > 2 and sys.argv[2] == "IGNORE"
    if ignore:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = "import signal, time; " + ("signal.signal(signal.SIGINT, signal.SIG_IGN); " if ignore else "") + "time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    state = {
        "parent": __import__("os").getpid(),
        "child": child.pid,
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "sigterm": str(signal.getsignal(signal.SIGTERM)),
    }
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump(state, f)
    __import__("os").replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
    """
)


def _wait_for(path: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return json.loads(path.read_text())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_process_group_interrupts_the_whole_group(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    leader = subprocess.Popen([sys.executable, "-c", TREE, str(state)], start_new_session=True)
    pids = _wait_for(state)
    took, killed = stop_process_group(leader, timeout=20)
    assert killed == [] and took < 20
    assert leader.wait(5) == -signal.SIGINT or leader.returncode == 1  # KeyboardInterrupt
    assert _gone(pids["parent"]) and _gone(pids["child"])


def test_stop_process_group_kills_what_ignores_sigint(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE, str(state), "IGNORE"], start_new_session=True
    )
    pids = _wait_for(state)
    took, killed = stop_process_group(leader, timeout=1.0)
    assert set(killed) == {pids["parent"], pids["child"]}
    assert 1.0 <= took < 15
    assert leader.wait(5) == -signal.SIGKILL
    assert _gone(pids["parent"]) and _gone(pids["child"])


def test_ui_restores_sigint_and_stops_everything_on_sigterm(tmp_path: Path) -> None:
    """``run_ui`` started the way a script starts a background job (SIGINT ignored): the program
    it runs gets SIGINT and SIGTERM at their defaults, and SIGTERM to ``run_ui`` stops the
    program and its child, and ``run_ui`` exits 0."""
    state = tmp_path / "state.json"
    wrapper_code = textwrap.dedent(
        f"""
        import sys
        from corr_pipeline.cli.ui import run_ui
        sys.exit(run_ui(command=[sys.executable, "-c", {TREE!r}, {str(state)!r}], timeout=20))
        """
    )
    env = settings.child_environment(str(Path(__file__).resolve().parents[2]))
    wrapper = subprocess.Popen(
        [sys.executable, "-c", wrapper_code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
    )
    try:
        pids = _wait_for(state)
        assert pids["sigint"] == str(signal.default_int_handler), pids  # Python's own handler
        assert pids["sigterm"] == str(signal.SIG_DFL), pids
        wrapper.send_signal(signal.SIGTERM)
        out, _ = wrapper.communicate(timeout=30)
        assert wrapper.returncode == 0, out
        assert "SIGTERM received" in out and "stopped in" in out, out
        assert _gone(pids["parent"]) and _gone(pids["child"])
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
