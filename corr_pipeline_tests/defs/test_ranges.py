"""A range of sessions in one run publishes exactly what each session publishes alone.

300 symbols x 120 weekdays ending 2026-11-27, lookback 60 (as test_pipeline). Two recent sessions
are published first (as nightly runs would have); then the six XNYS sessions 2026-11-16 ..
2026-11-23, history older than them, are materialized one run per session,
their published rows (snapshots, neighbors, clusters, pairs, every change_* table) read back;
then the tables are emptied and the same six sessions run as ONE run over the range. Every row
of every session, first and last included, must be identical, and every session must have its
own materialization of every asset with its own metadata and its own check evaluations. The
store keeps the matrices of 2 sessions only, so most sessions are history whose matrices
retention removes, but only once the next session's changes (its correlation moves) are in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.schema import CHANGE_TABLES, PUBLISHED_TABLES
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.run import REPO_DAGSTER_YAML, snapshot_job_def
from corr_pipeline.defs.runs import RANGE_END_TAG, RANGE_START_TAG, run_sessions
from corr_pipeline.defs.specs import SNAPSHOT_ASSETS
from corr_pipeline.defs.step_options import SESSIONS_PER_RUN, backfill_sessions_per_run
from corr_pipeline.store import memory
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.defs.published import published_rows
from corr_pipeline_tests.fixtures.deployment import resources_at, use_store
from corr_pipeline_tests.fixtures.pipeline import SIXTY_DAYS
from corr_pipeline_tests.fixtures.project_copy import project_copy

SESSIONS = ["2026-11-16", "2026-11-17", "2026-11-18", "2026-11-19", "2026-11-20", "2026-11-23"]
#: Published first, as nightly runs would have: the sessions above are history older than them.
NEWER = ["2026-11-25", "2026-11-27"]
PARAMS = SIXTY_DAYS


@pytest.fixture
def universe(clean_db: sa.Engine) -> sa.Engine:
    write_synthetic_universe(clean_db, n_symbols=300, n_days=120, seed=20261127)
    return clean_db


def _resources(store: Path) -> dict:
    resources = resources_at(store)
    resources["snapshot_params"] = SnapshotParams(**PARAMS)
    return resources


def _empty_published(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"TRUNCATE {', '.join((*CHANGE_TABLES, *PUBLISHED_TABLES, 'suspect_prices'))}")
        )


@pytest.mark.slow
def test_a_range_in_one_run_publishes_what_each_session_publishes_alone(
    universe, tmp_path, monkeypatch
):
    # retention keeps 2 sessions: most of these are history, whose matrices are pruned after
    # their successor's changes are recorded (never before: the correlation moves are there)
    monkeypatch.setenv("CORR_PIPELINE_KEEP_MATRICES", "2")
    alone = {}
    for day in [*NEWER, *SESSIONS]:
        result = dg.materialize(
            snapshot_assets, partition_key=day, resources=_resources(tmp_path / "alone")
        )
        assert result.success, day
    for day in SESSIONS:
        alone[day] = published_rows(universe, day)
        assert alone[day]["snapshots"], day
    for day in SESSIONS[1:]:
        assert alone[day]["change_pairs"], f"{day}: no correlation moves (matrices pruned?)"

    _empty_published(universe)
    for day in NEWER:
        assert dg.materialize(
            snapshot_assets, partition_key=day, resources=_resources(tmp_path / "range")
        ).success
    result = dg.materialize(
        snapshot_assets,
        resources=_resources(tmp_path / "range"),
        tags={RANGE_START_TAG: SESSIONS[0], RANGE_END_TAG: SESSIONS[-1]},
    )
    assert result.success
    for day in SESSIONS:
        assert published_rows(universe, day) == alone[day], day

    # each session its own materialization of every asset, with its own metadata
    materialized: dict[str, dict[str, dict]] = {}
    refreshes = 0
    for event in result.get_asset_materialization_events():
        m = event.event_specific_data.materialization
        materialized.setdefault(m.asset_key.to_user_string(), {})[m.partition] = m.metadata
        refreshes += m.asset_key.to_user_string() == "snapshot_changes" and m.partition == NEWER[0]
    assert set(materialized) == set(SNAPSHOT_ASSETS)
    # after the last session the run recomputed the changes of the next published one
    # (NEWER[0]) once, and its partition shows it too
    assert refreshes == 1
    refreshed = materialized["snapshot_changes"].pop(NEWER[0])
    assert refreshed["refreshed_by"].value == SESSIONS[-1]
    assert refreshed["previous_date"].value == SESSIONS[-1]
    for asset, by_partition in materialized.items():
        assert sorted(by_partition) == SESSIONS, asset
    as_of = [materialized["snapshot_publication"][d]["as_of_trade_date"].value for d in SESSIONS]
    assert as_of == SESSIONS
    paths = {materialized["correlation_matrix"][d]["path"].value for d in SESSIONS}
    assert len(paths) == len(SESSIONS) and all(
        d in p for d, p in zip(SESSIONS, sorted(paths), strict=True)
    )
    # history that retention will not keep: its matrices never reached the store's disk
    in_memory = [
        materialized["correlation_matrix"][d]["matrices_in_memory"].value for d in SESSIONS
    ]
    assert in_memory == [settings.memory_dir() is not None] * len(SESSIONS)
    previous = [materialized["snapshot_changes"][d]["previous_date"].value for d in SESSIONS[1:]]
    assert previous == SESSIONS[:-1]
    # consecutive sessions: overnight changes, no gap between them
    between = [materialized["snapshot_changes"][d]["sessions_between"].value for d in SESSIONS[1:]]
    assert between == [0] * (len(SESSIONS) - 1)

    # and its own check evaluations, one per check and session
    evaluations: dict[str, list[str]] = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            evaluation = event.event_specific_data
            assert evaluation.passed, (evaluation.check_name, evaluation.partition)
            evaluations.setdefault(evaluation.check_name, []).append(evaluation.partition)
    assert "returns_contract" in evaluations and "published_rows_match" in evaluations
    for name, partitions in evaluations.items():
        assert sorted(partitions) == SESSIONS, name


def test_backfill_policy_runs_sessions_per_run(monkeypatch):
    assert SESSIONS_PER_RUN.max_partitions_per_run == backfill_sessions_per_run() >= 1
    for asset in snapshot_assets:
        if isinstance(asset, dg.AssetsDefinition) and asset.keys:
            assert asset.backfill_policy == SESSIONS_PER_RUN, asset.keys
    monkeypatch.setenv("CORR_PIPELINE_SESSIONS_PER_RUN", "7")
    assert backfill_sessions_per_run() == 7
    monkeypatch.setenv("CORR_PIPELINE_SESSIONS_PER_RUN", "0")
    with pytest.raises(ValueError, match="CORR_PIPELINE_SESSIONS_PER_RUN='0'"):
        backfill_sessions_per_run()


def test_run_sessions_of_a_range_run():
    tags = {RANGE_START_TAG: "2026-11-20", RANGE_END_TAG: "2026-11-27"}
    assert run_sessions(tags) == [
        "2026-11-20",
        "2026-11-23",
        "2026-11-24",
        "2026-11-25",
        "2026-11-27",
    ]
    assert run_sessions({"dagster/partition": "2026-11-25"}) == ["2026-11-25"]
    assert run_sessions({}) == []


def _published_at(engine: sa.Engine) -> dict[str, object]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT snapshot_date::text, created_at FROM snapshots"))
        return dict(rows.all())


@pytest.mark.slow
def test_a_session_fails_alone_and_a_reexecution_computes_only_it(universe, tmp_path):
    """The last session of a range has no price dated it yet (SPEC §2): the run publishes and
    materializes the others and fails naming it. Once its prices are in, Dagster's re-execution
    from failure of that run computes that session alone: the others stay as they were
    published, and the new run materializes nothing else."""
    use_store(tmp_path / "store")
    last = SESSIONS[-1]
    with universe.begin() as conn:
        held = conn.execute(
            sa.text("DELETE FROM prices WHERE trade_date = :d RETURNING symbol, trade_date, close"),
            {"d": last},
        ).all()
    assert held
    instance = dg.DagsterInstance.ephemeral()
    job = dg.reconstructable(snapshot_job_def)
    run_config = {"resources": {"snapshot_params": {"config": PARAMS}}}
    tags = {RANGE_START_TAG: SESSIONS[0], RANGE_END_TAG: last}
    with dg.execute_job(
        job, instance=instance, run_config=run_config, tags=tags, raise_on_error=False
    ) as first:
        assert not first.success
        done = sorted(m.partition for m in materializations(first, "snapshot_publication"))
        failure = next(e for e in first.all_events if e.event_type_value == "STEP_FAILURE")
        named = failure.event_specific_data.user_failure_data.metadata["failed_sessions"].value
        first_id = first.run_id
    assert done == SESSIONS[:-1]
    assert list(named) == [last] and "no price" in named[last]
    before = _published_at(universe)
    assert sorted(before) == SESSIONS[:-1]

    with universe.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO prices (symbol, trade_date, close) VALUES (:s, :d, :c)"),
            [{"s": s, "d": d, "c": c} for s, d, c in held],
        )
    with dg.execute_job(  # the UI's re-execution carries the run's tags, its range among them
        job,
        instance=instance,
        run_config=run_config,
        tags=tags,
        reexecution_options=dg.ReexecutionOptions.from_failure(first_id, instance),
    ) as again:
        assert again.success, [
            e.event_specific_data.error.message
            for e in again.all_events
            if e.event_type_value == "STEP_FAILURE"
        ]
        redone = {
            e.event_specific_data.materialization.partition
            for e in again.get_asset_materialization_events()
        }
    assert redone == {last}
    after = _published_at(universe)
    assert {d: after[d] for d in SESSIONS[:-1]} == before  # not published again
    assert last in after
    with universe.connect() as conn:
        previous = conn.execute(
            sa.text("SELECT previous_date::text FROM change_summaries WHERE snapshot_date = :d"),
            {"d": last},
        ).scalar_one()
    assert previous == SESSIONS[-2]


def _dg_launch(home: Path, *args: str, universe: int) -> subprocess.CompletedProcess:
    root = project_copy(home.parent)  # the repository's project, without its .env
    env = {**os.environ, "DAGSTER_HOME": str(home), settings.ENV_UNIVERSE_SYMBOLS: str(universe)}
    return subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "launch", "--job", "snapshot_job", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_dg_launch_runs_a_range_in_one_run_when_the_policy_is_single_run(universe, tmp_path):
    """Sized for a small universe a run may hold ten years of sessions: the backfill policy is
    single-run, and ``dg launch --partition-range`` computes the range in ONE run, each session
    published and materialized as its own partition. Sized for 24,000 symbols (the default)
    the policy is multi-run, which Dagster refuses for a range on the command line."""
    use_store(tmp_path / "store")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    first, last = SESSIONS[0], SESSIONS[2]
    refused = _dg_launch(home, "--partition-range", f"{first}...{last}", universe=24_000)
    assert refused.returncode != 0
    assert "single_run" in refused.stdout + refused.stderr
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"resources": {"snapshot_params": {"config": PARAMS}}}))
    done = _dg_launch(
        home, "--partition-range", f"{first}...{last}", "--config", str(config), universe=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run_sessions(run.tags) == SESSIONS[:3]
        records = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        shown = sorted(
            r.asset_materialization.partition
            for r in records
            if r.asset_materialization.asset_key == dg.AssetKey("snapshot_publication")
        )
    finally:
        instance.dispose()
    assert shown == SESSIONS[:3]
    assert sorted(_published_at(universe)) == SESSIONS[:3]


@pytest.mark.slow
def test_a_range_keeps_at_most_two_sessions_of_history(universe, tmp_path, monkeypatch):
    """When the history of a range would not fit a quarter of the memory area (here made small),
    retention follows every session: once a session's changes are in, the session before it
    is no longer needed and goes, so the store holds at most the session computed and the one
    before it, besides the sessions retention keeps."""
    monkeypatch.setenv("CORR_PIPELINE_KEEP_MATRICES", "2")
    monkeypatch.setattr(memory, "area_budget_bytes", lambda: 4096)
    resources = _resources(tmp_path / "store")
    for day in NEWER:
        assert dg.materialize(snapshot_assets, partition_key=day, resources=resources).success
    result = dg.materialize(
        snapshot_assets,
        resources=resources,
        tags={RANGE_START_TAG: SESSIONS[0], RANGE_END_TAG: SESSIONS[-1]},
    )
    assert result.success
    removed = {
        m.partition: m.metadata["retention_removed"].value
        for m in materializations(result, "snapshot_publication")
    }
    assert removed == {
        SESSIONS[0]: [],
        **{day: [before] for before, day in zip(SESSIONS, SESSIONS[1:], strict=False)},
    }
    assert MatrixStore(tmp_path / "store").files.partition_keys() == [SESSIONS[-1], *NEWER]
