"""``corr-pipeline backfill`` (:mod:`corr_pipeline.cli.backfill`, :mod:`corr_pipeline.defs.backfill`).

- Unit: :meth:`BackfillPlan.runs` (consecutive pending sessions, at most ``per_run`` each, never
  across a current or left-out session; checked against a brute-force reference on random
  plans) and :func:`session_is_current`.
- End to end, on the real PostgreSQL and a real Dagster instance (a temporary ``DAGSTER_HOME``
  with the repository's ``dagster.yaml``, no daemon, so every run is launched directly), the
  command as a real subprocess. The synthetic universe (80 symbols x 120 weekdays ending
  2026-11-27) starts on 2026-06-15, so with ``min_history_days=40`` the sessions 2026-08-06 and
  2026-08-07 (39 and 40 trade dates, 38 and 39 returns) lack history and the six sessions
  2026-08-10 .. 2026-08-17 have enough. The reference is what single-session runs
  (``dg.materialize(snapshot_assets, partition_key=...)``, in date order) publish for those six
  sessions.

  1. A range whose first two sessions fail (a window error in ``returns_matrix``): exit 1, each
     failure named with its reason, the six good sessions published by further runs, row for
     row as the reference; the same command again recomputes nothing of them and still reports
     the two failures.
  2. A backfill SIGKILLed (its whole process group) after its first publication: every
     published session is consistent; the killed run is marked failed (as the daemon's run
     monitoring would); the same command again computes only the sessions not yet current and
     ends with every session equal to the reference.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import dagster as dg
import psutil
import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.published_reads import PublishedSession, change_staleness
from corr_pipeline.db.schema import PUBLISHED_TABLES, truncate_all
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.backfill import BackfillPlan
from corr_pipeline.defs.location import build_resources
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.run import REPO_DAGSTER_YAML
from corr_pipeline.snapshot.current import session_is_current
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline_tests.defs.published import published_rows
from corr_pipeline_tests.fixtures.backfill_project import (
    BAD,
    CLI_TIMEOUT_S,
    FIRST_TRADE_DATE,
    GOOD,
    N_DAYS,
    N_SYMBOLS,
    PARAMS,
    PARTITION_START,
    SEED,
    Project,
)

IN_PROGRESS = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _snapshot_part(rows: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {table: rows[table] for table in PUBLISHED_TABLES}


def _created_at(engine: sa.Engine) -> dict[str, dt.datetime]:
    with engine.connect() as conn:
        return {
            str(day): created
            for day, created in conn.execute(
                sa.text("SELECT snapshot_date, created_at FROM snapshots")
            )
        }


def _changes_recorded(engine: sa.Engine) -> dict[str, str]:
    """``{session: previous session}`` of the recorded change sets."""
    with engine.connect() as conn:
        return {
            str(day): str(previous)
            for day, previous in conn.execute(
                sa.text("SELECT snapshot_date, previous_date FROM change_summaries")
            )
        }


def _current_sessions(engine: sa.Engine) -> set[str]:
    """Sessions published with their changes recorded, or the first published one (nothing to
    compare it with): what the backfill must leave alone (computed here from the tables)."""
    published = sorted(_created_at(engine))
    recorded = set(_changes_recorded(engine))
    return {day for i, day in enumerate(published) if i == 0 or day in recorded}


def _assert_consistent(engine: sa.Engine, day: str) -> None:
    """A published session is whole: one snapshots row whose n_symbols every child table
    agrees with, every symbol with its neighbors, and (if recorded) changes that describe the
    publications they compare."""
    with engine.connect() as conn:
        snap = conn.execute(
            sa.text("SELECT n_symbols, params FROM snapshots WHERE snapshot_date = :d"), {"d": day}
        ).one()
        clusters = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT symbol) FROM symbol_clusters "
                    "WHERE snapshot_date = :d"),
            {"d": day},
        ).one()  # fmt: skip
        neighbors = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT symbol), max(rank) FROM peer_neighbors "
                    "WHERE snapshot_date = :d"),
            {"d": day},
        ).one()  # fmt: skip
        pairs = conn.execute(
            sa.text("SELECT count(*) FROM lead_lag_pairs WHERE snapshot_date = :d"), {"d": day}
        ).scalar_one()
        summary = (
            conn.execute(
                sa.text("SELECT * FROM change_summaries WHERE snapshot_date = :d"), {"d": day}
            )
            .mappings()
            .first()
        )
        stale = change_staleness(conn, summary) if summary is not None else []
    n = snap.n_symbols
    k = PARAMS["k_neighbors"]
    assert n > 10, (day, n)
    assert tuple(clusters) == (n, n), (day, n, clusters)
    assert neighbors[1] == n and neighbors[0] <= n * k and neighbors[2] <= k, (day, neighbors)
    assert pairs > 0, day
    assert all(snap.params[name] == value for name, value in PARAMS.items()), snap.params
    assert not stale, (day, stale)


def _write_universe(engine: sa.Engine) -> None:
    report = write_synthetic_universe(engine, n_symbols=N_SYMBOLS, n_days=N_DAYS, seed=SEED)
    assert str(report.last_date) == "2026-11-27"
    with engine.connect() as conn:
        first = conn.execute(sa.text("SELECT min(trade_date) FROM prices")).scalar_one()
        dates = conn.execute(
            sa.text("SELECT count(DISTINCT trade_date) FROM prices WHERE trade_date <= :d"),
            {"d": GOOD[0]},
        ).scalar_one()
    assert first == FIRST_TRADE_DATE
    assert dates == PARAMS["min_history_days"] + 1  # the first good session: just enough


@pytest.fixture
def project(clean_db: sa.Engine, tmp_path: Path) -> Project:
    _write_universe(clean_db)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    root = tmp_path / "cwd"  # no .env, no dagster.yaml: only the environment below applies
    root.mkdir()
    env = dict(os.environ)
    env.update(
        {
            "DAGSTER_HOME": str(home),
            settings.ENV_HOME: str(tmp_path / "corr_home"),
            settings.ENV_STORE_DIR: str(tmp_path / "store"),
            settings.ENV_PARTITION_START: PARTITION_START,
        }
    )
    assert env.get(settings.ENV_DATABASE_URL)  # the test database (conftest)
    return Project(clean_db, root, home, env)


@pytest.fixture(scope="module")
def reference(engine: sa.Engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The rows single-session runs publish for :data:`GOOD`, one run per session in date order
    (on the test database, emptied again afterwards)."""
    truncate_all(engine)
    _write_universe(engine)
    store = tmp_path_factory.mktemp("reference_store")
    # a module fixture is set up before the test's own deployment_settings_restored takes its
    # copy: the store it chooses is undone here, or the next tests of this worker would use it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(settings.ENV_STORE_DIR, str(store))  # undone on leaving, unlike resources_at
        resources = build_resources()
        resources["snapshot_params"] = SnapshotParams(**PARAMS)
        try:
            for day in GOOD:
                result = dg.materialize(snapshot_assets, partition_key=day, resources=resources)
                assert result.success, day
            rows = {day: published_rows(engine, day) for day in GOOD}
        finally:
            truncate_all(engine)
    for day in GOOD:
        assert rows[day]["snapshots"] and rows[day]["symbol_clusters"], day
    assert not rows[GOOD[0]]["change_summaries"]  # the first published: nothing to compare
    assert all(rows[day]["change_summaries"] and rows[day]["change_pairs"] for day in GOOD[1:])
    return rows


def _summary(output: str) -> re.Match[str]:
    match = re.search(
        r"^backfill (\S+)\.\.(\S+): (\d+) session\(s\) published in (\d+) run\(s\) .*; "
        r"(\d+) already current; (\d+) failed$",
        output,
        re.MULTILINE,
    )
    assert match, output
    return match


def _plan_line(output: str, first: str, last: str, n: int, current: int, per_run: int) -> None:
    expected = (
        f"backfill {first}..{last}: {n} sessions, {current} current, {n - current} to compute, "
        f"at most {per_run} per run ("
    )
    assert expected in output, output


def _failed_reasons(output: str) -> dict[str, str]:
    return dict(re.findall(r"^  FAILED (\S+): (.*)$", output, re.MULTILINE))


def _assert_window_failures(output: str) -> None:
    """The summary names exactly the sessions of :data:`BAD`, each with a reason that says its
    window is too short."""
    reasons = _failed_reasons(output)
    assert sorted(reasons) == BAD, output
    for day, reason in reasons.items():
        assert re.search(r"window|history", reason, re.IGNORECASE), (day, reason)
        assert "min_history_days=40" in reason, (day, reason)
        assert f"on or before {day}" in reason, (day, reason)  # its own window, not another's
    assert "run the same command again" in output


def _assert_runs_shape(runs: list[list[str]], per_run: int, keys: list[str]) -> None:
    """Every run covers consecutive sessions of ``keys``, at most ``per_run``; the runs start
    in date order (one after the other, each session's changes against the one before)."""
    for sessions in runs:
        assert 1 <= len(sessions) <= per_run, runs
        start = keys.index(sessions[0])
        assert sessions == keys[start : start + len(sessions)], runs
    assert [r[0] for r in runs] == sorted(r[0] for r in runs), runs


# --------------------------------------------------------------------------------------------
# 1. unit: BackfillPlan.runs and session_is_current
# --------------------------------------------------------------------------------------------

KEYS = [f"2026-03-{d:02d}" for d in (2, 3, 4, 5, 6, 9, 10, 11, 12, 13)]


def _plan(pending: list[str], per_run: int, keys: list[str] = KEYS) -> BackfillPlan:
    return BackfillPlan(
        sessions=list(keys),
        current=[k for k in keys if k not in pending],
        pending=list(pending),
        per_run=per_run,
        n_symbols=100,
    )


def _expected_runs(keys: list[str], todo: set[str], per_run: int) -> list[list[str]]:
    """Brute force: the maximal blocks of consecutive sessions to do, each cut into pieces of
    ``per_run`` (the fewest runs that never span a session not to do)."""
    blocks: list[list[str]] = [[]]
    for key in keys:
        if key in todo:
            blocks[-1].append(key)
        elif blocks[-1]:
            blocks.append([])
    return [b[i : i + per_run] for b in blocks if b for i in range(0, len(b), per_run)]


def test_runs_are_consecutive_pending_sessions_at_most_per_run():
    k = KEYS
    everything = _plan(k, 3)
    assert everything.runs() == [k[0:3], k[3:6], k[6:9], k[9:10]]
    assert _plan(k, 1).runs() == [[key] for key in k]
    assert _plan(k, 250).runs() == [k]
    # a current session splits the pending ones: no run spans it
    around = _plan([key for key in k if key != k[4]], 3)
    assert around.runs() == [k[0:3], k[3:4], k[5:8], k[8:10]]
    # sessions left out (published or failed meanwhile) split them the same way
    assert around.runs(leave_out=[k[0], k[6]]) == [k[1:4], k[5:6], k[7:10]]
    assert around.runs(leave_out=k) == []
    assert _plan([], 3).runs() == []
    assert _plan([k[9]], 3).runs() == [[k[9]]]
    # the runs a backfill makes as its sessions fail one by one (the first two: no history)
    plan = _plan(k[:8], 3)
    assert plan.runs() == [k[0:3], k[3:6], k[6:8]]
    assert plan.runs(leave_out=[k[0]]) == [k[1:4], k[4:7], k[7:8]]
    assert plan.runs(leave_out=[k[0], k[1]]) == [k[2:5], k[5:8]]
    assert plan.runs(leave_out=[k[0], k[1], *k[2:5]]) == [k[5:8]]


def test_runs_of_random_plans_match_the_brute_force():
    rng = random.Random(20261127)
    for _ in range(2000):
        n = rng.randint(0, len(KEYS))
        keys = KEYS[:n]
        pending = [key for key in keys if rng.random() < 0.7]
        leave_out = [key for key in keys if rng.random() < 0.2]
        per_run = rng.randint(1, 5)
        runs = _plan(pending, per_run, keys).runs(leave_out=leave_out)
        todo = set(pending) - set(leave_out)
        assert runs == _expected_runs(keys, todo, per_run), (keys, pending, leave_out, per_run)
        assert [key for run in runs for key in run] == [key for key in keys if key in todo]


def test_session_is_current():
    params = SnapshotParameters(**PARAMS)
    recorded = {**params.as_dict(), "dagster_run_id": "abc"}  # as snapshots.params holds them
    day = dt.date(2026, 8, 11)

    def published(changes: bool, **changed: Any) -> PublishedSession:
        return PublishedSession(day, {**recorded, **changed}, changes)

    assert not session_is_current(None, params, first_published=False)
    assert not session_is_current(None, params, first_published=True)
    assert session_is_current(published(True), params, first_published=False)
    # changes not recorded: current only when nothing before it is published
    assert not session_is_current(published(False), params, first_published=False)
    assert session_is_current(published(False), params, first_published=True)
    # working_memory_mb does not change a result; every other parameter does
    assert session_is_current(published(True, working_memory_mb=512.0), params, False)
    assert session_is_current(
        published(True), SnapshotParameters(**{**PARAMS, "working_memory_mb": 64}), False
    )
    for name, other in [
        ("lookback_days", 61),
        ("min_history_days", 41),
        ("min_overlap", 31),
        ("k_neighbors", 6),
        ("max_lag", 2),
        ("k_leaders", 4),
        ("k_laggers", 4),
        ("min_improvement", 0.01),
        ("linkage_method", "single"),
        ("distance_threshold", 1.1),
    ]:
        assert not session_is_current(published(True, **{name: other}), params, False), name
        assert not session_is_current(published(False, **{name: other}), params, True), name
    # asked for other parameters than those published
    assert not session_is_current(
        published(True), SnapshotParameters(**{**PARAMS, "k_neighbors": 7}), False
    )
    # a snapshot published before a parameter existed is not current
    older = {k: v for k, v in recorded.items() if k != "k_laggers"}
    assert not session_is_current(PublishedSession(day, older, True), params, False)


# --------------------------------------------------------------------------------------------
# 2. end to end: two sessions without history, then the same command again
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_backfill_publishes_the_good_sessions_and_names_the_failed_ones(project, reference):
    sessions = [*BAD, *GOOD]
    result = project.backfill(BAD[0], GOOD[-1], "--per-run", "3")
    out = result.stdout
    assert result.returncode == 1, (result.returncode, out, result.stderr[-5000:])
    _plan_line(out, BAD[0], GOOD[-1], len(sessions), 0, 3)
    summary = _summary(out)
    assert summary.group(1, 2) == (BAD[0], GOOD[-1])
    assert (summary.group(3), summary.group(5), summary.group(6)) == ("6", "0", "2"), out
    _assert_window_failures(out)
    for day in BAD:
        assert re.search(rf"^  {day} FAILED: .*min_history_days", out, re.MULTILINE), out
    # every session is reported as it is published (of the 8 to compute), every run's step as
    # it ends
    for i, day in enumerate(GOOD, start=1):
        assert f"\n  {day} published ({i}/8)\n" in out, (day, out)
    assert re.search(r"^  snapshot: done in [\d.,]+ s$", out, re.MULTILINE), out

    # the database: the good sessions published with their changes, as single runs publish them
    assert sorted(_created_at(project.engine)) == GOOD
    assert _changes_recorded(project.engine) == dict(zip(GOOD[1:], GOOD[:-1], strict=True))
    for day in GOOD:
        _assert_consistent(project.engine, day)
        assert published_rows(project.engine, day) == reference[day], day

    # the instance: runs of at most 3 consecutive sessions, in date order, each session in one
    # run; a session fails alone: the run that holds the sessions without history publishes
    # its good one and fails, naming them
    runs = project.runs()
    assert int(summary.group(4)) == len(runs), (out, runs)
    _assert_runs_shape([s for _, s, _ in runs], 3, sessions)
    assert sorted(key for _, s, _ in runs for key in s) == sorted(sessions), runs
    failed = [s for _, s, status in runs if status != dg.DagsterRunStatus.SUCCESS]
    assert [key for s in failed for key in s if key in BAD] == BAD, runs
    assert all(set(s) & set(BAD) for s in failed), runs
    assert all(status.value in ("SUCCESS", "FAILURE") for _, _, status in runs), runs
    created = _created_at(project.engine)

    # the same command again: the good sessions are current (nothing recomputed), the bad ones
    # fail again
    again = project.backfill(BAD[0], GOOD[-1], "--per-run", "3")
    out = again.stdout
    assert again.returncode == 1, (again.returncode, out, again.stderr[-5000:])
    _plan_line(out, BAD[0], GOOD[-1], len(sessions), len(GOOD), 3)
    summary = _summary(out)
    assert (summary.group(3), summary.group(5), summary.group(6)) == ("0", "6", "2"), out
    _assert_window_failures(out)
    assert " published (" not in out, out
    assert _created_at(project.engine) == created
    for day in GOOD:
        assert published_rows(project.engine, day) == reference[day], day
    new_runs = project.runs()[len(runs) :]
    assert new_runs and int(summary.group(4)) == len(new_runs), (out, new_runs)
    assert {key for _, s, _ in new_runs for key in s} <= set(BAD), new_runs
    assert all(status == dg.DagsterRunStatus.FAILURE for _, _, status in new_runs), new_runs


# --------------------------------------------------------------------------------------------
# 3. kill and resume
# --------------------------------------------------------------------------------------------


def _group_alive(pgid: int) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


@pytest.mark.slow
def test_a_killed_backfill_resumes_from_its_first_unpublished_session(project, reference):
    log = project.root / "killed.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            project.command(GOOD[0], GOOD[-1], "--per-run", "2"),
            cwd=project.root,
            env=project.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: code server, run worker, steps
        )
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        # the first run's two sessions published: killed before (or while) its changes step
        # runs, so the second is (almost always) published without its changes recorded
        while len(_created_at(project.engine)) < 2:
            assert proc.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, log.read_text()[-5000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while _group_alive(proc.pid):
            assert time.monotonic() < deadline, _group_alive(proc.pid)
            time.sleep(0.1)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)

    # what was published before the kill is whole, and what single runs publish
    published = sorted(_created_at(project.engine))
    assert 1 <= len(published) < len(GOOD), (published, log.read_text()[-3000:])
    assert published == GOOD[: len(published)], published  # in date order
    for day in published:
        _assert_consistent(project.engine, day)
        rows = published_rows(project.engine, day)
        assert _snapshot_part(rows) == _snapshot_part(reference[day]), day
        if rows["change_summaries"]:
            assert rows == reference[day], day
    current = _current_sessions(project.engine)
    kept = {day: at for day, at in _created_at(project.engine).items() if day in current}
    missing = [day for day in GOOD if day not in current]
    assert GOOD[0] in current and missing

    # the killed run stays STARTED: nobody is left to say otherwise, and no daemon runs here
    # whose run monitoring would fail it. The backfill finds its worker gone and fails it
    # itself (fail_dead_runs), instead of refusing to start ("run ... is in progress").
    runs_before = project.runs()
    with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
        in_progress = instance.get_runs(filters=dg.RunsFilter(statuses=IN_PROGRESS))
        assert len(in_progress) == 1, [(r.run_id, r.status) for r in in_progress]
        assert in_progress[0].status == dg.DagsterRunStatus.STARTED, in_progress[0].status
        killed = in_progress[0].run_id
        # the UI says what the database says: the killed run reported each session as it was
        # done, so its materialized sessions are published ones, the first among them
        records = instance.get_records_for_run(
            killed, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        shown = {
            r.asset_materialization.partition
            for r in records
            if r.asset_materialization.asset_key == dg.AssetKey("snapshot_publication")
        }
        assert GOOD[0] in shown and shown <= set(published), (shown, published)

    result = project.backfill(GOOD[0], GOOD[-1], "--per-run", "2")
    out = result.stdout
    assert result.returncode == 0, (result.returncode, out, result.stderr[-5000:])
    assert f"run {killed[:8]} " in out and "marked failed by corr-pipeline backfill" in out, out
    with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
        assert instance.get_run_by_id(killed).status == dg.DagsterRunStatus.FAILURE
    _plan_line(out, GOOD[0], GOOD[-1], len(GOOD), len(current), 2)
    summary = _summary(out)
    assert summary.group(3, 5, 6) == (str(len(missing)), str(len(current)), "0"), out
    assert not _failed_reasons(out), out
    for day in missing:
        assert re.search(rf"^  {day} published \(\d/{len(missing)}\)$", out, re.MULTILINE), out
    for day in current:
        assert f"  {day} published" not in out, (day, out)

    # only the missing sessions were computed: the runs after the kill cover exactly them
    new_runs = project.runs()[len(runs_before) :]
    assert int(summary.group(4)) == len(new_runs), (out, new_runs)
    assert all(status == dg.DagsterRunStatus.SUCCESS for _, _, status in new_runs), new_runs
    _assert_runs_shape([s for _, s, _ in new_runs], 2, GOOD)
    assert [key for _, s, _ in new_runs for key in s] == missing, new_runs
    created = _created_at(project.engine)
    assert {day: created[day] for day in kept} == kept
    assert all(created[day] > max(kept.values()) for day in missing if day in created)

    # and every session ends as single runs publish it, its changes current
    assert sorted(created) == GOOD
    assert _changes_recorded(project.engine) == dict(zip(GOOD[1:], GOOD[:-1], strict=True))
    for day in GOOD:
        _assert_consistent(project.engine, day)
        assert published_rows(project.engine, day) == reference[day], day


# --------------------------------------------------------------------------------------------
# 4. a range below a session already published
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_range_below_a_published_session_counts_each_session_once(project, reference):
    """With the last session published first, a backfill of the sessions before it prints each
    of them once, the count never past its total, and computes the later session's changes
    again once, after the range: they end current, against the range's last session."""
    later, sessions = GOOD[-1], GOOD[:-1]
    first = project.backfill(later, later)
    assert first.returncode == 0, (first.stdout, first.stderr[-5000:])
    assert _changes_recorded(project.engine) == {}  # nothing before it to compare with

    result = project.backfill(sessions[0], sessions[-1], "--per-run", str(len(sessions)))
    out = result.stdout
    assert result.returncode == 0, (result.returncode, out, result.stderr[-5000:])
    counts = re.findall(r"^  (\S+) published \((\d+)/(\d+)\)$", out, re.MULTILINE)
    assert [day for day, _, _ in counts] == sessions, out
    assert all(int(done) <= int(total) == len(sessions) for _, done, total in counts), out
    assert [int(done) for _, done, _ in counts] == list(range(1, len(sessions) + 1)), out
    refreshed = re.findall(rf"^  {later} \(published before\): .*$", out, re.MULTILINE)
    assert refreshed == [
        f"  {later} (published before): its changes computed again against {sessions[-1]}"
    ], out

    # the run recomputed the later session's changes once, and they describe what is published
    runs = project.runs()
    assert [s for _, s, _ in runs[1:]] == [sessions], runs
    with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
        records = instance.get_records_for_run(
            runs[-1][0], of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
    changes_of_later = [
        r
        for r in records
        if r.asset_materialization.asset_key == dg.AssetKey("snapshot_changes")
        and r.asset_materialization.partition == later
    ]
    assert len(changes_of_later) == 1, len(changes_of_later)
    assert _changes_recorded(project.engine) == dict(zip(GOOD[1:], GOOD[:-1], strict=True))
    for day in GOOD:
        _assert_consistent(project.engine, day)  # changes current (not stale)
        assert published_rows(project.engine, day) == reference[day], day


# --------------------------------------------------------------------------------------------
# 5. stopped by SIGTERM or Ctrl-C
# --------------------------------------------------------------------------------------------

LAST_SESSION = "2026-11-27"  # the universe's last session: a run of about 75 sessions


def _stopped_backfill(project: Project, stop: signal.Signals, *extra: str) -> tuple[int, str]:
    """A backfill of about 75 sessions in one run, sent ``stop`` (the command alone, as
    ``kill PID`` does) once its run has started: (its exit status, its output)."""
    log = project.root / "stopped.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            project.command(GOOD[0], LAST_SESSION, "--per-run", "100", *extra),
            cwd=project.root,
            env=project.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: code server, run worker
        )  # SIGINT at its default even in a session started with it ignored (conftest)
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while not any(status == dg.DagsterRunStatus.STARTED for _, _, status in project.runs()):
            assert proc.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, log.read_text()[-5000:]
            time.sleep(0.2)
        os.kill(proc.pid, stop)
        status = proc.wait(CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return status, log.read_text()


def _wait_finished(project: Project) -> list[tuple[str, list[str], dg.DagsterRunStatus]]:
    """The instance's runs once every one has ended (a bound for a hung run, not a speed
    target)."""
    deadline = time.monotonic() + CLI_TIMEOUT_S
    runs = project.runs()
    while any(status in IN_PROGRESS for _, _, status in runs):
        assert time.monotonic() < deadline, runs
        time.sleep(0.5)
        runs = project.runs()
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stopped_backfill_terminates_its_run(project, stop):
    status, out = _stopped_backfill(project, stop)
    try:
        assert status == 130, out[-5000:]
        # the one run it launched was asked to terminate, it says so, and the run ended canceled
        runs = project.runs()
        assert len(runs) == 1, runs
        run_id, sessions, run_status = runs[0]
        assert run_status == dg.DagsterRunStatus.CANCELED, (run_status, out[-5000:])
        label = f"run {run_id[:8]} ({sessions[0]}..{sessions[-1]})"
        assert f"stopping: asked Dagster to terminate {label}" in out, out[-5000:]
        assert f"run {run_id[:8]}: CANCELED" in out, out[-5000:]
    finally:
        runs = _wait_finished(project)  # nothing left computing into the next test's database
    # what it published before it stopped is whole
    published = sorted(_created_at(project.engine))
    assert published == sessions[: len(published)] and len(published) < len(sessions), published
    for day in published:
        _assert_consistent(project.engine, day)


@pytest.mark.slow
def test_a_detached_backfill_leaves_its_run_running(project):
    status, out = _stopped_backfill(project, signal.SIGTERM, "--detach")
    runs = _wait_finished(project)
    assert status == 130, out[-5000:]
    assert len(runs) == 1, runs
    run_id, sessions, run_status = runs[0]
    label = f"run {run_id[:8]} ({sessions[0]}..{sessions[-1]})"
    assert f"stopped following {label}, left running (--detach)" in out, out[-5000:]
    assert "asked Dagster to terminate" not in out, out[-5000:]
    assert run_status == dg.DagsterRunStatus.SUCCESS, (run_status, out[-5000:])
    assert sorted(_created_at(project.engine)) == sessions


@pytest.mark.slow
def test_the_run_of_a_killed_backfill_goes_on_and_can_be_terminated(project):
    """``kill -9`` of the command alone: its run goes on; what the UI's *Terminate* does (the
    run coordinator's ``cancel_run``) still ends it, canceled."""
    status, out = _stopped_backfill(project, signal.SIGKILL)
    assert status == -signal.SIGKILL, out[-5000:]
    try:
        (run_id, _, run_status), *others = project.runs()
        assert not others and run_status == dg.DagsterRunStatus.STARTED, project.runs()
        with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
            assert instance.run_coordinator.cancel_run(run_id)
    finally:
        runs = _wait_finished(project)
    assert runs[0][2] == dg.DagsterRunStatus.CANCELED, runs


# --------------------------------------------------------------------------------------------
# 6. a daemon that is gone
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_gone_daemon_is_said_at_once_and_nothing_is_queued(project):
    """The instance's daemon stopped a while ago (its last heartbeat older than Dagster's
    interval plus its slack, though younger than a minute): the backfill
    says at once that it is gone and how to start it, queues nothing, launches its run."""
    from dagster._daemon.types import DaemonHeartbeat

    age = 50  # a live daemon's is at most 30 s old (one every 30 s), plus its loop's delay
    with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
        instance.add_daemon_heartbeat(
            DaemonHeartbeat(time.time() - age, "QUEUED_RUN_COORDINATOR", "stopped-daemon", [])
        )
    result = project.backfill(GOOD[0], GOOD[0])
    out = result.stdout
    assert result.returncode == 0, (out, result.stderr[-5000:])
    lines = out.splitlines()
    assert lines[1].startswith(
        f"the Dagster daemon of {project.dagster_home} is gone (its last heartbeat was "
    ), out
    assert lines[1].endswith("start it with `corr-pipeline ui`"), out
    assert "queued" not in out, out
    # nothing was ever queued: the one run was launched directly and published its session
    (run_id, sessions, status), *others = project.runs()
    assert not others and sessions == [GOOD[0]] and status == dg.DagsterRunStatus.SUCCESS
    with dg.DagsterInstance.from_config(str(project.dagster_home)) as instance:
        enqueued = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED
        ).records
    assert not enqueued
    assert sorted(_created_at(project.engine)) == [GOOD[0]]
