"""What every test may count on however the suite was started (conftest): no ``corr-pipeline``
command a test runs applies a project's ``.env`` (the checkout's holds the demo's first partition
once ``corr-pipeline demo`` ran)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corr_pipeline import project_env, settings


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
