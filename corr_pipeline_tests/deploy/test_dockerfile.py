"""The user code image's Dockerfile fails closed: its base image only by digest, every install
step able to fail the build; numba's kernels are compiled into a read-only cache of root's that
each process copies into a private one, and no shared ``/tmp`` path is configured. No container
engine here, so the Dockerfile's own shell commands run under ``sh`` with the build arguments a
build would give them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from corr_pipeline import settings
from corr_pipeline_tests.fixtures.numba_workload import run_workload

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
CONFIG = ROOT / "deploy" / "k8s" / "config.yaml"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with comments left out (also between continuation lines, as
    Docker does) and continuation lines joined."""
    lines = [
        line for line in DOCKERFILE.read_text().splitlines() if not line.strip().startswith("#")
    ]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _image_env() -> dict[str, str]:
    """The image's ``ENV`` variables."""
    env: dict[str, str] = {}
    for word, args in _instructions():
        if word == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


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


def test_no_shared_tmp_path_and_no_numba_cache_dir_is_configured() -> None:
    """A fixed name in a world-writable directory is one another user can create first (a numba
    cache is pickles: code run as its reader). The image sets no ``/tmp`` path and no
    ``NUMBA_CACHE_DIR``; neither does any manifest of ``deploy/``. The ConfigMap's one ``/tmp``
    path is the home in the pod's own ``emptyDir``, which the package refuses when it is not the
    pod user's alone."""
    env = _image_env()
    assert "NUMBA_CACHE_DIR" not in env
    assert not [k for k, v in env.items() if v.startswith("/tmp")], env
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        assert not re.search(r"(?m)^[^#]*NUMBA_CACHE_DIR", path.read_text()), path
    (config,) = [
        d for d in yaml.safe_load_all(CONFIG.read_text()) if d and d["kind"] == "ConfigMap"
    ]
    in_tmp = {k for k, v in config["data"].items() if str(v).startswith("/tmp")}
    assert in_tmp == {settings.ENV_HOME}, in_tmp


def _steps_as_users() -> list[tuple[str, str]]:
    """``(user, RUN arguments)`` of every RUN, with the USER it runs as."""
    user, out = "root", []
    for word, args in _instructions():
        if word == "USER":
            user = args
        elif word == "RUN":
            out.append((user, args))
    return out


def test_the_kernels_are_compiled_at_build_into_a_read_only_cache_of_roots() -> None:
    cache = _image_env()[settings.ENV_NUMBA_CACHE]
    assert cache.startswith("/opt/") and not cache.startswith("/tmp")
    steps = _steps_as_users()
    (compile_at,) = [i for i, (_, args) in enumerate(steps) if "corr-pipeline bench" in args]
    user, args = steps[compile_at]
    assert user == "1000" and f'NUMBA_CACHE_DIR="${settings.ENV_NUMBA_CACHE}"' in args
    (seal_at,) = [i for i, (_, args) in enumerate(steps) if "chmod -R a-w" in args]
    user, args = steps[seal_at]
    assert user == "root" and seal_at > compile_at
    assert f'chown -R root:root "${settings.ENV_NUMBA_CACHE}"' in args
    assert [args for word, args in _instructions() if word == "USER"][-1] == "1000"


@pytest.mark.skipif(os.geteuid() != 0, reason="the step gives the cache to root")
def test_the_sealed_cache_is_what_each_process_copies_and_loads(tmp_path: Path) -> None:
    """The Dockerfile's own sealing step, run on a cache compiled here; then a process started
    with the image's variable copies it into a private directory and loads the kernel from the
    copy without compiling, leaving the sealed cache as it was."""
    cache, scratch = tmp_path / "numba-cache", tmp_path / "tmp"
    cache.mkdir()
    scratch.mkdir()
    built, _ = run_workload({"NUMBA_CACHE_DIR": str(cache), settings.ENV_NUMBA_CACHE: None})
    assert built["misses"] == 1
    (seal,) = [args for _, args in _steps_as_users() if "chmod -R a-w" in args]
    env = {**os.environ, settings.ENV_NUMBA_CACHE: str(cache)}
    assert subprocess.run(["sh", "-c", seal], env=env, timeout=60).returncode == 0
    sealed = {}
    for path in (cache, *cache.rglob("*")):
        st = path.stat()
        assert st.st_uid == 0 and st.st_mode & 0o222 == 0 and st.st_mode & 0o004, path
        sealed[path] = (st.st_mode, st.st_size, st.st_mtime_ns)
    run, _ = run_workload(
        {"NUMBA_CACHE_DIR": None, settings.ENV_NUMBA_CACHE: str(cache), "TMPDIR": str(scratch)}
    )
    assert Path(run["cache"]).parent == scratch and run["mode"] == 0o700
    assert (run["hits"], run["misses"]) == (1, 0)
    assert {p: (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns) for p in sealed} == sealed
