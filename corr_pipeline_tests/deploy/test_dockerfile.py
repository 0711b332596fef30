"""The user code image's Dockerfile fails closed: its base image only by digest, every install
step able to fail the build. No container engine here, so the Dockerfile's own shell commands
run under ``sh`` with the build arguments a build would give them."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments left out."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_base_image_is_a_build_argument_without_default() -> None:
    steps = _instructions()
    assert steps[0] == ("ARG", "PYTHON_IMAGE")  # no "=default": a tag cannot slip in
    assert [args for word, args in steps if word == "FROM"] == ["${PYTHON_IMAGE}"]


@pytest.mark.parametrize(
    ("image", "code"),
    [
        ("python:3.11-slim-bookworm", 1),
        ("python:3.11-slim-bookworm@sha256:" + "0" * 64, 0),
    ],
)
def test_an_image_without_a_digest_stops_the_build(image: str, code: int) -> None:
    (guard,) = [args for word, args in _instructions() if word == "RUN" and "sha256" in args]
    done = subprocess.run(
        ["sh", "-c", guard], env={"PYTHON_IMAGE": image}, capture_output=True, text=True
    )
    assert done.returncode == code, done
    assert ("by digest" in done.stderr) == bool(code)


def test_no_install_failure_is_hidden() -> None:
    runs = [args for word, args in _instructions() if word == "RUN"]
    assert runs and all("||" not in args for args in runs), runs
    (install,) = [args for args in runs if "pip install" in args]
    assert install.split()[:3] == ["set", "-eu", "&&"]
    extras = re.findall(r'"\.\[([a-z0-9,]+)\]"', install)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras == ["k8s,dask"] and all(e in declared for e in extras[0].split(","))
