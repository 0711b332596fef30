"""What every test may count on however the suite was started (conftest): the programs a test
starts get SIGINT at its default even when pytest was started with SIGINT ignored (``cmd &`` in a
script, ``nohup ... &``), and no ``corr-pipeline`` command a test runs applies a project's
``.env`` (the checkout's holds the demo's first partition once ``corr-pipeline demo`` ran)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from corr_pipeline import project_env, settings

ROOT = Path(__file__).resolve().parents[1]
SIGINT_AT_DEFAULT = (
    "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
)


def test_a_program_a_test_starts_gets_sigint_at_its_default() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", SIGINT_AT_DEFAULT], capture_output=True, text=True, check=True
    )
    assert probe.stdout.strip() == "True"


def _ignore_sigint() -> None:
    """In the child: SIGINT ignored, as a shell starts a background job of a script."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_session_started_with_sigint_ignored_starts_programs_with_it_at_default() -> None:
    """pytest started as a script's background job runs the test above, which passes there
    too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    test = f"{Path(__file__).relative_to(ROOT)}::test_a_program_a_test_starts_gets_sigint_at_its_default"
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,  # noqa: PLW1509
    )
    try:
        out, _ = session.communicate(timeout=300)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 0, out[-3000:]
    assert "1 passed" in out, out[-3000:]


def test_no_command_of_the_suite_applies_a_projects_env_file(tmp_path: Path) -> None:
    """A project root whose ``.env`` sets the calendar: a command the suite runs there keeps the
    environment's (XNYS: Christmas closed); the suite's setting is ``CORR_PIPELINE_ENV_FILE=off``."""
    for marker in project_env.PROJECT_MARKERS:
        (tmp_path / marker).write_text("")
    (tmp_path / ".env").write_text(f"{settings.ENV_CALENDAR}=weekdays\n")
    (tmp_path / ".env").chmod(0o600)
    shown = subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", "calendar", "--from", "2026-12-24"]
        + ["--to", "2026-12-25"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "closed" in shown.stdout and "+1d" not in shown.stdout, shown.stdout
    assert os.environ.get(settings.ENV_ENV_FILE) == "off"
