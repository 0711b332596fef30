"""The wheel ships the package ``corr_pipeline`` and nothing else (no tests), with the files
that are not Python that it needs (the migrations' template)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_only_the_package(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("corr_pipeline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert top == {
        "corr_pipeline",
        f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info",
    }
    assert "corr_pipeline/definitions.py" in names
    assert "corr_pipeline/db/migrations/script.py.mako" in names
    assert any(n.startswith("corr_pipeline/db/migrations/versions/") for n in names)
    assert not [n for n in names if "corr_pipeline_tests" in n]
