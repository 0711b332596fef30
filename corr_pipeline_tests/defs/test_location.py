"""The code location collects ``corr_pipeline/defs/`` as ``dg`` collects a project's defs folder
(:mod:`corr_pipeline.defs.location`): exactly the project's definitions, and the same from an
installed package, which has no ``pyproject.toml`` above it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from corr_pipeline.defs.location import build_definitions

PACKAGE = Path(__file__).resolve().parents[2] / "corr_pipeline"


def test_the_folder_holds_exactly_the_location() -> None:
    repo = build_definitions().get_repository_def()
    assert sorted(job.name for job in repo.get_all_jobs()) == ["__ASSET_JOB", "snapshot_job"]
    assert [s.name for s in repo.schedule_defs] == ["nightly_snapshot_schedule"]
    assert sorted(s.name for s in repo.sensor_defs) == [
        "prices_ready_sensor",
        "publication_freshness_sensor",
        "snapshot_failure_sensor",
    ]
    assert sorted(repo.get_top_level_resources()) == [
        "io_manager",
        "matrix_io_manager",
        "matrix_store",
        "postgres",
        "price_source",
        "prices_sensor_settings",
        "snapshot_params",
    ]
    assert repo.get_job("snapshot_job").executor_def.name == "snapshot_executor"


def test_an_installed_package_loads_without_pyproject(tmp_path: Path) -> None:
    """A copy of the package alone (as ``site-packages`` holds it) loads the same location."""
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "corr_pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "import corr_pipeline\n"
        "from corr_pipeline.definitions import defs\n"
        "repo = defs.get_repository_def()\n"
        "print(corr_pipeline.__file__)\n"
        "print(len(list(repo.asset_graph.get_all_asset_keys())), len(repo.sensor_defs))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    where, counts = proc.stdout.split("\n")[:2]
    assert Path(where).is_relative_to(site)
    assert counts == "8 3"
