"""``corr-pipeline demo``: seed an empty database, materialize the latest partition, summarize."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
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


def _suggested_commands(lines: list[str]) -> list[str]:
    """The commands of the demo's last lines, from ``try next:`` on, without their comments."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("try next:"))
    tail = [line.split("try next:", 1)[-1] for line in lines[start:]]
    return [line.split("  #", 1)[0].strip() for line in tail]


@pytest.mark.slow
def test_demo_seeds_launches_and_explains_the_ui(
    clean_db: sa.Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd,
    env_files_apply: None,
) -> None:
    """The demo from the project root: seeds, sets the first partition to the first session with
    a full window (in ./.env, keeping the file's other lines), launches its run through the
    instance (with its code-location origin), keeps the runs' INFO lines off the terminal (in
    their event log), says the freshness verdict as the UI does, explains the UI and ends with
    queries that run on what it published."""
    root = _project_root(tmp_path)
    (root / ".env").write_text("# the team's own\nSOMETHING_ELSE=1\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    monkeypatch.delenv(settings.ENV_PARTITION_START, raising=False)
    lines: list[str] = []
    ctx = DemoContext(symbols=200, days=DAYS, seed=11, echo=lines.append)
    run_demo(ctx)
    text = "\n".join(lines)
    # the terminal: the summary, and no line of Dagster's (the runs' workers write to the same
    # terminal: captured here at the file descriptors)
    printed = capfd.readouterr()
    terminal = (printed.out + printed.err).splitlines()
    assert not [line for line in terminal if " - dagster - " in line], printed
    assert "did not yield" not in printed.out + printed.err + text
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
    # ... with severity WARN: the UI shows "Failed (Warning)" in yellow, not a red failure
    assert freshness.strip().startswith(
        "publication_freshness failed (warning; yellow in the UI, not red): "
    ), freshness
    assert "FAILED" not in freshness
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
    # the run's INFO lines are in its event log (the UI's run page), Dagster's complaint is not
    with dg.DagsterInstance.from_config(str(settings.dagster_home())) as instance:
        messages = [entry.message for entry in instance.all_logs(run.run_id)]
    assert any(m.startswith(f"loading the windows of {KEY}") for m in messages), messages
    assert not [m for m in messages if "did not yield" in m]

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

    # the demo ends with three queries to try, each of which runs on what it published
    commands = _suggested_commands(lines)
    assert len(commands) == 3 and lines[-3].strip().startswith("try next:"), lines[-5:]
    assert [c.split()[:3] for c in commands] == [
        ["corr-pipeline", "query", "lead-lag"],
        ["corr-pipeline", "query", "peers"],
        ["corr-pipeline", "query", "quality"],
    ], commands
    symbol = shlex.split(commands[0])[3]
    answers = {
        "lead-lag": f"lead-lag pairs of {symbol} in snapshot {KEY}",
        "peers": f"peers of {symbol} in snapshot {KEY}",
        "quality": f"suspect prices in snapshot {KEY}",
    }
    for command in commands:
        ran = subprocess.run(
            ["bash", "-c", command],
            cwd=root,
            env=settings.child_environment(str(REPO)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
        assert answers[command.split()[2]] in ran.stdout, (command, ran.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["elsewhere", "off"])
def test_demo_writes_no_env_file_elsewhere_or_when_told(
    clean_db: sa.Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_files_apply: None,
    where: str,
) -> None:
    """Outside the project root, or in it with ``CORR_PIPELINE_ENV_FILE=off``, the first
    partition goes into the UI commands the demo prints, not into a .env; the partition step
    alone (no run)."""
    from corr_pipeline.cli.demo import demo_step_database, demo_step_partitions, demo_step_prices

    cwd = tmp_path if where == "elsewhere" else _project_root(tmp_path)
    if where == "off":
        monkeypatch.setenv(settings.ENV_ENV_FILE, "off")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    monkeypatch.delenv(settings.ENV_PARTITION_START, raising=False)
    lines: list[str] = []
    ctx = DemoContext(symbols=20, days=40, seed=3, echo=lines.append)
    run_demo(ctx, steps=[demo_step_database, demo_step_prices, demo_step_partitions])
    assert not (cwd / ".env").exists()
    why = (
        "CORR_PIPELINE_ENV_FILE=off"
        if where == "off"
        else f"{Path.cwd()} is not the repository root"
    )
    assert any(f"not written ({why}): set it for the UI" in line for line in lines), lines
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
