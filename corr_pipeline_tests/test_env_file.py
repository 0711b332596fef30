"""The project's ``.env``: read as Dagster reads it, applied with Dagster's precedence and
restored, one key rewritten without touching the others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dagster._core.secrets.env_file import get_env_var_dict

from corr_pipeline import settings

NAME = "CORR_PIPELINE_TEST_ENV_FILE_KEY"


def test_write_env_value_replaces_only_its_key(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text(f"A=1\n# [{NAME}] old comment\nexport {NAME}=old\nB='two words'\n\n")
    path.chmod(0o640)
    settings.write_env_value(path, NAME, "2025-11-21", ["line one", "line two"])
    assert path.read_text().splitlines() == [
        "A=1",
        "B='two words'",
        "",
        f"# [{NAME}] line one",
        f"# [{NAME}] line two",
        f"{NAME}=2025-11-21",
    ]
    assert path.stat().st_mode & 0o777 == 0o640  # the file's mode is kept
    settings.write_env_value(path, NAME, "2025-11-24", ["again"])
    text = path.read_text()
    assert text.count(NAME) == 2 and text.endswith(f"# [{NAME}] again\n{NAME}=2025-11-24\n")
    # what Dagster reads from it (dagster dev, dg dev, code servers)
    assert get_env_var_dict(str(tmp_path)) == {"A": "1", "B": "two words", NAME: "2025-11-24"}
    assert settings.env_file_values(path) == get_env_var_dict(str(tmp_path))


def test_a_new_env_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    settings.write_env_value(path, NAME, "x", [])
    assert path.read_text() == f"{NAME}=x\n"
    assert path.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("value", ["two words", "a#b", "'q'", "$HOME", ""])
def test_values_that_need_quoting_are_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / ".env"
    if value == "":
        settings.write_env_value(path, NAME, value, [])  # NAME= is an empty value, fine
        return
    with pytest.raises(ValueError, match=NAME):
        settings.write_env_value(path, NAME, value, [])
    assert not path.exists()


def test_env_file_applied_wins_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like Dagster's commands, the file's values replace the environment's while applied."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(NAME, "from the shell")
    monkeypatch.delenv(NAME + "_2", raising=False)
    (tmp_path / ".env").write_text(f"{NAME}=from-file\n{NAME}_2=new\n")
    with settings.env_file_applied() as values:
        assert values == {NAME: "from-file", NAME + "_2": "new"}
        assert os.environ[NAME] == "from-file" and os.environ[NAME + "_2"] == "new"
    assert os.environ[NAME] == "from the shell" and NAME + "_2" not in os.environ
    (tmp_path / ".env").unlink()
    with settings.env_file_applied() as values:
        assert values == {}
