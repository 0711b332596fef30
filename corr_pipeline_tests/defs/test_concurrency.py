"""The limit of snapshot runs at once, sized by memory and cores: the sizing formula, the limits the
repository's ``dagster.yaml`` gives an instance, and ``corr-pipeline concurrency show|set``.
(The limits at work, a backfill through the daemon: ``test_parallel_backfill.py``.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import pytest

from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.concurrency import instance_limits, set_snapshot_runs_limit
from corr_pipeline.defs.run import REPO_DAGSTER_YAML
from corr_pipeline.defs.step_options import SNAPSHOT_POOL
from corr_pipeline.snapshot import sizing
from corr_pipeline_tests.fixtures.commands import run_cli

MIB = sizing.MIB


def test_run_memory_terms_follow_the_formula():
    n, t, w = 24_000, 252, 512
    m = sizing.run_memory(n, t, w)
    assert m.process == sizing.PROCESS_BYTES
    assert (
        m.largest_stage == max(4 * n * (n - 1), 64 * t * n) + w * MIB == 4 * n * (n - 1) + w * MIB
    )
    assert m.matrices == 2 * 6 * n * n  # the session's and its predecessor's
    assert m.per_run == m.process + m.largest_stage + m.matrices
    # small N: a table stage (T x N tables + the budget) is the largest
    small = sizing.run_memory(500, 252, 512)
    assert small.largest_stage == 64 * 252 * 500 + 512 * MIB


def test_run_memory_covers_the_measured_n24000_stages():
    """The whole snapshot at N = 24,000 (22,465 kept), T = 252, ``working_memory_mb`` 256,
    measured with the clusters' distances on the heap: the clusters' 2,292 MiB of peak
    RssAnon, interpreter included, is the largest stage; the stages run one after the other in
    the run worker."""
    m = sizing.run_memory(22_465, 252, 256)
    measured = 2_292 * MIB
    assert m.process + m.largest_stage >= measured
    assert m.process + m.largest_stage <= 1.5 * measured  # an estimate, not a blanket


def test_sessions_per_run_fill_half_the_runtime():
    hours4 = 4 * 3600
    assert sizing.sessions_per_run(500, 252, hours4) == sizing.MAX_SESSIONS_PER_RUN
    at_24k = sizing.sessions_per_run(24_000, 252, hours4)
    assert at_24k == int(sizing.RUNTIME_SHARE * hours4 / sizing.session_seconds(24_000, 252))
    assert 50 <= at_24k <= 250  # a few hours of sessions at about a minute each
    assert sizing.sessions_per_run(200_000, 252, 60) == 1  # never none


def test_runs_limit_is_the_floor_and_at_least_one():
    per_run = 7 * sizing.GIB
    assert sizing.runs_limit(24 * sizing.GIB, per_run, 2 * sizing.GIB) == 3
    assert sizing.runs_limit(23 * sizing.GIB - 1, per_run, 2 * sizing.GIB) == 2
    assert sizing.runs_limit(4 * sizing.GIB, per_run, 2 * sizing.GIB) == 1
    with pytest.raises(ValueError, match="per_run_bytes"):
        sizing.runs_limit(1, 0, 0)
    with pytest.raises(ValueError, match="N and T"):
        sizing.run_memory(0, 252, 512)
    assert (
        0
        < sizing.machine_memory_bytes()
        <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    )


def test_runs_at_once_is_bounded_by_cores_as_well_as_memory():
    per_run = sizing.run_memory(3_000, 252, 512).per_run
    runs = sizing.runs_at_once(24 * sizing.GIB, per_run, sizing.DEFAULT_RESERVE_BYTES, 2)
    assert runs.by_memory == 24 and runs.by_cores == 2
    assert (runs.limit, runs.binding) == (2, "cores")
    roomy = sizing.runs_at_once(24 * sizing.GIB, 7 * sizing.GIB, 2 * sizing.GIB, 64)
    assert (roomy.limit, roomy.binding) == (3, "memory")
    even = sizing.runs_at_once(24 * sizing.GIB, 7 * sizing.GIB, 2 * sizing.GIB, 3)
    assert (even.limit, even.binding) == (3, "memory and cores")
    with pytest.raises(ValueError, match="cores"):
        sizing.runs_at_once(24 * sizing.GIB, per_run, 0, 0)


def test_concurrency_show_says_which_bound_binds(tmp_path: Path):
    """At N = 3,000 a 24 GiB machine holds the memory of 24 runs; on 2 cores 2 run at once,
    and the output says the cores bind; by default the cores are this process's."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    env = dict(os.environ, DAGSTER_HOME=str(home))
    sizing_args = ("concurrency", "show", "--n", "3000", "--memory-gib", "24")
    shown = run_cli(*sizing_args, "--cores", "2", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "  runs that fit the memory: 24 = max(1, floor((24.00 GiB" in shown.stdout
    assert "cores: 2 (--cores)" in shown.stdout
    assert "snapshot runs at once: 2 = min(24 by memory, 2 by cores): the cores bind" in (
        shown.stdout
    )
    many = run_cli(*sizing_args, "--cores", "64", env=env)
    assert "snapshot runs at once: 24 = min(24 by memory, 64 by cores): the memory binds" in (
        many.stdout
    )
    cores = len(os.sched_getaffinity(0))
    default = run_cli(*sizing_args, env=env)
    assert f"cores: {cores} (this machine's, its CPU affinity)" in default.stdout
    assert f"snapshot runs at once: {min(24, cores)} = min(24 by memory, {cores} by cores)" in (
        default.stdout
    )


def test_every_snapshot_asset_declares_the_pool():
    pools = {
        key.to_user_string(): asset.op.pool
        for asset in snapshot_assets
        if isinstance(asset, dg.AssetsDefinition)
        for key in asset.keys
    }
    assert "snapshot_publication" in pools and "clusters" in pools, pools
    assert set(pools.values()) == {SNAPSHOT_POOL}, pools


@pytest.fixture
def repo_instance(tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        yield instance
    finally:
        instance.dispose()


def test_repository_dagster_yaml_limits(repo_instance):
    limits = instance_limits(repo_instance)
    assert limits.granularity == "run"  # the pool counts runs
    assert limits.per_partition == 1  # one run per partition
    assert limits.snapshot_runs == 1 and not limits.explicit  # pools.default_limit
    assert limits.max_concurrent_runs >= 8
    set_snapshot_runs_limit(repo_instance, 3)
    limits = instance_limits(repo_instance)
    assert limits.snapshot_runs == 3 and limits.explicit
    with pytest.raises(ValueError, match="max_concurrent_runs"):
        set_snapshot_runs_limit(repo_instance, limits.max_concurrent_runs + 1)
    with pytest.raises(ValueError, match=">= 1"):
        set_snapshot_runs_limit(repo_instance, 0)


def test_concurrency_commands(tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    env = dict(os.environ, DAGSTER_HOME=str(home))
    sized = ("--n", "24000", "--memory-gib", "64", "--cores", "16")
    shown = run_cli("concurrency", "show", *sized, env=env)
    assert shown.returncode == 0, shown.stderr
    per_run = sizing.run_memory(24_000, 252, 512).per_run
    expected = sizing.runs_limit(64 * sizing.GIB, per_run, sizing.DEFAULT_RESERVE_BYTES)
    assert f"snapshot runs at once: {expected} = min({expected} by memory, 16 by cores)" in (
        shown.stdout
    )
    assert "snapshot runs at once (pool): 1 (dagster.yaml's pools.default_limit)" in shown.stdout
    assert "runs per partition at once:   1" in shown.stdout
    set_ = run_cli("concurrency", "set", *sized, "--reserve-gib", "0", env=env)
    assert set_.returncode == 0, set_.stderr
    limit = sizing.runs_limit(64 * sizing.GIB, per_run, 0)
    assert f"snapshot runs at once set to {limit}" in set_.stdout
    assert f"snapshot runs at once (pool): {limit} (set in the instance)" in set_.stdout
    refused = run_cli("concurrency", "set", "99", env=env)
    assert refused.returncode == 2 and "max_concurrent_runs" in refused.stderr
    missing = run_cli("concurrency", "set", env=env)
    assert missing.returncode == 2 and "give the LIMIT" in missing.stderr
