"""The matrix store kept for a year, through real pipeline runs (SPEC §8): publications pin the
versions they were computed from; ``query corr`` and ``query peers`` agree on one snapshot
through a re-run, a SIGKILLed re-run and retention; retention after each publication; the
``store`` and ``db prune`` commands; a copied or restored store answers every query.

Small universe (24 symbols, two factors, 50 weekdays), the whole graph in-process unless a
real separate process is the point.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.cli import main as cli_main
from corr_pipeline.compute.clusters import distance_buffer_length
from corr_pipeline.db.published_reads import published_matrix_versions
from corr_pipeline.db.schema import prices
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.runs import partitions_in_flight
from corr_pipeline.defs.specs import MATRIX_ASSETS
from corr_pipeline.snapshot.retention import apply_retention
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.reliability import helpers as h

LAST = dt.date(2026, 10, 30)  # a Friday
DAYS = [dt.date(2026, 10, d) for d in (26, 27, 28, 29, 30)]
SYMBOLS = [f"S{i:02d}" for i in range(24)]
SYM = "S00"


def _seed_prices(engine: sa.Engine, seed: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(prices))
    h.insert_prices(engine, h.factor_prices(SYMBOLS, h.weekdays(LAST, 50), seed=seed))


@pytest.fixture
def universe(clean_db: sa.Engine) -> sa.Engine:
    _seed_prices(clean_db, seed=31)
    return clean_db


def _resources(store_dir: Path, keep: int | None = None) -> dict:
    # clusters_memory_mb=0: the clustering step's distances go to the store's scratch file, as
    # they do at N = 24,000 (here they would fit in the default 1 GiB of anonymous memory)
    resources = h.resources(store_dir, clusters_memory_mb=0)
    resources["matrix_store"] = MatrixStoreResource(keep_matrices=keep)
    return resources


def _materialize(store_dir: Path, day: dt.date, keep: int | None = None, **kwargs):
    result = dg.materialize(
        snapshot_assets,
        partition_key=day.isoformat(),
        resources=_resources(store_dir, keep),
        raise_on_error=False,
        **kwargs,
    )
    assert result.success, h.failure_messages(result)
    return result


def _publication_metadata(result) -> dict:
    (mat,) = materializations(result, "snapshot_publication")
    return {k: v.value for k, v in mat.metadata.items()}


def _peers_key(result: q.PeersResult) -> tuple:
    return tuple((p["neighbor"], p["corr"], p["overlap"]) for p in result.peers)


def _check_agreement(engine: sa.Engine, store: MatrixStore, day: dt.date) -> tuple | None:
    """``query peers SYM`` and ``query corr SYM B`` for each of its peers B, at this instant:
    the corr and overlap of every peer equal the published ones (asserted) whenever no
    publication committed between the reads (None then: nothing to compare)."""
    before = q.peers(engine, SYM, day)
    answers = [q.corr(engine, SYM, p["neighbor"], day, store=store) for p in before.peers]
    after = q.peers(engine, SYM, day)
    if _peers_key(before) != _peers_key(after):
        return None
    for peer, answer in zip(before.peers, answers, strict=True):
        assert answer.published and answer.snapshot_date == day
        assert np.float32(answer.corr) == np.float32(peer["corr"]), (peer, answer)
        assert answer.overlap == peer["overlap"], (peer, answer)
    return _peers_key(before)


# --------------------------------------------------------------------------------------------
# pinned versions
# --------------------------------------------------------------------------------------------


def test_publication_records_the_versions_it_was_computed_from(universe, tmp_path, monkeypatch):
    store_dir = tmp_path / "store"
    scratches: list[tuple] = []
    real_scratch = MatrixStore.scratch

    def recording_scratch(self, asset, partition, name, shape, dtype, **options):
        scratches.append((asset, partition, name, shape, np.dtype(dtype)))
        return real_scratch(self, asset, partition, name, shape, dtype, **options)

    monkeypatch.setattr(MatrixStore, "scratch", recording_scratch)
    result = _materialize(store_dir, LAST)
    store = MatrixStore(store_dir)
    key = LAST.isoformat()
    # the clustering step's distances lived in a scratch file of its partition, now deleted
    n = len(store.load_bundle("clusters", key)["labels"])
    assert scratches == [
        ("clusters", key, "clusters_distances", (distance_buffer_length(n),), np.float64)
    ]
    assert not [p for p in store_dir.rglob("*") if ".tmp-" in p.name]
    recorded = published_matrix_versions(universe)[LAST]
    current = {asset: store.load_bundle(asset, key).versions for asset in MATRIX_ASSETS}
    assert recorded == current
    neighbors = store.load_bundle("top_k_neighbors", key)
    assert neighbors.inputs == {
        "correlation_matrix": current["correlation_matrix"],
        "overlap_matrix": current["overlap_matrix"],
    }
    assert (
        store.load_bundle("lead_lag_pairs", key).inputs["returns_matrix"]
        == current["returns_matrix"]
    )
    assert _publication_metadata(result)["matrix_versions"] == recorded
    answer = q.corr(universe, SYM, "S01", LAST, store=store)
    assert answer.versions == {
        "corr": recorded["correlation_matrix"]["corr"],
        "overlap": recorded["overlap_matrix"]["overlap"],
    }
    assert _check_agreement(universe, store, LAST)


RERUN = """
import json, os, sys
import dagster as dg
from corr_pipeline.defs.run import materialize_snapshot
os.environ["CORR_PIPELINE_STORE_DIR"] = sys.argv[2]
summary = materialize_snapshot(sys.argv[1], instance=dg.DagsterInstance.ephemeral(),
                               params=json.loads(sys.argv[3]), in_process=True,
                               log_level="ERROR")
print("SUCCESS" if summary.success else "FAILED", flush=True)
"""


def _start_rerun(store_dir: Path, day: dt.date) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RERUN, day.isoformat(), str(store_dir), json.dumps(h.PARAMS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=h.child_env(),
        start_new_session=True,  # its own process group, killed whole
    )


def test_corr_and_peers_agree_through_a_rerun_a_killed_rerun_and_retention(universe, tmp_path):
    """A published date is re-run with other prices (so old and new answers differ).

    1. A re-run SIGKILLed (whole process group) right after it committed the new correlation
       and overlap matrices, before neighbors and publication: both commands still answer the
       old snapshot, from the pinned versions, although the store's current matrices are new.
    2. Retention meanwhile keeps the pinned versions.
    3. A full re-run in another process while this one polls both commands: at every instant
       they agree; old before the publication commits, new after; the old versions are then
       collected."""
    store_dir = tmp_path / "store"
    _materialize(store_dir, LAST)
    store = MatrixStore(store_dir)
    key = LAST.isoformat()
    old_pins = published_matrix_versions(universe)[LAST]
    old = _check_agreement(universe, store, LAST)
    assert old
    _seed_prices(universe, seed=32)

    # 1. killed between the correlation commit and the publication
    proc = _start_rerun(store_dir, LAST)
    try:
        deadline = time.monotonic() + 120
        while (
            store.manifests.current_version("correlation_matrix", key, "corr")
            == old_pins["correlation_matrix"]["corr"]
        ):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert published_matrix_versions(universe)[LAST] == old_pins  # not published
    assert (
        store.manifests.current_version("correlation_matrix", key, "corr")
        != old_pins["correlation_matrix"]["corr"]
    )
    assert _check_agreement(universe, store, LAST) == old
    # the store's current matrix is the new one: an unpinned read would disagree with peers
    peer = q.peers(universe, SYM, LAST).peers[0]
    unpinned = q.corr_from_store(store, SYM, peer["neighbor"], LAST)
    assert np.float32(unpinned.corr) != np.float32(peer["corr"])

    # 2. retention keeps what the publication pins
    apply_retention(store, lambda: published_matrix_versions(universe), 5)
    assert all(
        store.has_version(asset, key, name, version)
        for asset, arrays in old_pins.items()
        for name, version in arrays.items()
    )
    assert _check_agreement(universe, store, LAST) == old

    # 3. a full re-run while both commands are polled
    seen: list[tuple] = []
    proc = _start_rerun(store_dir, LAST)
    try:
        while proc.poll() is None:
            answer = _check_agreement(universe, store, LAST)
            if answer is not None and (not seen or seen[-1] != answer):
                seen.append(answer)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert out.strip() == "SUCCESS", err[-3000:]
    new = _check_agreement(universe, store, LAST)
    assert new and new != old
    assert set(seen) <= {old, new} and seen[0] == old
    new_pins = published_matrix_versions(universe)[LAST]
    assert new_pins != old_pins
    # the publication's retention collected the versions nothing needs any more
    gone = [
        (asset, name, version)
        for asset, arrays in old_pins.items()
        for name, version in arrays.items()
        if not store.has_version(asset, key, name, version)
    ]
    assert len(gone) == sum(len(a) for a in old_pins.values())
    assert not [p for p in store_dir.rglob("*") if ".tmp-" in p.name]


# --------------------------------------------------------------------------------------------
# retention after each publication
# --------------------------------------------------------------------------------------------


HOLD = """
import sys, time
from corr_pipeline.store.matrix_store import MatrixStore
held = MatrixStore(sys.argv[1]).hold_partition("returns_matrix", sys.argv[2])
print("held", flush=True)
time.sleep(120)
"""


def test_retention_after_each_publication(universe, tmp_path, monkeypatch, capsys):
    store_dir = tmp_path / "store"
    store = MatrixStore(store_dir)
    monkeypatch.setenv("CORR_PIPELINE_STORE_DIR", str(store_dir))
    keys = [d.isoformat() for d in DAYS]
    for i, day in enumerate(DAYS[:3]):
        result = _materialize(store_dir, day, keep=2)
        assert store.files.partition_keys() == keys[max(0, i - 1) : i + 1]
    meta = _publication_metadata(result)
    assert meta["retention_keep"] == 2 and meta["retention_removed"] == [keys[0]]
    assert meta["retention_freed_bytes"] > 0
    with universe.connect() as conn:  # the published rows stay
        assert conn.execute(sa.text("SELECT count(*) FROM snapshots")).scalar_one() == 3

    # a pruned date: corr exits 2 with one line; peers, cluster, lead-lag still answer
    proc = subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", "query", "corr", SYM, "S01", "--date", keys[0]],
        capture_output=True,
        text=True,
        env=h.child_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert f"the matrices of {keys[0]} were pruned by retention" in line
    assert f"dates that still have them: {keys[2]}, {keys[1]}" in line
    for command in ("peers", "cluster", "lead-lag"):
        assert cli_main(["query", command, SYM, "--date", keys[0]]) == 0
    capsys.readouterr()

    # a partition another process uses is left alone, then pruned by hand once released
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store_dir), keys[1]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        meta = _publication_metadata(_materialize(store_dir, DAYS[3], keep=2))
        assert meta["retention_removed"] == [] and meta["retention_left_alone"] == [keys[1]]
        assert store.files.partition_keys() == keys[1:4]
        assert cli_main(["store", "list"]) == 0
        listing = capsys.readouterr().out
        row = next(line for line in listing.splitlines() if line.startswith(keys[1]))
        assert row.split()[-3:] == ["yes", "yes", "yes"]  # published, pinned, in use
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)

    assert cli_main(["store", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [p["partition"] for p in listing["partitions"]] == keys[1:4]
    assert all(p["published"] and p["pinned"] == "yes" for p in listing["partitions"])
    assert not any(p["in_use"] for p in listing["partitions"])
    assert listing["published_without_matrices"] == [keys[0]]
    assert listing["bytes"] == sum(p["bytes"] for p in listing["partitions"]) > 0

    assert cli_main(["store", "prune", "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove {keys[1]}" in out and f"would remove {keys[2]}" in out
    assert "dry run: nothing was removed" in out
    assert store.files.partition_keys() == keys[1:4]
    assert cli_main(["store", "prune", "--keep", "2"]) == 0
    out = capsys.readouterr().out
    assert f"remove {keys[1]}" in out and "freed" in out
    assert store.files.partition_keys() == keys[2:4]

    # db prune: published rows before a date go; the matrices of those dates follow at the next
    # retention (they are no longer published, and older than the kept window)
    assert cli_main(["db", "prune", "--before", keys[2], "--dry-run"]) == 0
    assert "would delete 2 published snapshot(s)" in capsys.readouterr().out
    assert cli_main(["db", "prune", "--before", keys[3]]) == 0
    assert f"deleted 3 published snapshot(s) before {keys[3]}" in capsys.readouterr().out
    assert sorted(published_matrix_versions(universe)) == [DAYS[3]]
    with pytest.raises(q.SnapshotNotFoundError):
        q.peers(universe, SYM, DAYS[0])
    assert cli_main(["store", "prune", "--keep", "2"]) == 0
    assert store.files.partition_keys() == [keys[3]]


def test_a_run_in_flight_in_the_dagster_instance_is_left_alone(universe, tmp_path):
    """Between two steps of a multiprocess run nobody holds its partition; the instance says
    it is in flight: every started run younger than its maximum runtime holds its partition,
    whatever newer runs of that partition are queued or done, unless its worker process is
    known to be gone."""
    (tmp_path / "dagster_home").mkdir()
    instance = dg.DagsterInstance.local_temp(str(tmp_path / "dagster_home"))  # default launcher

    def add_run(partition: str, status: dg.DagsterRunStatus, **tags: str) -> dg.DagsterRun:
        run = dg.DagsterRun(
            job_name="snapshot_job",
            run_id=str(uuid.uuid4()),
            status=status,
            tags={"dagster/partition": partition, **tags},
        )
        instance.add_run(run)
        return run

    def report_start(run: dg.DagsterRun, pid: int) -> None:
        event = dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name, pid=pid
        )
        instance.handle_new_event(
            dg.EventLogEntry(
                error_info=None,
                level="INFO",
                user_message="",
                run_id=run.run_id,
                timestamp=time.time(),
                dagster_event=event,
            )
        )

    exited = subprocess.Popen(["true"])
    exited.wait()
    keys = [d.isoformat() for d in DAYS]
    report_start(add_run(keys[0], dg.DagsterRunStatus.STARTED), os.getpid())  # in flight
    running = add_run(keys[1], dg.DagsterRunStatus.STARTED)  # still running, while a newer run of
    add_run(keys[1], dg.DagsterRunStatus.NOT_STARTED)  # the same partition waits to start
    add_run(keys[2], dg.DagsterRunStatus.STARTED, **{"dagster/max_runtime": "0.001"})  # stale
    add_run(keys[3], dg.DagsterRunStatus.SUCCESS)
    report_start(add_run(keys[4], dg.DagsterRunStatus.STARTED), exited.pid)  # killed: its
    add_run(keys[4], dg.DagsterRunStatus.SUCCESS)  # worker is gone, and it was re-run
    assert partitions_in_flight(instance) == {keys[0], keys[1]}
    instance.report_run_failed(running)  # it ends; only keys[0] remains in flight
    assert partitions_in_flight(instance) == {keys[0]}

    store_dir = tmp_path / "store"
    for day in DAYS[:2]:
        _materialize(store_dir, day)  # keep 5; each run in its own ephemeral instance
    result = _materialize(store_dir, DAYS[2], keep=1, instance=instance)
    meta = _publication_metadata(result)
    # keys[1] is the previous session of keys[2]: retention runs once snapshot_changes has used
    # it (SPEC §10), leaving keys[0] alone (its run is in flight)
    assert meta["retention_left_alone"] == [keys[0]] and meta["retention_removed"] == [keys[1]]
    assert MatrixStore(store_dir).files.partition_keys() == [keys[0], keys[2]]


# --------------------------------------------------------------------------------------------
# a faithful copy of the store
# --------------------------------------------------------------------------------------------

QUERIES = """
import io, json, sys
from contextlib import redirect_stdout
from corr_pipeline.cli import main
day, a = sys.argv[1], sys.argv[2]
out = {}
for command in ("peers", "cluster", "lead-lag"):
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        out[command] = main(["query", command, a, "--date", day, "--json"])
    out[command + "_json"] = json.loads(buffer.getvalue())
peer = out["peers_json"]["peers"][0]
buffer = io.StringIO()
with redirect_stdout(buffer):
    out["corr"] = main(["query", "corr", a, peer["neighbor"], "--date", day, "--json"])
out["corr_json"] = json.loads(buffer.getvalue())
out["peer"] = peer
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["cp -a", "tar"])
def test_a_copied_or_restored_store_answers_every_query(universe, tmp_path, how):
    """The store of real runs, copied with ``cp -a`` or through a tar backup restored elsewhere
    (the original moved away), answers peers, cluster, lead-lag and corr through the command
    line for every date, corr from the pinned versions and equal to the published peer."""
    store_dir = tmp_path / "store"
    for day in DAYS[3:]:
        _materialize(store_dir, day)
    copy = tmp_path / "restored" / "store"
    copy.parent.mkdir()
    if how == "cp -a":
        subprocess.run(["cp", "-a", str(store_dir), str(copy)], check=True)
    else:
        archive = tmp_path / "backup.tar"
        subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(archive), "store"], check=True)
        subprocess.run(["tar", "-C", str(copy.parent), "-xf", str(archive)], check=True)
    store_dir.rename(tmp_path / "original_moved_away")
    for day in DAYS[3:]:
        proc = subprocess.run(
            [sys.executable, "-c", QUERIES, day.isoformat(), SYM],
            capture_output=True,
            text=True,
            env=h.child_env(CORR_PIPELINE_STORE_DIR=str(copy)),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert {out[c] for c in ("peers", "cluster", "lead-lag", "corr")} == {0}, out
        assert out["corr_json"]["published"] and out["corr_json"]["snapshot_date"] == str(day)
        assert np.float32(out["corr_json"]["corr"]) == np.float32(out["peer"]["corr"])
        assert out["corr_json"]["overlap"] == out["peer"]["overlap"]
        assert (
            out["corr_json"]["versions"]["corr"]
            == (published_matrix_versions(universe)[day]["correlation_matrix"]["corr"])
        )
    assert not (tmp_path / "store").exists()
