"""Concurrency across processes: two runs of the same partition at once, and readers polling
while a snapshot is published and withdrawn over and over.

Already covered elsewhere (not repeated here): two publisher *threads* racing on one date
(``db/test_publish.py::test_concurrent_publishers_end_with_one_whole_snapshot``), a reader thread
during one slowed-down publication (``::test_readers_never_see_a_half_published_snapshot``),
concurrent matrix writers and a reader (``store/test_matrix_store.py::
test_concurrent_writers_and_reader_never_see_a_mismatch``).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import dagster as dg
import numpy as np
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline import settings
from corr_pipeline.db.schema import PUBLISHED_TABLES
from corr_pipeline.defs.run import materialize_snapshot
from corr_pipeline.defs.specs import MATRIX_ASSETS
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore
from corr_pipeline_tests.reliability import helpers as h

D = dt.date(2026, 10, 30)
KEY = D.isoformat()


def assert_same_store(store_a, store_b) -> None:
    """Every asset bundle of the partition: same labels, arrays equal bit for bit."""
    a, b = MatrixStore(store_a), MatrixStore(store_b)
    for asset in MATRIX_ASSETS:
        bundle_a, bundle_b = a.load_bundle(asset, KEY), b.load_bundle(asset, KEY)
        assert bundle_a.labels == bundle_b.labels, asset
        assert bundle_a.names == bundle_b.names, asset
        for name in bundle_a.names:
            x, y = np.asarray(bundle_a[name]), np.asarray(bundle_b[name])
            assert x.dtype == y.dtype and x.shape == y.shape, (asset, name)
            assert x.tobytes() == y.tobytes(), (asset, name)


def _run_snapshot(go, results, store: str, database_url: str) -> None:
    """Body of a forked run process: the project's runner, started when ``go`` is set; its
    outcome goes to ``results``. (Each run records its events in its own ephemeral Dagster
    instance: a shared SQLite instance only adds ~10 s of event writes per run here, and the
    guarantees under test are those of the database and the matrix store.)"""
    try:
        os.environ[settings.ENV_DATABASE_URL] = database_url
        os.environ[settings.ENV_STORE_DIR] = str(store)
        instance = dg.DagsterInstance.ephemeral()
        go.wait(120)
        started = time.time()
        summary = materialize_snapshot(KEY, instance=instance, params=h.PARAMS, in_process=True)
        results.put(
            {
                "pid": os.getpid(),
                "started": started,
                "finished": time.time(),
                "run_id": summary.run_id,
                "success": summary.success,
                "failed_steps": summary.failed_steps,
                "checks": summary.checks,
            }
        )
        instance.dispose()
    except BaseException as exc:  # pragma: no cover - reported by the parent
        results.put({"pid": os.getpid(), "error": repr(exc)})


def test_two_runs_of_the_same_partition_at_once(clean_db, database_url, tmp_path):
    """Two processes run the whole snapshot of the same date at the same moment, on the same
    database and matrix store. The end state equals what one run alone
    produces: one whole snapshot in the database, whole bundles in the store, no temp files.
    (Started through a forkserver that preloads the runner: one interpreter start-up instead
    of two. Not a plain fork of this process: it may have run numba's OpenMP kernels already,
    and GNU OpenMP aborts a forked child that uses it again.)"""
    symbols = [f"S{i:02d}" for i in range(24)]
    h.insert_prices(clean_db, h.factor_prices(symbols, h.weekdays(D, 45), seed=51))
    store = tmp_path / "store"
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["corr_pipeline_tests.reliability.test_concurrency"])
    go, results = context.Event(), context.Queue()
    children = [
        context.Process(target=_run_snapshot, args=(go, results, str(store), database_url))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    try:
        go.set()
        outcomes = [results.get(timeout=300) for _ in children]
        for child in children:
            child.join(60)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()
    assert {o["pid"] for o in outcomes} == {c.pid for c in children}
    for outcome in outcomes:
        assert outcome.get("success"), outcome
        assert outcome["checks"] and all(outcome["checks"].values()), outcome
    assert max(o["started"] for o in outcomes) < min(o["finished"] for o in outcomes)  # overlap
    concurrent = h.snapshot_rows(clean_db, D)
    with clean_db.connect() as conn:
        run_id = conn.execute(
            sa.text("SELECT params->>'dagster_run_id' FROM snapshots WHERE snapshot_date = :d"),
            {"d": D},
        ).scalar_one()
    assert run_id in {o["run_id"] for o in outcomes}
    assert not [p for p in store.rglob("*") if ".tmp-" in p.name]

    single_store = tmp_path / "single_store"
    single = h.materialize(single_store, KEY)
    assert single.success, h.failure_messages(single)
    assert h.snapshot_rows(clean_db, D) == concurrent
    assert len(concurrent["symbol_clusters"]) == len(symbols)
    assert_same_store(store, single_store)


def _write_bundle(go, base: str, writer: int, rounds: int) -> None:
    store = MatrixStore(base)
    go.wait(60)
    for _ in range(rounds):
        store.save_bundle(
            "top_k_neighbors",
            KEY,
            MatrixBundle(
                {
                    "index": np.full((64, 5), writer, dtype=np.int32),
                    "corr": np.full((64, 5), writer, dtype=np.float32),
                    "overlap": np.full((64, 5), writer, dtype=np.int16),
                },
                labels={"writer": writer},
            ),
        )


def test_two_store_writers_of_one_bundle_leave_it_whole(tmp_path):
    """Two processes store the same multi-array bundle (asset, partition) at once, 16 times
    over: afterwards the bundle always loads, every array and the labels from ONE writer. (Before
    bundle writers took turns, about one race in twenty left a manifest naming an array version
    the other writer had replaced: a bundle refused until re-materialized.)"""
    context = multiprocessing.get_context("fork")
    for trial in range(16):
        base = str(tmp_path / f"trial{trial}")
        go = context.Event()
        writers = [
            context.Process(target=_write_bundle, args=(go, base, writer, 2)) for writer in (1, 2)
        ]
        for process in writers:
            process.start()
        go.set()
        for process in writers:
            process.join(60)
            assert process.exitcode == 0, (trial, process.exitcode)
        bundle = MatrixStore(base).load_bundle("top_k_neighbors", KEY)
        writer = bundle.labels["writer"]
        assert sorted(bundle.names) == ["corr", "index", "overlap"]
        for name in bundle.names:
            assert np.all(np.asarray(bundle[name]) == writer), (trial, name)
        assert not [p for p in Path(base).rglob("*") if ".tmp-" in p.name]


def test_readers_polling_during_repeated_publication_see_all_or_nothing(clean_db, database_url):
    """A publisher process publishes two versions of the date in turn and withdraws each again
    (30 times); meanwhile this process polls the per-table counts (one statement) and the
    ``peers`` / ``cluster`` queries. Every observation is nothing, or one whole version."""
    n, k, versions = 600, 5, (61, 62)
    expected = {v: h.expected_counts(h.publish_arguments(D, n=n, k=k, version=v)) for v in versions}
    nothing = {table: 0 for table in PUBLISHED_TABLES}
    symbol = {v: f"V{v}_{7:06d}" for v in versions}
    union = " UNION ALL ".join(
        f"SELECT '{table}', count(*) FROM {table} WHERE snapshot_date = :d"
        for table in PUBLISHED_TABLES
    )
    publisher = subprocess.Popen(
        h.python_module_cmd(
            "corr_pipeline_tests.reliability._publisher_child",
            "loop",
            database_url,
            KEY,
            str(n),
            str(k),
            str(versions[0]),
            "30",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=h.REPO_ROOT,
        env=h.child_env(),
    )
    counts_seen: list[dict[str, int]] = []
    answers: list[str] = []
    bad: list[str] = []
    try:
        while publisher.poll() is None:
            with clean_db.connect() as conn:
                counts = {t: int(c) for t, c in conn.execute(sa.text(union), {"d": D})}
            counts_seen.append(counts)
            if counts != nothing and counts not in expected.values():
                bad.append(f"counts {counts}")
            # ask for the version just seen (the race is a change committing mid-query)
            seen = [v for v in versions if counts == expected[v]]
            v = seen[0] if seen else versions[len(answers) % 2]
            try:
                peers = q.peers(clean_db, symbol[v], D)
                cluster = q.cluster(clean_db, symbol[v], D)
            except (q.SnapshotNotFoundError, q.UnknownSymbolError):
                answers.append("absent")
                continue
            except q.QueryError as exc:  # e.g. "has no cluster in the snapshot": a half view
                bad.append(f"{type(exc).__name__}: {exc}")
                continue
            answers.append(f"version {v}")
            if (
                peers.snapshot.params.get("version") != v
                or len(peers.peers) != k
                or peers.cluster_id is None
                or cluster.snapshot.params.get("version") != v
                or cluster.size != len(range(0, n, 7))  # labels are i % 7; symbol 7 -> 0
            ):
                bad.append(
                    f"peers of {symbol[v]}: version {peers.snapshot.params}, "
                    f"{len(peers.peers)} peers, cluster {peers.cluster_id}, "
                    f"cluster size {cluster.size} in version {cluster.snapshot.params}"
                )
        out, err = publisher.communicate(timeout=60)
    finally:
        publisher.kill()
        publisher.wait()
    assert publisher.returncode == 0 and out.strip().endswith("DONE"), err[-3000:]
    assert not bad, bad[:10]
    assert nothing in counts_seen
    assert any(c in expected.values() for c in counts_seen), "never saw a published version"
    assert "absent" in answers and any(a.startswith("version") for a in answers)
