"""Retention of the matrix store (SPEC §8) against the real PostgreSQL: which partitions keep
their matrices, which versions survive, what is never touched (the partition being written, a
partition another process uses), and what ``query corr`` says about a pruned date."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.db.published_reads import published_dates, published_matrix_versions
from corr_pipeline.snapshot import retention
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.snapshot.retention import apply_retention, store_inventory
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore, sources
from corr_pipeline_tests.reliability._payloads import publish_arguments

DAYS = [dt.date(2026, 10, d) for d in (26, 27, 28, 29, 30)]
N = 6


def _matrices(
    store: MatrixStore, day: dt.date, value: float, seed: int = 0
) -> dict[str, dict[str, str]]:
    """Store a day's matrices (returns, corr, overlap, neighbors computed from them) as the
    assets do, with the symbols ``publish_arguments(version=seed)`` publishes; returns the
    versions a publication would pin."""
    key = day.isoformat()
    symbols = [f"V{seed}_{i:06d}" for i in range(N)]
    returns = store.save_bundle(
        "returns_matrix", key, MatrixBundle({"returns": np.full((5, N), value, np.float32)})
    ).bundle
    corr = store.save_bundle(
        "correlation_matrix",
        key,
        MatrixBundle(
            {"corr": np.full((N, N), value, np.float32)},
            labels={"symbols": symbols},
            inputs=sources(returns),
        ),
    ).bundle
    overlap = store.save_bundle(
        "overlap_matrix",
        key,
        MatrixBundle({"overlap": np.full((N, N), 5, np.int16)}, labels={"symbols": symbols}),
    ).bundle
    neighbors = store.save_bundle(
        "top_k_neighbors",
        key,
        MatrixBundle({"index": np.zeros((N, 2), np.int32)}, inputs=sources(corr, overlap)),
    ).bundle
    return {
        "returns_matrix": returns.versions,
        "correlation_matrix": corr.versions,
        "overlap_matrix": overlap.versions,
        "top_k_neighbors": neighbors.versions,
    }


def _publish(engine: sa.Engine, day: dt.date, versions: dict, seed: int) -> None:
    publish_snapshot(
        engine,
        SnapshotResults(**publish_arguments(day, n=N, k=2, version=seed), matrix_versions=versions),
    )


@pytest.fixture
def store(tmp_path) -> MatrixStore:
    return MatrixStore(tmp_path / "store")


def _versions_on_disk(store: MatrixStore, key: str) -> set[tuple[str, str, str]]:
    return {
        (asset, v.name, v.version)
        for asset in store.files.assets()
        for v in store.files.versions(asset, key)
    }


def test_keeps_exactly_the_newest_k_published_partitions(clean_db, store):
    pins = {}
    for i, day in enumerate(DAYS):
        pins[day] = _matrices(store, day, value=i + 1)
        _publish(clean_db, day, pins[day], seed=i + 1)
    old_unpublished = dt.date(2026, 10, 23)
    new_unpublished = dt.date(2026, 11, 2)
    _matrices(store, old_unpublished, value=20)
    _matrices(store, new_unpublished, value=21)
    # a re-run of DAYS[3] has committed new matrices (not published): the published versions
    # stay pinned, the new ones are current; DAYS[2] was recomputed twice before publishing
    rerun = _matrices(store, DAYS[3], value=40)
    first_computation = pins[DAYS[2]]
    superseded = _matrices(store, DAYS[2], value=30)
    _matrices(store, DAYS[2], value=31)
    pins[DAYS[2]] = {a: store.load_bundle(a, DAYS[2].isoformat()).versions for a in superseded}
    with clean_db.begin() as conn:  # the last computation of DAYS[2] is the published one
        conn.execute(
            sa.text(
                "UPDATE snapshots SET matrix_versions = CAST(:v AS jsonb) WHERE snapshot_date = :d"
            ),
            {"v": json.dumps(pins[DAYS[2]]), "d": DAYS[2]},
        )

    report = apply_retention(store, lambda: published_matrix_versions(clean_db), 3)

    kept = [d.isoformat() for d in DAYS[2:]]
    assert report.kept == kept
    assert sorted(report.removed_partitions) == sorted(
        [d.isoformat() for d in DAYS[:2]] + [old_unpublished.isoformat()]
    )
    assert report.unpublished_kept == [new_unpublished.isoformat()]
    assert report.busy == []
    assert store.files.partition_keys() == [*kept, new_unpublished.isoformat()]
    # the published rows stay
    assert published_dates(clean_db) == DAYS
    # kept partitions: exactly the pinned and the current versions survive
    for day in DAYS[2:]:
        key = day.isoformat()
        wanted = {(a, n, v) for a, arrays in pins[day].items() for n, v in arrays.items()}
        current = {
            (a, n, v)
            for a in store.files.assets()
            if store.bundles.has_bundle(a, key)
            for n, v in store.load_bundle(a, key).versions.items()
        }
        assert _versions_on_disk(store, key) == wanted | current, key
    assert {(v.partition, v.version) for v in report.collected.deleted} == {
        (DAYS[2].isoformat(), v)
        for computation in (first_computation, superseded)
        for arrays in computation.values()
        for v in arrays.values()
    }
    assert all(
        store.has_version(a, DAYS[3].isoformat(), n, v)
        for a, arrays in rerun.items()
        for n, v in arrays.items()
    )
    # what was removed is recorded, so queries can say so
    record = store.pruned(DAYS[0].isoformat())
    assert record["versions"]["correlation_matrix"] == {
        "corr": [pins[DAYS[0]]["correlation_matrix"]["corr"]]
    }
    assert report.freed_bytes > 0
    # applying it again changes nothing
    again = apply_retention(store, lambda: published_matrix_versions(clean_db), 3)
    assert again.removed == [] and again.collected.deleted == []


def test_corr_of_a_pruned_date_says_so_and_peers_still_answer(clean_db, store):
    for i, day in enumerate(DAYS):
        _publish(clean_db, day, _matrices(store, day, (i + 1) / 10, seed=i + 1), seed=i + 1)
    apply_retention(store, lambda: published_matrix_versions(clean_db), 2)
    a, b = "V1_000000", "V1_000001"
    with pytest.raises(q.MatricesPrunedError) as info:
        q.corr(clean_db, a, b, DAYS[0], store=store)
    message = str(info.value)
    assert "\n" not in message
    assert f"the matrices of {DAYS[0]} were pruned by retention" in message
    assert "dates that still have them: 2026-10-30, 2026-10-29" in message
    assert info.value.exit_code == 2 and info.value.to_json()["available"] == [
        "2026-10-30",
        "2026-10-29",
    ]
    assert q.peers(clean_db, a, DAYS[0]).snapshot.snapshot_date == DAYS[0]
    kept = q.corr(clean_db, "V5_000000", "V5_000001", DAYS[4], store=store)
    assert kept.corr == pytest.approx(0.5) and kept.overlap == 5 and kept.published


HOLD = """
import sys, time
from corr_pipeline.store.matrix_store import MatrixStore
held = MatrixStore(sys.argv[1]).hold_partition("correlation_matrix", sys.argv[2])
print("held", flush=True)
time.sleep(120)
"""


def test_never_the_partition_being_written_nor_one_in_flight(clean_db, store):
    for i, day in enumerate(DAYS):
        _publish(clean_db, day, _matrices(store, day, value=i + 1), seed=i + 1)
    writing, held, flagged = (d.isoformat() for d in DAYS[:3])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store.base_dir), held],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        dry = apply_retention(
            store,
            lambda: published_matrix_versions(clean_db),
            1,
            writing=writing,
            in_flight={flagged},
            dry_run=True,
        )
        assert dry.removed_partitions == [DAYS[3].isoformat()] and dry.dry_run
        assert len(store.files.partition_keys()) == 5  # a dry run removes nothing
        report = apply_retention(
            store,
            lambda: published_matrix_versions(clean_db),
            1,
            writing=writing,
            in_flight={flagged},
        )
        assert report.kept == [DAYS[4].isoformat()]
        assert report.removed_partitions == [DAYS[3].isoformat()]
        assert sorted(report.busy) == [held, flagged]
        assert store.files.partition_keys() == [writing, held, flagged, DAYS[4].isoformat()]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    # nobody holds them any more: the next application removes all but the newest
    report = apply_retention(store, lambda: published_matrix_versions(clean_db), 1)
    assert sorted(report.removed_partitions) == [writing, held, flagged]
    assert store.files.partition_keys() == [DAYS[4].isoformat()]


def test_store_inventory(clean_db, store):
    for i, day in enumerate(DAYS[:3]):
        _publish(clean_db, day, _matrices(store, day, value=i + 1), seed=i + 1)
    _matrices(store, DAYS[3], value=9)  # computed, not published
    publish_snapshot(clean_db, SnapshotResults(**publish_arguments(DAYS[4], n=N, k=2, version=9)))
    _matrices(store, DAYS[4], value=10)  # published without recorded versions
    # one pinned version of DAYS[1] vanishes outside the store's protocol
    pins = published_matrix_versions(clean_db)[DAYS[1]]
    os.unlink(
        store.files.array_path(
            "overlap_matrix", DAYS[1].isoformat(), "overlap", pins["overlap_matrix"]["overlap"]
        )
    )
    entries = {e.partition: e for e in store_inventory(store, published_matrix_versions(clean_db))}
    assert list(entries) == [d.isoformat() for d in DAYS]
    first = entries[DAYS[0].isoformat()]
    assert first.assets == [
        "correlation_matrix",
        "overlap_matrix",
        "returns_matrix",
        "top_k_neighbors",
    ]
    assert first.published and first.pinned == "yes" and not first.in_use
    assert first.versions == 4 and first.bytes > 4 * N * N
    assert entries[DAYS[1].isoformat()].pinned == "partly"
    assert entries[DAYS[3].isoformat()].pinned == "-" and not entries[DAYS[3].isoformat()].published
    assert entries[DAYS[4].isoformat()].pinned == "unrecorded"
    assert first.to_json()["bytes"] == first.bytes


def test_a_history_session_keeps_its_predecessor_until_its_changes_are_recorded(clean_db, store):
    # DAYS[2] was backfilled below the newest: published, its changes not yet recorded. Its
    # predecessor DAYS[1] is far from the newest K = 1, yet its changes read DAYS[1]'s matrices
    for i, day in enumerate(DAYS):
        _publish(clean_db, day, _matrices(store, day, value=i + 1), seed=i + 1)
    changed = {DAYS[0], DAYS[1], DAYS[3], DAYS[4]}
    read = lambda: published_matrix_versions(clean_db)  # noqa: E731
    report = apply_retention(store, read, 1, read_changed=lambda: changed)
    assert report.kept == [DAYS[4].isoformat()]
    assert report.kept_for_changes == [DAYS[1].isoformat()]
    assert sorted(report.removed_partitions) == [d.isoformat() for d in (DAYS[0], DAYS[2], DAYS[3])]
    changed.add(DAYS[2])
    report = apply_retention(store, read, 1, read_changed=lambda: changed)
    assert report.kept_for_changes == [] and report.removed_partitions == [DAYS[1].isoformat()]


def test_the_previous_session_keeps_its_matrices_until_its_successor_has_changes(clean_db, store):
    # keep = 1: without the rule, publishing DAYS[4] would remove DAYS[3], whose matrices the
    # changes of DAYS[4] (SPEC §10) need
    for i, day in enumerate(DAYS):
        _publish(clean_db, day, _matrices(store, day, value=i + 1), seed=i + 1)
    changed: set[dt.date] = set(DAYS[:4])  # DAYS[4] has no changes recorded yet
    read = lambda: published_matrix_versions(clean_db)  # noqa: E731
    report = apply_retention(store, read, 1, read_changed=lambda: changed)
    assert report.kept == [DAYS[4].isoformat()]
    assert report.kept_for_changes == [DAYS[3].isoformat()]
    assert sorted(report.removed_partitions) == [d.isoformat() for d in DAYS[:3]]
    assert any("kept until the changes" in line for line in report.lines())
    assert store.files.partition_keys() == [DAYS[3].isoformat(), DAYS[4].isoformat()]
    # once the changes of DAYS[4] are recorded, DAYS[3] goes
    changed.add(DAYS[4])
    report = apply_retention(store, read, 1, read_changed=lambda: changed)
    assert report.kept_for_changes == [] and report.removed_partitions == [DAYS[3].isoformat()]
    assert store.files.partition_keys() == [DAYS[4].isoformat()]
    # without read_changed: the newest K only, as before
    _publish(clean_db, dt.date(2026, 11, 2), _matrices(store, dt.date(2026, 11, 2), 9), seed=9)
    report = apply_retention(store, read, 1)
    assert report.removed_partitions == [DAYS[4].isoformat()]


def test_published_before_is_the_newest_published_date_before_each_session() -> None:
    rng = random.Random(7)
    days = [dt.date(2026, 1, 1) + dt.timedelta(days=d) for d in range(60)]
    for _ in range(200):
        published = set(rng.sample(days, rng.randint(0, 20)))
        sessions = set(rng.sample(days, rng.randint(0, 10)))
        expected = {
            max(p for p in published if p < day)
            for day in sessions
            if any(p < day for p in published)
        }
        assert retention.published_before(sessions, published) == expected


@pytest.mark.parametrize(
    ("in_memory", "session_bytes", "budget", "each"),
    [
        (0, 10**9, 4, False),  # nothing in memory: after the last session only
        (2, 100, 800, False),  # two sessions' 200 bytes fit a quarter of 800
        (2, 101, 800, True),
        (3, 67, 800, True),
        (1, 200, 800, False),  # at the quarter exactly: fits
    ],
)
def test_retention_after_each_session_when_the_range_would_not_fit_a_quarter_of_the_area(
    in_memory: int, session_bytes: int, budget: int, each: bool
) -> None:
    assert retention.retain_after_each_session(in_memory, session_bytes, budget) is each
