"""Twelve nights unattended, in two minutes (issue 12's soak test, kept in CI).

A universe of a few hundred symbols is seeded with its history; then, for 12 consecutive
sessions, that day's prices are imported from a CSV (the way a desk's nightly file arrives) and
the day's partition runs through Dagster (a persistent instance, retention 3). Two of the runs
are SIGKILLed part-way, whole process group, at different stages, and re-run. At the end:

- every partition has exactly one published snapshot, equal to what its run computed;
- the store holds matrices for exactly the 3 newest published partitions, and nothing else
  (no temp file, no other partition, no version that no manifest or publication needs);
- every query command answers for every date it should: peers, cluster and lead-lag for all 12,
  corr for the newest 3 (from the pinned versions, equal to the published peers), and corr for
  the others exits 2 saying retention pruned them.

Plus the consistency under SIGKILL at many moments: a published date is re-run on changed
prices and killed at several moments of the run; after each kill ``query peers`` and ``query
corr`` agree and still answer the old snapshot; a last re-run completes and both answer the
new one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline import settings
from corr_pipeline.cli import main as cli_main
from corr_pipeline.db.prices_import import import_prices_csv
from corr_pipeline.db.published_reads import published_matrix_versions
from corr_pipeline.db.schema import prices
from corr_pipeline.defs.run import materialize_snapshot, open_instance
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.reliability import helpers as h

pytestmark = pytest.mark.slow  # the soak: outside `pytest -m "not slow"`

N_SYMBOLS = 200
SYMBOLS = [f"T{i:03d}" for i in range(N_SYMBOLS)]
SESSIONS = h.weekdays(dt.date(2026, 10, 20), 12)  # Oct 5 .. Oct 20, no exchange holiday
HISTORY = 45  # sessions of history before the first partition (lookback 40)
KEEP = 3
SYM = "T000"
KILLED = {SESSIONS[3]: "correlation_matrix", SESSIONS[8]: "lead_lag_pairs"}

RUN = """
import json, os, sys
from pathlib import Path
from corr_pipeline.defs.run import materialize_snapshot, open_instance
os.environ["CORR_PIPELINE_STORE_DIR"] = sys.argv[2]
instance = open_instance(Path(sys.argv[3]))
summary = materialize_snapshot(sys.argv[1], instance=instance, params=json.loads(sys.argv[4]),
                               in_process=True, log_level="ERROR")
print("SUCCESS" if summary.success else "FAILED", flush=True)
"""


def _all_prices(seed: int) -> list[tuple[str, dt.date, float]]:
    dates = h.weekdays(SESSIONS[-1], HISTORY + len(SESSIONS))
    return h.factor_prices(SYMBOLS, dates, seed=seed, lead_lag=("T000", "T001"))


def _run_in_child(key: str, store_dir: Path, dagster_home: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RUN, key, str(store_dir), str(dagster_home), json.dumps(h.PARAMS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=h.child_env(),
        start_new_session=True,  # its own process group, killed whole
    )


def _kill_when_committed(
    proc: subprocess.Popen, store: MatrixStore, asset: str, key: str, before: str | None
) -> None:
    """SIGKILL the child's whole process group as soon as ``asset`` of ``key`` has a current
    version other than ``before`` (the step committed), or fail if the run ends first."""
    deadline = time.monotonic() + 120
    try:
        while _current(store, asset, key) == before:
            assert proc.poll() is None, f"the run ended before {asset}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"{asset} of {key} never committed"
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)


def _current(store: MatrixStore, asset: str, key: str) -> str | None:
    name = {"correlation_matrix": "corr", "lead_lag_pairs": "pairs"}[asset]
    return store.manifests.current_version(asset, key, name)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_twelve_nights_with_retention_and_two_killed_runs(
    clean_db: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    store_dir, dagster_home = tmp_path / "store", tmp_path / "dagster_home"
    monkeypatch.setenv(settings.ENV_STORE_DIR, str(store_dir))
    monkeypatch.setenv("CORR_PIPELINE_KEEP_MATRICES", str(KEEP))
    store = MatrixStore(store_dir)
    everything = _all_prices(seed=71)
    history = [row for row in everything if row[1] < SESSIONS[0]]
    h.insert_prices(clean_db, history)
    instance = open_instance(dagster_home)
    try:
        for day in SESSIONS:
            rows = [row for row in everything if row[1] == day]
            csv = h.write_prices_csv(tmp_path / f"prices-{day}.csv", rows)
            assert import_prices_csv(clean_db, csv).inserted == N_SYMBOLS
            key = day.isoformat()
            if day in KILLED:
                proc = _run_in_child(key, store_dir, dagster_home)
                _kill_when_committed(proc, store, KILLED[day], key, None)
                assert day not in published_matrix_versions(clean_db)
            summary = materialize_snapshot(
                key, instance=instance, params=h.PARAMS, in_process=True, log_level="ERROR",
            )  # fmt: skip
            assert summary.success, summary
            assert all(summary.checks.values()), summary.checks
    finally:
        instance.dispose()

    # one published snapshot per partition, each whole
    with clean_db.connect() as conn:
        dates = conn.execute(sa.text("SELECT snapshot_date FROM snapshots ORDER BY 1")).scalars()
        assert list(dates) == SESSIONS
        for day in SESSIONS:
            counts = h.snapshot_counts(clean_db, day)
            assert counts["symbol_clusters"] == N_SYMBOLS and counts["peer_neighbors"] > 0
    pins = published_matrix_versions(clean_db)
    assert sorted(pins) == SESSIONS

    # matrices for exactly the newest KEEP published partitions, nothing else on disk
    newest = [d.isoformat() for d in SESSIONS[-KEEP:]]
    assert store.files.partition_keys() == newest
    leftovers = [p for p in store_dir.rglob("*") if ".tmp-" in p.name]
    assert not leftovers, leftovers
    for key in newest:
        day = dt.date.fromisoformat(key)
        for asset, arrays in pins[day].items():
            for name, version in arrays.items():
                assert store.has_version(asset, key, name, version), (asset, key, name)
    version_files = {p for p in store_dir.rglob("*.npy")}
    pinned_files = {
        p
        for p in version_files
        if any(
            p.parent.parent.name == asset
            and p.parent.name in newest
            and p.name == f"{name}.{version}.npy"
            for day in SESSIONS[-KEEP:]
            for asset, arrays in pins[day].items()
            for name, version in arrays.items()
        )
    }
    assert version_files == pinned_files  # every version left is one a publication pins

    # every query answers for every date it should
    for day in SESSIONS:
        key = day.isoformat()
        for command in ("peers", "cluster", "lead-lag"):
            code, out, err = _cli(capsys, "query", command, SYM, "--date", key, "--json")
            assert code == 0, (command, key, err)
            assert json.loads(out)
        peer = q.peers(clean_db, SYM, day).peers[0]
        code, out, err = _cli(capsys, "query", "corr", SYM, peer["neighbor"], "--date", key)
        if key in newest:
            assert code == 0, err
            answer = q.corr(clean_db, SYM, peer["neighbor"], day, store=store)
            assert np.float32(answer.corr) == np.float32(peer["corr"])
            assert answer.overlap == peer["overlap"]
        else:
            assert code == 2 and out == ""
            (line,) = err.strip().splitlines()
            assert f"the matrices of {key} were pruned by retention" in line, line


def _agreement(engine: sa.Engine, store: MatrixStore, day: dt.date) -> tuple:
    """``query peers`` and ``query corr`` of every peer of SYM at this instant (no publication
    runs concurrently here): the corr and overlap answered equal the published ones."""
    peers = q.peers(engine, SYM, day).peers
    for peer in peers:
        answer = q.corr(engine, SYM, peer["neighbor"], day, store=store)
        assert answer.published and answer.snapshot_date == day
        assert np.float32(answer.corr) == np.float32(peer["corr"]), (peer, answer)
        assert answer.overlap == peer["overlap"], (peer, answer)
    return tuple((p["neighbor"], p["corr"], p["overlap"]) for p in peers)


#: Seconds from the start of a re-run's process to its SIGKILL: interpreter start-up, the
#: window load, the correlation, the later steps, around and after the publication.
KILL_MOMENTS = (0.1, 0.6, 1.2, 1.8, 2.5, 3.5, 5.0)


def test_a_rerun_killed_at_many_moments_leaves_one_consistent_snapshot(
    clean_db: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A published date re-run on changed prices (old and new answers differ), its whole
    process group SIGKILLed at each of :data:`KILL_MOMENTS`: after every kill both commands
    answer the same snapshot and agree (the old one, or the new one once a publication
    committed); a last re-run completes and both answer the new one; no temp file is left."""
    store_dir, dagster_home = tmp_path / "store", tmp_path / "dagster_home"
    monkeypatch.setenv(settings.ENV_STORE_DIR, str(store_dir))
    store = MatrixStore(store_dir)
    day = SESSIONS[-1]
    key = day.isoformat()
    h.insert_prices(clean_db, _all_prices(seed=72))
    instance = open_instance(dagster_home)
    try:
        assert materialize_snapshot(
            key, instance=instance, params=h.PARAMS, in_process=True, log_level="ERROR",
        ).success  # fmt: skip
    finally:
        instance.dispose()
    old = _agreement(clean_db, store, day)
    with clean_db.begin() as conn:
        conn.execute(sa.delete(prices))
    h.insert_prices(clean_db, _all_prices(seed=73))

    seen = []
    for moment in KILL_MOMENTS:
        proc = _run_in_child(key, store_dir, dagster_home)
        try:
            time.sleep(moment)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(30)
        seen.append(_agreement(clean_db, store, day))

    proc = _run_in_child(key, store_dir, dagster_home)
    out, err = proc.communicate(timeout=180)
    assert out.strip() == "SUCCESS", err[-3000:]
    new = _agreement(clean_db, store, day)
    assert new != old
    assert set(seen) <= {old, new}  # one snapshot at a time: old, or new once published
    assert seen[0] == old
    assert not [p for p in store_dir.rglob("*") if ".tmp-" in p.name]
