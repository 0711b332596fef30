"""The project's ``.env``: read as Dagster reads it, applied with Dagster's precedence and
restored, one key rewritten without touching the others; applied only in the project root, only
the user's own file that nobody else may write, only the project's and Dagster's keys (real
``corr-pipeline`` processes, and the user ``nobody`` as the owner of a foreign file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster._core.secrets.env_file import get_env_var_dict

from corr_pipeline import project_env, settings

#: These tests are about the file itself: the commands they run apply one (in project roots of
#: their own), unlike the rest of the suite's (conftest: ``CORR_PIPELINE_ENV_FILE=off``).
pytestmark = pytest.mark.usefixtures("env_files_apply")

NAME = "CORR_PIPELINE_TEST_ENV_FILE_KEY"
INTRUDER_URL = "postgresql+psycopg://intruder@203.0.113.9:5432/theirs"


def _make_project_root(directory: Path) -> None:
    for marker in project_env.PROJECT_MARKERS:
        (directory / marker).write_text("")


def _cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_write_env_value_replaces_only_its_key(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text(f"A=1\n# [{NAME}] old comment\nexport {NAME}=old\nB='two words'\n\n")
    path.chmod(0o640)
    project_env.write_env_value(path, NAME, "2025-11-21", ["line one", "line two"])
    assert path.read_text().splitlines() == [
        "A=1",
        "B='two words'",
        "",
        f"# [{NAME}] line one",
        f"# [{NAME}] line two",
        f"{NAME}=2025-11-21",
    ]
    assert path.stat().st_mode & 0o777 == 0o640  # the file's mode is kept
    project_env.write_env_value(path, NAME, "2025-11-24", ["again"])
    text = path.read_text()
    assert text.count(NAME) == 2 and text.endswith(f"# [{NAME}] again\n{NAME}=2025-11-24\n")
    # what Dagster reads from it (dagster dev, dg dev, code servers)
    assert get_env_var_dict(str(tmp_path)) == {"A": "1", "B": "two words", NAME: "2025-11-24"}
    assert project_env.env_file_values(path) == get_env_var_dict(str(tmp_path))


def test_a_new_env_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    project_env.write_env_value(path, NAME, "x", [])
    assert path.read_text() == f"{NAME}=x\n"
    assert path.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("value", ["two words", "a#b", "'q'", "$HOME", ""])
def test_values_that_need_quoting_are_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / ".env"
    if value == "":
        project_env.write_env_value(path, NAME, value, [])  # NAME= is an empty value, fine
        return
    with pytest.raises(ValueError, match=NAME):
        project_env.write_env_value(path, NAME, value, [])
    assert not path.exists()


def test_env_file_applied_wins_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like Dagster's commands, the file's values replace the environment's while applied."""
    _make_project_root(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(NAME, "from the shell")
    monkeypatch.delenv(NAME + "_2", raising=False)
    (tmp_path / ".env").write_text(f"{NAME}=from-file\n{NAME}_2=new\n")
    with project_env.env_file_applied() as values:
        assert values == {NAME: "from-file", NAME + "_2": "new"}
        assert os.environ[NAME] == "from-file" and os.environ[NAME + "_2"] == "new"
    assert os.environ[NAME] == "from the shell" and NAME + "_2" not in os.environ
    (tmp_path / ".env").unlink()
    with project_env.env_file_applied() as values:
        assert values == {}


def test_an_env_file_outside_the_project_root_is_not_applied(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text(f"{settings.ENV_DATABASE_URL}={INTRUDER_URL}\n")
    (tmp_path / ".env").chmod(0o600)
    shown = _cli(tmp_path, "db", "url")
    assert shown.returncode == 0, shown.stderr
    assert "intruder" not in shown.stdout and "203.0.113.9" not in shown.stdout
    _make_project_root(tmp_path)  # the same file in a project root applies
    shown = _cli(tmp_path, "db", "url")
    assert "intruder@203.0.113.9" in shown.stdout, shown.stdout + shown.stderr


def test_env_file_off_leaves_the_projects_env_file_alone(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    """``CORR_PIPELINE_ENV_FILE=off``: a command in the project root takes the environment's
    values, not the ``.env``'s; a value other than ``off`` is refused in one line."""
    _make_project_root(tmp_path)
    (tmp_path / ".env").write_text(f"{settings.ENV_DATABASE_URL}={INTRUDER_URL}\n")
    (tmp_path / ".env").chmod(0o600)
    shown = _cli(tmp_path, "db", "url", **{settings.ENV_ENV_FILE: "off"})
    assert shown.returncode == 0, shown.stderr
    assert "intruder" not in shown.stdout and "203.0.113.9" not in shown.stdout
    assert clean_db.url.database in shown.stdout, shown.stdout
    refused = _cli(tmp_path, "db", "url", **{settings.ENV_ENV_FILE: "no"})
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused
    assert f"{settings.ENV_ENV_FILE}='no' must be off" in refused.stderr, refused.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the file to the user nobody")
def test_another_users_env_file_is_refused_in_one_line(tmp_path: Path) -> None:
    _make_project_root(tmp_path)
    path = tmp_path / ".env"
    path.write_text(f"{settings.ENV_DATABASE_URL}={INTRUDER_URL}\n")
    path.chmod(0o644)
    os.chown(path, 65534, 65534)
    refused = _cli(tmp_path, "db", "url")
    assert refused.returncode == 2 and "intruder" not in refused.stdout, refused
    assert refused.stderr.count("\n") == 1 and "belongs to uid 65534" in refused.stderr


def test_an_env_file_others_may_write_is_refused(tmp_path: Path) -> None:
    _make_project_root(tmp_path)
    path = tmp_path / ".env"
    path.write_text(f"{settings.ENV_DATABASE_URL}={INTRUDER_URL}\n")
    path.chmod(0o666)
    refused = _cli(tmp_path, "db", "url")
    assert refused.returncode == 2, refused
    assert "chmod go-w" in refused.stderr and refused.stderr.count("\n") == 1


def test_only_the_projects_keys_apply_and_psql_reads_no_psqlrc(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    """A ``PSQLRC`` in ``.env`` is not applied, and one in the environment is not read by
    ``db psql`` (``-X``): its shell command never runs."""
    _make_project_root(tmp_path)
    marker, rc = tmp_path / "psqlrc_ran", tmp_path / "psqlrc"
    rc.write_text(f"\\! touch {marker}\n")
    (tmp_path / ".env").write_text(f"PSQLRC={rc}\nLD_PRELOAD=/nonexistent.so\n{NAME}=kept\n")
    (tmp_path / ".env").chmod(0o600)
    ran = _cli(tmp_path, "db", "psql", "-At", "-c", "SELECT 41 + 1")
    assert ran.returncode == 0 and ran.stdout.strip() == "42", ran
    assert "not applied: LD_PRELOAD, PSQLRC" in ran.stderr
    assert not marker.exists()
    ran = _cli(tmp_path, "db", "psql", "-At", "-c", "SELECT 1", PSQLRC=str(rc))
    assert ran.returncode == 0 and not marker.exists(), ran
