"""Every file a run leaves is its owner's alone: the Dagster instance's run and event storage and
compute logs (which hold the published tables and pictures), the store, the command's own files.

End to end: ``corr-pipeline backfill`` of one session through a real Dagster instance whose
directories sit in a world-searchable directory (0755, as a repository root in a home directory
usually is), then the unprivileged user ``nobody`` tries to read what it left."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corr_pipeline import privacy, settings
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.defs.run import REPO_DAGSTER_YAML
from corr_pipeline_tests.fixtures.backfill_project import (
    GOOD,
    N_DAYS,
    N_SYMBOLS,
    PARTITION_START,
    SEED,
    Project,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs a command as the user nobody")


@pytest.fixture
def open_directory() -> Iterator[Path]:
    """A 0755 directory under /tmp (pytest's own tree is 0700: nobody could not even look)."""
    top = Path(tempfile.mkdtemp(prefix="corr_pipeline_private_", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _as_nobody(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", *command], capture_output=True, text=True, timeout=60
    )


def _open_to_others(top: Path, made_here: set[Path]) -> list[str]:
    """Every path under ``top`` but ``made_here`` (what the test itself created) with a
    permission bit for group or others."""
    loose = []
    for path in top.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path not in made_here and not path.is_symlink() and mode & 0o077:
            loose.append(f"{path.relative_to(top)} {mode:04o}")
    return loose


@needs_root
def test_a_backfill_leaves_nothing_another_user_can_read(
    clean_db: sa.Engine, open_directory: Path
) -> None:
    write_synthetic_universe(clean_db, n_symbols=N_SYMBOLS, n_days=N_DAYS, seed=SEED)
    home, root = open_directory / "dagster_home", open_directory / "cwd"
    for directory in (home, root):
        directory.mkdir()
        directory.chmod(0o755)  # as the shell's umask 022 would make them
    config = home / "dagster.yaml"
    shutil.copyfile(REPO_DAGSTER_YAML, config)
    config.chmod(0o644)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        settings.ENV_HOME: str(open_directory / "corr_home"),
        settings.ENV_STORE_DIR: str(open_directory / "store"),
        settings.ENV_PARTITION_START: PARTITION_START,
    }
    env[settings.ENV_MEMORY_DIR] = "off"  # every matrix on disk, under open_directory
    done = Project(clean_db, root, home, env).backfill(GOOD[0], GOOD[0])
    assert done.returncode == 0, done.stdout + done.stderr
    event_logs = list((home / "history" / "runs").glob("*.db"))  # one per run, and the index
    compute_logs = [p for p in (home / "storage").rglob("*") if p.is_file()]
    assert event_logs and compute_logs, sorted(str(p) for p in home.rglob("*"))
    assert list((open_directory / "store").rglob("*.npy"))  # the retained matrices

    assert _open_to_others(open_directory, {home, root, config}) == []
    # what the user nobody can read or list of it all: the instance's configuration, no more
    readable = _as_nobody("find", str(open_directory), "-mindepth", "1", "-readable")
    assert set(readable.stdout.split()) == {str(home), str(root), str(config)}, readable
    for path in (event_logs[0], compute_logs[0]):
        leak = _as_nobody("cat", str(path))
        assert leak.returncode != 0 and "Permission denied" in leak.stderr, path


def test_loading_the_code_location_narrows_the_instance_storage(tmp_path: Path) -> None:
    """An instance started without ``corr-pipeline`` (``dg dev`` with the shell's umask): the
    code location makes the storage directories 0700 and creates the missing ones so; a symbolic
    link in place of one is never followed."""
    home = tmp_path / "home"
    (home / "storage").mkdir(parents=True)
    (home / "storage").chmod(0o755)
    (home / "storage" / "run.db").write_text("events")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    (home / "history").symlink_to(elsewhere)
    code = "import corr_pipeline.definitions"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "history: not a private directory" in proc.stderr
    for name in privacy.INSTANCE_STORAGE_DIRS:
        if name != "history":
            assert stat.S_IMODE((home / name).lstat().st_mode) == 0o700, name
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755  # the link's target: untouched


def test_private_umask_is_restored() -> None:
    previous = os.umask(0o022)
    try:
        with privacy.private_umask() as inside:
            assert inside == 0o077 and os.umask(inside) == 0o077
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(previous)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only file system needs root")
def test_the_code_location_loads_on_a_read_only_root(tmp_path: Path) -> None:
    """A pod with a read-only root file system (deploy/): ``$DAGSTER_HOME`` exists but nothing
    can be created in it; the code location still loads, and says nothing of it."""
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(home)], check=True)
    try:
        code = "import corr_pipeline.definitions"
        env = {**os.environ, "DAGSTER_HOME": str(home)}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        assert "Dagster storage" not in proc.stderr
        assert os.listdir(home) == []
    finally:
        subprocess.run(["umount", str(home)], check=True)
