"""numba's cache is the user's own (corr_pipeline.numba_cache): a read-only cache of kernels
compiled in advance (the image's) is copied into a private directory and loaded from there
without compiling; a ``NUMBA_CACHE_DIR`` another user owns or may write is never used. Real
Python processes that import the package and run a cached kernel; numba's own counters say
whether it was loaded from the cache or compiled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corr_pipeline import numba_cache, settings
from corr_pipeline_tests.fixtures.numba_workload import run_workload

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory to the user nobody")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its size and modification time (ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_a_read_only_compiled_cache_is_copied_privately_and_loaded_without_compiling(
    tmp_path: Path,
) -> None:
    seed, scratch = tmp_path / "seed", tmp_path / "tmp"
    seed.mkdir()
    scratch.mkdir()
    built, _ = run_workload({"NUMBA_CACHE_DIR": str(seed), settings.ENV_NUMBA_CACHE: None})
    assert built["misses"] == 1 and built["hits"] == 0  # compiled into the seed
    assert any(name.endswith(".nbc") for name in built["files"])
    for path in (seed, *seed.rglob("*")):  # the image's: read-only
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = _tree(seed)

    run, _ = run_workload(
        {"NUMBA_CACHE_DIR": None, settings.ENV_NUMBA_CACHE: str(seed), "TMPDIR": str(scratch)}
    )
    private = Path(run["cache"])
    assert private.parent == scratch and private.name.startswith(numba_cache.PRIVATE_PREFIX)
    assert run["mode"] == 0o700
    assert (run["hits"], run["misses"]) == (1, 0)  # loaded, not compiled
    assert run["files"] == sorted(before)  # nothing new written: no .nbc, no index entry
    assert _tree(seed) == before
    assert not private.exists()  # removed when the process ended


@pytest.mark.parametrize("state", ["0777", pytest.param("nobody's", marks=needs_root)])
def test_a_numba_cache_dir_another_user_controls_is_never_used(tmp_path: Path, state: str) -> None:
    planted, scratch = tmp_path / "shared-numba-cache", tmp_path / "tmp"
    planted.mkdir()
    scratch.mkdir()
    planted.chmod(0o777 if state == "0777" else 0o755)
    if state != "0777":
        os.chown(planted, NOBODY, NOBODY)
    run, stderr = run_workload(
        {"NUMBA_CACHE_DIR": str(planted), settings.ENV_NUMBA_CACHE: None, "TMPDIR": str(scratch)}
    )
    assert Path(run["cache"]).parent == scratch and run["mode"] == 0o700
    assert list(planted.iterdir()) == []  # nothing read from it, nothing written to it
    why = "mode 0777" if state == "0777" else f"belongs to uid {NOBODY}"
    (line,) = [line for line in stderr.splitlines() if "NUMBA_CACHE_DIR=" in line]
    assert f"NUMBA_CACHE_DIR={planted} is not used: {planted}" in line and why in line


def test_the_users_own_numba_cache_dir_is_used_as_it_is(tmp_path: Path) -> None:
    own = tmp_path / "numba"
    own.mkdir(mode=0o700)
    first, _ = run_workload({"NUMBA_CACHE_DIR": str(own), settings.ENV_NUMBA_CACHE: None})
    again, _ = run_workload({"NUMBA_CACHE_DIR": str(own), settings.ENV_NUMBA_CACHE: None})
    assert first["cache"] == again["cache"] == str(own)
    assert (first["misses"], again["hits"], again["misses"]) == (1, 1, 0)
