"""The whole snapshot graph on the real (embedded) PostgreSQL with a small synthetic universe.

300 symbols x 120 weekdays ending 2026-11-27 (synth defaults), lookback 60: the full graph for
two partitions, a re-materialization (same rows, no duplicates), the published rows against
calling ``compute`` directly on the same window, a three-date backfill through ``execute_job``
with the multiprocess executor, configuration errors, and the code location validation.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import sqlalchemy as sa
from scipy.cluster import hierarchy

from corr_pipeline import settings
from corr_pipeline.compute import (
    find_lead_lag_pairs,
    hierarchical_clusters,
    market_modes,
    market_residuals,
    pairwise_correlation,
    top_k_neighbors,
)
from corr_pipeline.db.schema import PUBLISHED_TABLES, SNAPSHOT_CHILD_TABLES
from corr_pipeline.db.synth import read_truth
from corr_pipeline.db.window import load_returns_window
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.retries import DATABASE_RETRY_POLICY, retry_only_if_database_unavailable
from corr_pipeline.defs.run import (
    latest_partition_key,
    materialize_snapshot,
    open_instance,
    snapshot_job_def,
)
from corr_pipeline.defs.specs import SNAPSHOT_ASSETS
from corr_pipeline.snapshot import display
from corr_pipeline.store import memory, writeback
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.fixtures.deployment import resources_at, use_store
from corr_pipeline_tests.fixtures.pipeline import (
    LAST,
    SIXTY_DAYS,
    materialize,
    snapshot_resources,
    table_rows,
)
from corr_pipeline_tests.fixtures.project_copy import project_copy

PARAMS = {  # the defaults too: the tests read them back by name
    **SIXTY_DAYS,
    "min_improvement": 0.0,
    "lead_lag_market_modes": 1,
    "linkage_method": "average",
    "distance_threshold": 1.2,
    "n_clusters": None,
}


def _check_outcomes(result) -> dict[str, bool]:
    return {
        e.event_specific_data.check_name: e.event_specific_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def _counts(engine: sa.Engine, day: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: conn.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE snapshot_date = :d"), {"d": day}
            ).scalar_one()
            for table in PUBLISHED_TABLES
        }


@pytest.fixture
def two_partitions(universe, tmp_path):
    """Materialize the whole graph in-process for the last two XNYS sessions (2026-11-26 is
    Thanksgiving: under the default calendar it has no partition, so the pair is 25th/27th)."""
    store = tmp_path / "store"
    results = {day: materialize(store, day) for day in ("2026-11-25", LAST)}
    return store, results


def _display_rule(key: str):
    """The rounding rule a float metadata entry must follow, by its name."""
    if key.endswith("_seconds") or key.startswith(("load_", "publish_")):
        return display.seconds
    if key.endswith("_mib"):
        return display.mib
    if key == "mean_overlap":
        return display.mean_count
    if "share" in key or key in ("fill_rate", "recall"):
        return display.share
    return display.corr  # correlations, their means and quantiles, improvements


def _assert_metadata_readable(result) -> int:
    """Every float the run put in metadata (materializations and check results) is rounded by
    its rule and stays a float (plotted); dtypes are shown readably. Returns the floats seen."""
    entries = []
    for event in result.all_events:
        if event.event_type_value == "ASSET_MATERIALIZATION":
            entries += event.event_specific_data.materialization.metadata.items()
        elif event.event_type_value == "ASSET_CHECK_EVALUATION":
            entries += event.event_specific_data.metadata.items()
    floats = 0
    arrays = [v.value for k, v in entries if k == "arrays"]
    assert any(
        "leader: int32, lagger: int32, lag: int16, lagged_corr: float32" in md for md in arrays
    ), arrays
    for key, value in entries:
        if isinstance(value, dg.FloatMetadataValue) and value.value is not None:
            floats += 1
            assert _display_rule(key)(value.value) == value.value, (key, value.value)
        if isinstance(value, dg.MarkdownMetadataValue) and key == "arrays":
            assert "<" not in value.value and "[(" not in value.value, value.value
        if key == "dtype":
            assert value.value in ("int8", "int16", "int32", "int64"), value.value
    return floats


def test_full_graph_for_two_partitions(two_partitions, engine):
    store, results = two_partitions
    for day, result in results.items():
        assert result.success, day
        assert _assert_metadata_readable(result) >= 20
        outcomes = _check_outcomes(result)
        assert len(outcomes) == 9
        assert all(outcomes.values()), outcomes
        counts = _counts(engine, day)
        assert counts["snapshots"] == 1
        n_symbols = materializations(result, "returns_matrix")[0].metadata["n_symbols"].value
        assert counts["symbol_clusters"] == n_symbols
        assert counts["peer_neighbors"] == n_symbols * PARAMS["k_neighbors"]
        assert counts["lead_lag_pairs"] > 0
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT snapshot_date, as_of_trade_date, lookback_days, params FROM snapshots")
        ).all()
    by_date = {str(r.snapshot_date): r for r in rows}
    assert set(by_date) == {"2026-11-25", LAST}
    assert str(by_date[LAST].as_of_trade_date) == LAST
    assert by_date[LAST].lookback_days == 60
    recorded = by_date[LAST].params
    for key, value in PARAMS.items():
        assert recorded[key] == value, key

    # the injected lead-lag pairs are found, with their lags
    truth = read_truth(engine)
    assert truth
    with engine.connect() as conn:
        published = {
            (r.leader, r.lagger): r.lag
            for r in conn.execute(
                sa.text("SELECT leader, lagger, lag FROM lead_lag_pairs WHERE snapshot_date = :d"),
                {"d": LAST},
            )
        }
    for leader, lagger, lag in truth:
        assert published.get((leader, lagger)) == lag, (leader, lagger, lag)
    # every published pair has its significance; the injected ones stand out (on a 60-day
    # window the robust test of 90,000 ordered pairs needs more to reach q <= 0.05: each has a
    # p-value below 1e-3 and among the smallest of all), and the asset's metadata counts the
    # pairs at q <= 0.05 and q <= 0.01 as published
    with engine.connect() as conn:
        q_values = {
            (r.leader, r.lagger): (r.p_value, r.q_value)
            for r in conn.execute(
                sa.text(
                    "SELECT leader, lagger, p_value, q_value FROM lead_lag_pairs "
                    "WHERE snapshot_date = :d"
                ),
                {"d": LAST},
            )
        }
    assert all(0.0 <= p <= q <= 1.0 for p, q in q_values.values()), q_values
    ranked = sorted(p for p, _ in q_values.values())
    for leader, lagger, _ in truth:
        p_value = q_values[leader, lagger][0]
        assert p_value <= 1e-3 and ranked.index(p_value) < 3 * len(truth), (leader, lagger)
    shown = materializations(results[LAST], "lead_lag_pairs")[0].metadata
    for key, level in (("significant_pairs_q05", 0.05), ("significant_pairs_q01", 0.01)):
        assert shown[key].value == sum(q <= level for _, q in q_values.values()), key
    # the reverse direction (SPEC §6 "Direction") is published as the scan computed it (NULL
    # where the reverse pair has no best lag), and the metadata counts the two-way pairs at the
    # max_q_value it shows
    stored = MatrixStore(store).load_bundle("lead_lag_pairs", LAST)
    names = stored.labels["symbols"]
    computed = {
        (names[p["leader"]], names[p["lagger"]]): (
            (int(p["reverse_lag"]), p["reverse_lagged_corr"], float(p["reverse_q_value"]))
            if p["reverse_lag"]
            else (None, None, None)
        )
        for p in stored["pairs"]
    }
    with engine.connect() as conn:
        reverse = {
            (r.leader, r.lagger): (
                r.reverse_lag,
                None if r.reverse_lagged_corr is None else np.float32(r.reverse_lagged_corr),
                r.reverse_q_value,
            )
            for r in conn.execute(
                sa.text(
                    "SELECT leader, lagger, reverse_lag, reverse_lagged_corr, reverse_q_value "
                    "FROM lead_lag_pairs WHERE snapshot_date = :d"
                ),
                {"d": LAST},
            )
        }
    assert reverse == computed
    assert any(lag is not None for lag, _, _ in reverse.values())
    max_q = shown["max_q_value"].value
    assert shown["two_way_pairs"].value == sum(
        q is not None and q <= max_q for _, _, q in reverse.values()
    )
    check = next(
        e.event_specific_data
        for e in results[LAST].all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
        and e.event_specific_data.check_name == "injected_pairs_found"
    )
    assert check.passed and check.metadata["recall"].value == 1.0

    # the N x N matrices stay in the store, memory-mapped
    bundle = MatrixStore(store).load_bundle("correlation_matrix", LAST)
    corr = bundle["corr"]
    assert isinstance(corr, np.memmap) and corr.dtype == np.float32
    assert corr.shape == (len(bundle.labels["symbols"]),) * 2
    assert np.array_equal(corr.view(np.uint32), corr.T.view(np.uint32))


def test_injected_pairs_check_runs_only_on_synthetic_data(universe, tmp_path, engine):
    """The injected_pairs_found check reads the synthetic ground truth after the lead-lag scan
    and reports only when there is one (here: none, as in production)."""
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM synthetic.lead_lag_truth"))
    result = materialize(tmp_path / "store", LAST)
    assert result.success
    outcomes = _check_outcomes(result)
    assert len(outcomes) == 8 and "injected_pairs_found" not in outcomes
    assert all(outcomes.values()), outcomes
    assert _counts(engine, LAST)["snapshots"] == 1


@pytest.fixture
def one_partition(universe, tmp_path):
    store = tmp_path / "store"
    first = materialize(store, LAST)
    assert first.success
    return store


def test_rematerializing_replaces_without_duplicates(one_partition, engine):
    store = one_partition
    assert materialize(store, "2026-11-25").success
    other_before = table_rows(engine, "peer_neighbors", "2026-11-25", "2, 3")
    before = {t: table_rows(engine, t, LAST, "2, 3") for t in SNAPSHOT_CHILD_TABLES}
    counts_before = _counts(engine, LAST)
    again = materialize(store, LAST)
    assert again.success
    replaced = materializations(again, "snapshot_publication")[0]
    assert replaced.metadata["replaced_previous"].value is True
    assert _counts(engine, LAST) == counts_before
    assert table_rows(engine, "peer_neighbors", "2026-11-25", "2, 3") == other_before
    assert {t: table_rows(engine, t, LAST, "2, 3") for t in SNAPSHOT_CHILD_TABLES} == before


@pytest.mark.parametrize(
    ("lead_lag_market_modes", "max_q_value"),
    [(1, 1.0), (0, 1.0), (1, 0.99)],  # on 60 days no q is below 0.98: the condition's path
    ids=["residuals", "the-seed-s-pairs", "residuals-q-condition"],
)
def test_published_rows_equal_direct_compute(
    universe, tmp_path, engine, lead_lag_market_modes, max_q_value
):
    """Same window, compute functions called directly, compared with what was published. With
    ``lead_lag_market_modes = 0`` and ``max_q_value = 1`` the lead-lag pairs are exactly the
    seed's: the scan of the returns with their ``corr`` (SPEC §6 "Defaults"); else the scan of
    the market residuals after the session's modes, with the q-value condition."""
    lead_lag = dict(lead_lag_market_modes=lead_lag_market_modes, max_q_value=max_q_value)
    assert materialize(tmp_path / "store", LAST, **lead_lag).success
    p = {**PARAMS, **lead_lag}
    window = load_returns_window(
        engine,
        dt.date.fromisoformat(LAST),
        lookback_days=p["lookback_days"],
        min_history_days=p["min_history_days"],
    )
    R, symbols = window.returns, window.symbols
    result = pairwise_correlation(R, min_overlap=p["min_overlap"])
    neighbors = top_k_neighbors(result.corr, k=p["k_neighbors"], overlap=result.overlap)
    labels = hierarchical_clusters(
        result.corr, method=p["linkage_method"], distance_threshold=p["distance_threshold"]
    )
    series, sync = R, result.corr
    if lead_lag_market_modes:
        vectors = market_modes(result.corr, lead_lag_market_modes).vectors
        series, sync = market_residuals(R, vectors), None
    pairs = find_lead_lag_pairs(
        series,
        max_lag=p["max_lag"],
        k_leaders=p["k_leaders"],
        k_laggers=p["k_laggers"],
        min_overlap=p["min_overlap"],
        min_improvement=p["min_improvement"],
        max_q_value=p["max_q_value"],
        corr=sync,
    )
    assert pairs.size > 0

    expected_neighbors = sorted(
        (
            symbols[i],
            r + 1,
            symbols[int(j)],
            float(neighbors.corr[i, r]),
            int(neighbors.overlap[i, r]),
        )
        for i in range(len(symbols))
        for r, j in enumerate(neighbors.index[i])
        if j >= 0
    )
    got_neighbors = [
        (s, rank, nb, float(np.float32(c)), ov)
        for _, s, rank, nb, c, ov in table_rows(engine, "peer_neighbors", LAST, "symbol, rank")
    ]
    assert got_neighbors == expected_neighbors

    got_clusters = {s: cid for _, s, cid in table_rows(engine, "symbol_clusters", LAST, "symbol")}
    assert got_clusters == {s: int(c) for s, c in zip(symbols, labels, strict=True)}

    with engine.connect() as conn:
        published = conn.execute(
            sa.text(
                "SELECT leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap "
                "FROM lead_lag_pairs WHERE snapshot_date = :d"
            ),
            {"d": LAST},
        ).all()
    got_pairs = {
        (r.leader, r.lagger): (
            r.lag,
            np.float32(r.lagged_corr),
            None if r.sync_corr is None or np.isnan(r.sync_corr) else np.float32(r.sync_corr),
            np.float32(r.improvement),
            r.overlap,
        )
        for r in published
    }
    expected_pairs = {
        (symbols[int(row["leader"])], symbols[int(row["lagger"])]): (
            int(row["lag"]),
            np.float32(row["lagged_corr"]),
            None if np.isnan(row["sync_corr"]) else np.float32(row["sync_corr"]),
            np.float32(row["improvement"]),
            int(row["overlap"]),
        )
        for row in pairs
    }
    assert got_pairs == expected_pairs


def test_backfill_three_dates_with_multiprocess_executor(universe, engine, tmp_path):
    """Three partitions, one run each, through execute_job (multiprocess executor) on a
    persistent temporary instance, as the daemon would launch a backfill."""
    days = ["2026-11-23", "2026-11-24", "2026-11-25"]
    use_store(tmp_path / "store")
    instance = open_instance(tmp_path / "dagster_home")
    try:
        for day in days:
            summary = materialize_snapshot(
                day,
                instance=instance,
                params=PARAMS,
                max_concurrent=2,
            )
            assert summary.success, summary
            assert summary.checks and not summary.failed_checks, summary
            run = instance.get_run_by_id(summary.run_id)
            assert run.tags["dagster/partition"] == day
            assert int(run.tags["dagster/max_runtime"]) > 0
            assert "symbols kept" in str(summary) and str(tmp_path / "store") in str(summary)
        for day in days:
            counts = _counts(engine, day)
            assert counts["snapshots"] == 1 and counts["symbol_clusters"] > 0, (day, counts)
        materialized = instance.get_materialized_partitions(dg.AssetKey("snapshot_publication"))
        assert set(days) <= set(materialized)
    finally:
        instance.dispose()


def test_latest_partition_is_the_last_trade_date(universe, engine):
    assert latest_partition_key(engine, today=dt.date(2026, 11, 29)) == LAST
    with pytest.raises(ValueError, match="not a snapshot partition"):
        latest_partition_key(engine, today=dt.date(2026, 11, 20))


@pytest.mark.parametrize("memory_area", [False, True])
def test_clusters_warns_when_its_scratch_outgrows_the_writeback_threshold(
    universe, tmp_path, monkeypatch, memory_area
):
    """With the distances in a store scratch file (``clusters_memory_mb`` 0) on disk and a
    machine whose write-back starts at 1 byte, the clusters step logs one warning that names
    the setting; in the store's memory area nothing is ever written back: no warning. The run
    succeeds either way."""
    proc = tmp_path / "proc"
    (proc / "sys/vm").mkdir(parents=True)
    (proc / "sys/vm/dirty_background_bytes").write_text("1\n")
    monkeypatch.setattr(writeback, "PROC", proc)
    if memory_area:
        area = tmp_path / "shm"
        area.mkdir(mode=0o700)
        monkeypatch.setenv(settings.ENV_MEMORY_DIR, str(area))
        monkeypatch.setattr(memory, "has_room", lambda _area, _nbytes: True)
    else:
        monkeypatch.setenv(settings.ENV_MEMORY_DIR, "off")
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        snapshot_assets,
        partition_key=LAST,
        resources=snapshot_resources(tmp_path / "store", clusters_memory_mb=0),
        instance=instance,
        raise_on_error=False,
    )
    assert result.success
    warnings = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.level == logging.WARNING and "scratch distances" in entry.user_message
    ]
    assert len(warnings) == (0 if memory_area else 1)
    if not memory_area:
        assert "vm.dirty_background_bytes" in warnings[0] and "clusters_memory_mb" in warnings[0]


def test_inconsistent_config_fails_before_reading_or_publishing(universe, engine, tmp_path):
    result = dg.materialize(
        snapshot_assets,
        partition_key="2026-11-20",
        resources={**resources_at(tmp_path), "snapshot_params": SnapshotParams()},
        run_config={"resources": {"snapshot_params": {"config": {"k_neighbors": 0}}}},
        raise_on_error=False,
    )
    assert not result.success
    errors = " ".join(
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value in ("RESOURCE_INIT_FAILURE", "STEP_FAILURE")
    )
    assert "k_neighbors must be >= 1" in errors
    assert _counts(engine, "2026-11-20")["snapshots"] == 0
    assert not list(tmp_path.iterdir())  # nothing written to the store


def test_window_too_short_is_a_clear_non_retried_failure(universe, engine, tmp_path):
    """A partition before the data: the error names the date, and is not retried."""
    result = materialize(tmp_path, "2026-06-16")
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    text = str(failure.event_specific_data.error.message)
    assert "min_history_days=40" in text
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def test_only_database_outages_are_retried():
    from corr_pipeline.db.engine import DatabaseUnavailableError

    assert DATABASE_RETRY_POLICY.max_retries >= 1
    assert DATABASE_RETRY_POLICY.backoff == dg.Backoff.EXPONENTIAL
    with pytest.raises(DatabaseUnavailableError):
        with retry_only_if_database_unavailable("x"):
            raise DatabaseUnavailableError("cannot connect to PostgreSQL at host/db")
    with pytest.raises(dg.Failure) as err:
        with retry_only_if_database_unavailable("window"):
            raise ValueError("too short")
    assert err.value.allow_retries is False
    assert "window failed: ValueError: too short" in err.value.description
    (op,) = [asset.op for asset in snapshot_assets]  # one op computes every asset
    assert op.retry_policy == DATABASE_RETRY_POLICY


def test_dg_check_defs_passes(tmp_path):
    """``dg check defs`` (what CI runs) loads the code location of [tool.dg] from the
    repository's project root (a copy without its .env), without a warning."""
    root = project_copy(tmp_path / "checkout")
    (tmp_path / "dagster.yaml").write_bytes((root / "dagster.yaml").read_bytes())
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    dg_cli = Path(sys.executable).with_name("dg")
    proc = subprocess.run(
        [str(dg_cli), "check", "defs"],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "All definitions loaded successfully." in output
    assert "warn" not in output.lower(), output


def test_definitions_contents():
    from corr_pipeline.definitions import defs

    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == set(SNAPSHOT_ASSETS)
    assert len(list(repo.asset_graph.asset_check_keys)) == 10  # with publication_freshness
    job = defs.resolve_job_def("snapshot_job")
    assert job.partitions_def is not None
    assert defs.resolve_schedule_def("nightly_snapshot_schedule").job_name == "snapshot_job"
    assert snapshot_job_def().name == "snapshot_job"


def test_a_session_launched_before_its_prices_fails_and_touches_nothing(
    universe, clean_db, tmp_path, monkeypatch
):
    """SPEC §2: 2026-11-30 (a Monday, an XNYS session) launched while the latest prices are of
    2026-11-27: the run fails in one line naming both dates and says so in a run tag; nothing is
    published under 11-30 and retention (here keeping one partition) prunes nothing."""
    from corr_pipeline.defs.assets import NO_PRICES_TAG

    monkeypatch.setenv(settings.ENV_KEEP_MATRICES, "1")
    store = tmp_path / "store"
    assert materialize(store, LAST).success
    before = sorted(MatrixStore(store).files.partition_keys())
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        snapshot_assets,
        partition_key="2026-11-30",
        resources=snapshot_resources(store),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = failure.event_specific_data.error.message
    assert "no price dated 2026-11-30" in text and "latest trade date" in text and LAST in text
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags[NO_PRICES_TAG] == f"2026-11-30 (latest trade date {LAST})"
    assert sum(_counts(clean_db, "2026-11-30").values()) == 0
    assert sum(_counts(clean_db, LAST).values()) > 0
    assert sorted(MatrixStore(store).files.partition_keys()) == before == [LAST]
    assert not [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]


def test_a_backfilled_earlier_session_rematerializes_the_later_changes(universe, tmp_path):
    """2026-11-25 first (nothing to compare), then 2026-11-24: the run of 11-24 recomputes the
    changes of 11-25 against it, and the partition 11-25 of snapshot_changes gets a new
    materialization saying so, in the instance the UI reads: the UI and the database agree."""
    store = tmp_path / "store"
    instance = dg.DagsterInstance.ephemeral()

    def run(day: str) -> None:
        result = dg.materialize(
            snapshot_assets,
            partition_key=day,
            resources=snapshot_resources(store),
            instance=instance,
            raise_on_error=False,
        )
        assert result.success, day

    def latest(day: str) -> dict:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("snapshot_changes"), asset_partitions=[day]
            ),
            limit=1,
        ).records
        (record,) = records
        materialization = record.event_log_entry.asset_materialization
        assert materialization is not None
        return {k: v.value for k, v in materialization.metadata.items()}

    run("2026-11-25")
    assert latest("2026-11-25")["previous_date"] == "none"
    run("2026-11-24")
    shown = latest("2026-11-25")
    assert shown["previous_date"] == "2026-11-24" and shown["refreshed_by"] == "2026-11-24"
    assert shown["recorded"] is True and shown["n_common"] > 0
    assert latest("2026-11-24")["refreshed_following"] == "2026-11-25"


def test_clusters_without_the_market_mode_are_published_and_reported(universe, tmp_path, engine):
    """``market_modes_removed = 1`` through the assets: the published clusters are scipy's on
    ``C_1`` from numpy ``eigh`` of the published session's own ``corr``, ``snapshots.params``
    records ``m``, and the clusters asset reports ``λ_1 / N`` as a float (plotted across
    partitions), the share removed, and the singletons (clusters of one symbol) and their share
    of the symbols as counted from the published ``symbol_clusters`` rows."""
    result = materialize(tmp_path / "store", LAST, market_modes_removed=1)
    assert result.success
    corr = np.asarray(
        MatrixStore(tmp_path / "store").load_bundle("correlation_matrix", LAST)["corr"]
    )
    C_1, w, _ = ref.market_modes_removed_reference(corr, 1)
    expected = ref.canonical_labels(
        hierarchy.fcluster(
            hierarchy.linkage(ref.mantegna_condensed(np.minimum(C_1, 1.0)), "average"),
            t=PARAMS["distance_threshold"],
            criterion="distance",
        )
    )
    symbols = MatrixStore(tmp_path / "store").load_bundle("returns_matrix", LAST).labels["symbols"]
    published = dict((s, c) for _, s, c in table_rows(engine, "symbol_clusters", LAST, "symbol"))
    assert [published[s] for s in symbols] == expected.tolist()
    plain = hierarchical_clusters(corr, distance_threshold=PARAMS["distance_threshold"])
    assert not np.array_equal(plain, expected)  # the parameter reached the step
    with engine.connect() as conn:
        params = conn.execute(
            sa.text("SELECT params FROM snapshots WHERE snapshot_date = :d"), {"d": LAST}
        ).scalar_one()
    assert params["market_modes_removed"] == 1
    meta = materializations(result, "clusters")[0].metadata
    assert isinstance(meta["market_mode_share"], dg.FloatMetadataValue)
    assert meta["market_mode_share"].value == display.share(w[0] / len(symbols))
    assert meta["removed_modes_share"].value == display.share(w[0] / len(symbols))
    assert meta["market_modes_removed"].value == 1
    members: dict[int, int] = {}
    for cluster_id in published.values():
        members[cluster_id] = members.get(cluster_id, 0) + 1
    singletons = sum(1 for size in members.values() if size == 1)
    assert singletons > 0  # residual correlations are weak: the cut at 1.2 leaves some alone
    assert meta["n_singletons"].value == singletons
    assert isinstance(meta["singleton_share"], dg.FloatMetadataValue)
    assert meta["singleton_share"].value == display.share(singletons / len(published))
