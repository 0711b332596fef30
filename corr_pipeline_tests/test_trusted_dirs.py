"""What the project reads from a directory must be the user's own: the current directory's
``dagster.yaml`` configures the instance only in the user's own project root that nobody else
may write, and a home or store directory another user owns or may write is refused in one line
(real ``corr-pipeline`` processes, the user ``nobody`` as the other user)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import privacy, settings
from corr_pipeline.defs.run import REPO_DAGSTER_YAML
from corr_pipeline.store.matrix_store import MatrixStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to the user nobody")
NOBODY = 65534
#: What the planted dagster.yaml changes, visible in `corr-pipeline concurrency show`.
PLANTED_RUNS = "runs of any kind at once:     7"


def _project_root(directory: Path) -> None:
    """A copy of the project root whose dagster.yaml allows 7 runs at once (16 in the repo's)."""
    directory.mkdir(exist_ok=True)
    directory.chmod(0o755)
    text = REPO_DAGSTER_YAML.read_text().replace(
        "max_concurrent_runs: 16", "max_concurrent_runs: 7"
    )
    (directory / "dagster.yaml").write_text(text)
    (directory / "dagster.yaml").chmod(0o644)
    (directory / "pyproject.toml").write_text("")


def _cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    return subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", *args],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_users_own_project_root_configures_the_instance(tmp_path: Path) -> None:
    root, home = tmp_path / "root", tmp_path / "home"
    _project_root(root)
    shown = _cli(root, "concurrency", "show", **{settings.ENV_HOME: str(home)})
    assert shown.returncode == 0, shown.stderr
    assert f"Dagster instance {root}:" in shown.stdout and PLANTED_RUNS in shown.stdout


@pytest.mark.parametrize(
    ("planted", "reason"),
    [
        ("open directory", "may be written by group or others (mode 0777)"),
        ("outside the project root", "is not the project root"),
        pytest.param("their directory", f"belongs to uid {NOBODY}", marks=needs_root),
        pytest.param("their dagster.yaml", f"belongs to uid {NOBODY}", marks=needs_root),
    ],
)
def test_a_dagster_yaml_another_user_may_write_is_not_used(
    tmp_path: Path, planted: str, reason: str
) -> None:
    """The instance is then ``home/dagster_home`` with the repository's configuration, and one
    warning line says which file was not used and why."""
    root, home = tmp_path / "root", tmp_path / "home"
    _project_root(root)
    if planted == "open directory":
        root.chmod(0o777)
    elif planted == "outside the project root":
        (root / "pyproject.toml").unlink()
    elif planted == "their directory":
        for path in (root, root / "dagster.yaml", root / "pyproject.toml"):
            os.chown(path, NOBODY, NOBODY)
    else:
        os.chown(root / "dagster.yaml", NOBODY, NOBODY)
    shown = _cli(root, "concurrency", "show", **{settings.ENV_HOME: str(home)})
    assert shown.returncode == 0, shown.stderr
    assert f"Dagster instance {home / 'dagster_home'}:" in shown.stdout, shown.stdout
    assert PLANTED_RUNS not in shown.stdout
    warning = [line for line in shown.stderr.splitlines() if "is not used as the Dagster" in line]
    assert len(warning) == 1 and str(root / "dagster.yaml") in warning[0], shown.stderr
    assert reason in warning[0]


def _planted_store(cwd: Path) -> Path:
    """The default home ``cwd/.corr_pipeline`` with a store, made before the user came, opened
    to everyone (mode 0777) and given to nobody; its matrix is all 666."""
    home = cwd / settings.DEFAULT_HOME_DIRNAME
    store = MatrixStore(home / "store")
    store.save("correlation_matrix", "2024-03-28", "corr", np.full((3, 3), 666.0, np.float32))
    for path in (home, *home.rglob("*")):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o777)
    return home


@needs_root
def test_a_home_planted_by_another_user_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "shared"
    cwd.mkdir()
    cwd.chmod(0o777)
    home = _planted_store(cwd)
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(settings.ENV_HOME)
    monkeypatch.delenv(settings.ENV_STORE_DIR, raising=False)
    with pytest.raises(privacy.UntrustedDirectoryError) as refused:
        MatrixStore(settings.store_dir()).load("correlation_matrix", "2024-03-28", "corr")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{home} belongs to uid {NOBODY}")
    assert f"set {settings.ENV_HOME} to a directory of your own" in message


@pytest.mark.parametrize("setting", [settings.ENV_HOME, settings.ENV_STORE_DIR])
@pytest.mark.parametrize("state", ["0777", pytest.param("nobody's", marks=needs_root)])
def test_a_home_or_store_others_control_is_refused_in_one_line(
    clean_db: sa.Engine, tmp_path: Path, setting: str, state: str
) -> None:
    target, home = tmp_path / "target", tmp_path / "home"
    target.mkdir()
    target.chmod(0o777 if state == "0777" else 0o755)
    if state != "0777":
        os.chown(target, NOBODY, NOBODY)
    env = {settings.ENV_HOME: str(home), setting: str(target)}
    refused = _cli(tmp_path, "store", "list", **env)
    assert refused.returncode == 2, refused
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"corr-pipeline: error: {target} ")
    if state == "0777":
        assert f"mode 0777): not used; chmod go-w {target}, or set {setting}" in refused.stderr
    else:
        assert f"belongs to uid {NOBODY}" in refused.stderr and f"set {setting}" in refused.stderr


def test_the_users_own_private_directories_work(clean_db: sa.Engine, tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = MatrixStore(home / "store")
    store.save("correlation_matrix", "2024-03-28", "corr", np.zeros((3, 3), np.float32))
    home.chmod(0o700)
    listed = _cli(tmp_path, "store", "list", **{settings.ENV_HOME: str(home)})
    assert listed.returncode == 0, listed.stderr
    assert f"matrix store {home / 'store'}" in listed.stdout and "2024-03-28" in listed.stdout
