"""``corr-pipeline demo``: seed an empty database, materialize the latest partition, summarize."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import exchange_calendars as xcals
import pytest
import sqlalchemy as sa

from corr_pipeline import project_env, settings
from corr_pipeline.cli.demo import DemoContext, demo_params, first_full_window_session, run_demo
from corr_pipeline.db.synth import write_synthetic_universe

REPO = Path(__file__).resolve().parents[2]
KEY = "2026-11-27"
PREVIOUS = "2026-11-25"
DAYS = 262  # weekdays: a full default window (252 returns) from the 253rd trade date on

#: Loads the code location in a new process the way ``dagster dev`` / ``dg dev`` do: Dagster's
#: own .env injection for the directory it runs in, then the definitions.
LOAD_AS_DAGSTER_DOES = """
import json, sys
from dagster._cli.utils import get_possibly_temporary_instance_for_cli
with get_possibly_temporary_instance_for_cli("test"):
    from corr_pipeline.definitions import defs
    job = defs.resolve_job_def("snapshot_job")
    keys = job.partitions_def.get_partition_keys()
print(json.dumps({"first": keys[0], "has": sys.argv[1] in keys}))
"""


def _project_root(tmp_path: Path) -> Path:
    """A copy of the repository root's Dagster files: where the docs run the demo and dg dev."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("dagster.yaml", "pyproject.toml", "workspace.yaml"):
        (root / name).write_bytes((REPO / name).read_bytes())
    return root


def _trade_dates(engine: sa.Engine) -> list[dt.date]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT DISTINCT trade_date FROM prices ORDER BY 1")).scalars()
        )


def test_demo_seeds_launches_and_explains_the_ui(
    clean_db: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo from the project root: seeds, sets the first partition to the first session with
    a full window (in ./.env, keeping the file's other lines), launches its run through the
    instance (with its code-location origin) and explains the UI."""
    root = _project_root(tmp_path)
    (root / ".env").write_text("# the team's own\nSOMETHING_ELSE=1\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    monkeypatch.delenv(settings.ENV_PARTITION_START, raising=False)
    lines: list[str] = []
    ctx = DemoContext(symbols=200, days=DAYS, seed=11, echo=lines.append)
    run_demo(ctx)
    text = "\n".join(lines)
    assert "seeding a synthetic universe of 200 symbols" in text
    # two sessions: the one before KEY (Thanksgiving, 2026-11-26, is no session) and KEY, so
    # that KEY's changes compare something on first sight
    assert f"pipeline: materializing snapshot_job for partitions {PREVIOUS} and {KEY}" in text
    assert "short price history" not in text
    assert f"snapshot {PREVIOUS} succeeded" in text and f"snapshot {KEY} succeeded" in text
    assert text.index(f"snapshot {PREVIOUS} succeeded") < text.index(f"snapshot {KEY} succeeded")
    assert "changes: no snapshot before" in text  # the first session has nothing to compare
    assert re.search(
        rf"changes against {PREVIOUS}: \d+ symbols in common, mean \|Δcorr\| 0\.\d+", text
    )
    assert text.count("checks: 9/9 passed") == 2
    # the summary says how many lead-lag pairs are significant and how many two-way
    assert (
        len(re.findall(r"\d+ lead-lag pairs, \d+ significant at q ≤ [0-9.e-]+, \d+ two-way", text))
        == 2
    ), text
    # the freshness check was evaluated once (the UI shows a verdict, not "not evaluated"); the
    # synthetic prices end on KEY, so a later session cannot be published, and it says so
    (freshness,) = [line for line in lines if "publication_freshness" in line]
    assert f"the prices end on {KEY}: no snapshot of " in freshness, freshness
    assert "DAGSTER_HOME=" in text and " corr-pipeline ui" in text and " dg dev" not in text

    # the first partition: the first XNYS session on or after the 253rd trade date (brute force)
    dates = _trade_dates(clean_db)
    sessions = [
        s.date()
        for s in xcals.get_calendar("XNYS", start=dates[0], end=KEY).sessions
        if s.date() >= dates[252]
    ]
    first = sessions[0]
    assert sum(d <= first for d in dates) >= 253
    previous = xcals.get_calendar("XNYS", start=dates[0], end=KEY).previous_session(first).date()
    assert sum(d <= previous for d in dates) < 253  # one session earlier: the window is short
    assert f"[3] partitions: {first} .. {KEY}" in text
    env_lines = (root / ".env").read_text().splitlines()
    assert env_lines[:2] == ["# the team's own", "SOMETHING_ELSE=1"]
    assert env_lines[-1] == f"{settings.ENV_PARTITION_START}={first}"
    assert any("corr-pipeline demo" in line for line in env_lines if line.startswith("#"))

    # the code location, loaded in a new process as dagster dev / dg dev load it (.env of the
    # directory they run in), starts at that session and holds the demo's partition
    env = settings.child_environment(str(REPO))
    env.pop(settings.ENV_PARTITION_START, None)
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_AS_DAGSTER_DOES, KEY],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(loaded.stdout.splitlines()[-1]) == {"first": str(first), "has": True}
    # ... and so does every corr-pipeline command (the same file, the same precedence)
    monkeypatch.setenv(settings.ENV_PARTITION_START, "2020-01-01")
    with project_env.env_file_applied():
        assert settings.partition_start() == first
    assert settings.partition_start() == dt.date(2020, 1, 1)  # restored afterwards

    # the demo's run went through the instance: origin, job tags, partition tags
    run_id = re.search(rf"snapshot {KEY} succeeded \(run ([0-9a-f-]+)\)", text)
    assert run_id, text
    with dg.DagsterInstance.from_config(str(settings.dagster_home())) as instance:
        run = instance.get_run_by_id(run_id.group(1))
    assert run is not None and run.tags["dagster/partition"] == KEY
    assert run.remote_job_origin is not None
    assert run.remote_job_origin.location_name == "corr_pipeline"
    assert run.remote_job_origin.job_name == "snapshot_job"
    assert run.tags[dg.MAX_RUNTIME_SECONDS_TAG] == str(settings.max_runtime_seconds())
    assert run.tags["dagster/partition_set"] == "snapshot_job_partition_set"
    assert run.status == dg.DagsterRunStatus.SUCCESS

    with clean_db.connect() as conn:
        row = conn.execute(
            sa.text("SELECT n_symbols, lookback_days FROM snapshots WHERE snapshot_date = :d"),
            {"d": KEY},
        ).one()
        clusters = conn.execute(
            sa.text("SELECT count(*) FROM symbol_clusters WHERE snapshot_date = :d"),
            {"d": KEY},
        ).scalar_one()
    assert row.lookback_days == 252
    assert clusters == row.n_symbols > 150
    assert f"{row.n_symbols} symbols kept" in text


def test_demo_outside_the_project_root_writes_no_env_file(
    clean_db: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Elsewhere the first partition goes into the UI commands the demo prints, not into a .env
    that no Dagster command would read; the partition step alone (no run)."""
    from corr_pipeline.cli.demo import demo_step_database, demo_step_partitions, demo_step_prices

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    monkeypatch.delenv(settings.ENV_PARTITION_START, raising=False)
    lines: list[str] = []
    ctx = DemoContext(symbols=20, days=40, seed=3, echo=lines.append)
    run_demo(ctx, steps=[demo_step_database, demo_step_prices, demo_step_partitions])
    assert not (tmp_path / ".env").exists()
    # 40 weekdays: the whole history is the window, so the only full one is the last session's
    assert ctx.ui_env == {settings.ENV_PARTITION_START: KEY}
    # exported for the demo's own run only: the process environment is restored afterwards
    assert settings.ENV_PARTITION_START not in os.environ
    assert "not written" in lines[-1]


def test_first_full_window_session_skips_a_holiday(clean_db: sa.Engine) -> None:
    """A (lookback + 1)-th trade date on a holiday (the synthetic universe prices every weekday):
    the first partition is the next session."""
    write_synthetic_universe(clean_db, n_symbols=10, n_days=30, seed=2)
    dates = _trade_dates(clean_db)
    thanksgiving = dt.date(2026, 11, 26)
    n = dates.index(thanksgiving) + 1
    assert first_full_window_session(clean_db, n - 1, dt.date(2026, 11, 27)) == dt.date(
        2026, 11, 27
    )
    assert first_full_window_session(clean_db, n - 2, dt.date(2026, 11, 27)) == dt.date(
        2026, 11, 25
    )


def test_demo_params_keep_defaults_for_a_full_window(clean_db: sa.Engine) -> None:
    write_synthetic_universe(clean_db, n_symbols=20, n_days=260, seed=1)
    assert demo_params(clean_db, "2026-11-27") == {}
    shorter = demo_params(clean_db, "2026-06-01")
    assert shorter["lookback_days"] < 252
    assert shorter["min_overlap"] <= shorter["min_history_days"] <= shorter["lookback_days"]
