"""Faults, for real: a publisher SIGKILLed inside its transaction, the database stopped under a
publisher, and a database that is unreachable when the run starts (Dagster retries with backoff
and recovers when the database comes back).

Already covered elsewhere (not repeated here): SIGKILL while writing a matrix and disk full while
writing one (``store/test_store_faults.py::test_sigkill_mid_write_leaves_previous_version``,
``::test_sigkill_before_the_manifest_commit_keeps_the_previous_version``,
``::test_disk_full_gives_clean_error_and_consistent_store``), an error raised inside PostgreSQL mid-publish
(``db/test_publish.py::test_failure_mid_publish_keeps_previous_snapshot``), the unreachable-server
message (``db/test_engine_schema.py::test_unreachable_server_error_is_clear_and_redacted``).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import psutil
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from corr_pipeline import settings
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.db.schema import init_schema
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.retries import DATABASE_RETRY_POLICY
from corr_pipeline.defs.run import open_instance
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.reliability import helpers as h

D = dt.date(2026, 10, 30)
KEY = D.isoformat()
CHILD = "corr_pipeline_tests.reliability._publisher_child"


def start_publisher(mode: str, url: str, *, n: int, k: int, version: int) -> subprocess.Popen:
    return subprocess.Popen(
        h.python_module_cmd(CHILD, mode, url, KEY, str(n), str(k), str(version)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=h.REPO_ROOT,
        env=h.child_env(),
    )


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line, or fail after ``timeout`` seconds."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box:
        proc.kill()
        raise AssertionError(f"no output from the child within {timeout}s: {proc.stderr.read()}")
    return box[0].strip()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# --------------------------------------------------------------------------------------------
# SIGKILL while publishing
# --------------------------------------------------------------------------------------------


def test_publisher_killed_inside_its_transaction_leaves_the_previous_snapshot(
    clean_db, database_url
):
    """The child deleted the old snapshot, inserted the new snapshots row and staged every
    row, all inside its open transaction, and is SIGKILLed there: the database rolls it back."""
    previous = h.publish_arguments(D, n=300, k=5, version=1)
    publish_snapshot(clean_db, SnapshotResults(**previous))
    before = h.snapshot_rows(clean_db, D)
    app = f"corr_rel_hold_{uuid.uuid4().hex[:8]}"
    child = start_publisher(
        "hold", h.with_application_name(database_url, app), n=400, k=4, version=2
    )
    try:
        assert read_line(child, 120) == "IN_TRANSACTION"
        (backend,) = h.backends_of(clean_db, app)
        # the child's transaction is open and has written (DELETE + INSERT done, not committed)
        assert backend["state"] == "idle in transaction" and backend["has_xid"], backend
        assert h.snapshot_rows(clean_db, D) == before  # readers still see the old version
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    wait_until(lambda: not h.backends_of(clean_db, app), 30, "the killed child's backend to end")
    assert h.snapshot_rows(clean_db, D) == before
    # its advisory lock died with it: the next publisher of the date does not wait
    report = publish_snapshot(
        clean_db, SnapshotResults(**h.publish_arguments(D, n=50, k=2, version=3))
    )
    assert report.lock_wait_seconds < 5
    assert h.snapshot_counts(clean_db, D) == h.expected_counts(
        h.publish_arguments(D, n=50, k=2, version=3)
    )


def test_publisher_killed_while_postgres_works_on_its_rows(clean_db, database_url):
    """No hook: a large publication SIGKILLed as soon as its backend is busy inside the
    transaction (COPY or INSERT ... SELECT running), wherever exactly that is."""
    previous = h.publish_arguments(D, n=500, k=5, version=11)
    publish_snapshot(clean_db, SnapshotResults(**previous))
    before = h.snapshot_rows(clean_db, D)
    killed_in: list[str] = []
    for attempt, n in enumerate((20_000, 60_000, 120_000)):
        app = f"corr_rel_once_{attempt}_{uuid.uuid4().hex[:8]}"
        child = start_publisher(
            "once", h.with_application_name(database_url, app), n=n, k=10, version=12
        )
        try:
            busy = None
            while child.poll() is None and busy is None:
                busy = next(
                    (
                        b
                        for b in h.backends_of(clean_db, app)
                        if b["state"] == "active" and b["has_xid"]
                    ),
                    None,
                )
            if busy is not None:
                child.send_signal(signal.SIGKILL)
                child.wait(30)
                killed_in.append(busy["query"][:80])
        finally:
            child.kill()
            child.wait()
        wait_until(lambda app=app: not h.backends_of(clean_db, app), 30, "the backend to end")
        if killed_in:
            break
        # the child finished before we saw it busy: the date now holds its version; restore
        publish_snapshot(clean_db, SnapshotResults(**previous))
    assert killed_in, "never caught the publisher inside its transaction"
    assert h.snapshot_rows(clean_db, D) == before, killed_in


# --------------------------------------------------------------------------------------------
# The database stops under a publisher (own throwaway embedded server)
# --------------------------------------------------------------------------------------------


def _stop_immediately(server: db_engine.EmbeddedServer) -> None:
    """``pg_ctl stop -m immediate``: every backend is killed without a checkpoint, as in a crash
    or an operator pulling the plug; the next start runs crash recovery."""
    # SIGQUIT is what `pg_ctl stop -m immediate` sends; signalling it directly does not depend on
    # the server's account being able to traverse pytest's tmp tree, which another pytest session
    # on the machine may close (see conftest.py)
    postmaster = psutil.Process(server.pid)
    postmaster.send_signal(signal.SIGQUIT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if postmaster.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the postmaster did not stop"
        time.sleep(0.05)


def test_database_stopped_mid_publish_then_restarted(tmp_path_factory):
    pgdata = tmp_path_factory.mktemp("own_pg") / "pgdata"
    secret = f"Stop-{uuid.uuid4().hex[:10]}"
    server = db_engine.start_embedded_server(pgdata)
    try:
        # trust authentication on the socket ignores the password; it is here to be leaked
        url = make_url(server.url()).set(password=secret).render_as_string(hide_password=False)
        engine = db_engine.get_engine(url)
        init_schema(engine)
        previous = h.publish_arguments(D, n=300, k=5, version=21)
        publish_snapshot(engine, SnapshotResults(**previous))
        before = h.snapshot_rows(engine, D)

        child = start_publisher("hold", url, n=400, k=4, version=22)
        try:
            assert read_line(child, 120) == "IN_TRANSACTION"
            _stop_immediately(server)
            child.stdin.write("go\n")
            child.stdin.flush()
            outcome = json.loads(read_line(child, 60))
            assert child.wait(30) == 3
        finally:
            child.kill()
            child.wait()
        # the publisher got a connection error, which the assets' RetryPolicy retries
        assert outcome["error"].endswith("OperationalError"), outcome  # psycopg or SQLAlchemy's
        assert "connection" in outcome["message"], outcome
        assert outcome["retryable"] is True
        assert secret not in json.dumps(outcome)

        db_engine.dispose_engines()
        with pytest.raises(db_engine.DatabaseUnavailableError) as down:
            db_engine.get_engine(url)
        assert secret not in str(down.value) and "Fix:" in str(down.value)

        db_engine.release_embedded_server(pgdata)  # the server is gone: drop our handle
        restarted = db_engine.start_embedded_server(pgdata)  # crash recovery runs here
        assert restarted.url() == server.url()
        server = restarted
        engine = db_engine.get_engine(url)
        assert h.snapshot_rows(engine, D) == before  # the previous snapshot, whole
        again = h.publish_arguments(D, n=400, k=4, version=22)
        publish_snapshot(
            engine, SnapshotResults(**again)
        )  # re-running the publication now succeeds
        assert h.snapshot_counts(engine, D) == h.expected_counts(again)
    finally:
        db_engine.release_embedded_server(pgdata)
        shutil.rmtree(pgdata, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Database unreachable when the run starts: Dagster retries with backoff
# --------------------------------------------------------------------------------------------

#: Same shape as the production policy (retries, exponential backoff, +/- jitter) with a base
#: delay of 0.2 s instead of 15 s so that the test waits ~2 s instead of ~2 minutes.
BASE_DELAY = 0.2


@pytest.fixture
def fast_retries(monkeypatch):
    """Swap the snapshot op's RetryPolicy for one with a short base delay (test only)."""
    assert DATABASE_RETRY_POLICY.backoff == dg.Backoff.EXPONENTIAL
    assert DATABASE_RETRY_POLICY.delay >= 5 and DATABASE_RETRY_POLICY.max_retries >= 3
    fast = dg.RetryPolicy(
        max_retries=DATABASE_RETRY_POLICY.max_retries,
        delay=BASE_DELAY,
        backoff=DATABASE_RETRY_POLICY.backoff,
        jitter=DATABASE_RETRY_POLICY.jitter,
    )
    swapped = []
    for asset in snapshot_assets:
        if asset.op.retry_policy == DATABASE_RETRY_POLICY:
            monkeypatch.setattr(asset.op, "_retry_policy", fast)
            swapped.append(asset.op.name)
    assert swapped == ["snapshot"]  # the one op, which reads and writes the database
    return fast


@pytest.fixture
def unreachable_url(database_url, monkeypatch):
    """``CORR_PIPELINE_DATABASE_URL`` = a password-carrying URL on a closed loopback port;
    yields (url, secret, port, unix socket of the real server behind it)."""
    parsed = make_url(database_url)
    socket_dir = parsed.query.get("host")
    if not socket_dir or not Path(str(socket_dir)).is_dir():
        pytest.skip("needs the embedded test server (a Unix socket to forward to)")
    port = h.free_tcp_port()
    secret = f"Unreach-{uuid.uuid4().hex[:12]}"
    url = f"postgresql://postgres:{secret}@127.0.0.1:{port}/{parsed.database}?connect_timeout=5"
    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    yield url, secret, port, Path(str(socket_dir)) / f".s.PGSQL.{parsed.port}"
    db_engine.dispose_engines()


def _seed_prices(engine: sa.Engine) -> None:
    symbols = [f"S{i:02d}" for i in range(12)]
    h.insert_prices(engine, h.factor_prices(symbols, h.weekdays(D, 45), seed=31))


def test_unreachable_database_fails_after_backed_off_retries(
    clean_db, tmp_path, fast_retries, unreachable_url, capfd
):
    url, secret, port, _ = unreachable_url
    _seed_prices(clean_db)
    store = tmp_path / "store"
    instance = open_instance(tmp_path / "dagster_home")  # persistent: events land in files
    try:
        result = h.materialize(store, KEY, instance=instance)
    finally:
        instance.dispose()

    assert not result.success
    retries = h.events_of(result, "STEP_UP_FOR_RETRY")
    assert [e.step_key for e in retries] == ["snapshot"] * fast_retries.max_retries
    waits = [e.event_specific_data.seconds_to_wait for e in retries]
    for attempt, wait in enumerate(waits, start=1):  # exponential backoff, +/- one base delay
        centre = (2**attempt - 1) * BASE_DELAY
        assert centre - BASE_DELAY - 1e-9 <= wait <= centre + BASE_DELAY + 1e-9, waits
    assert [e.step_key for e in h.events_of(result, "STEP_FAILURE")] == ["snapshot"]
    (message,) = h.failure_messages(result)
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/" in message
    assert (
        "postgres:***@127.0.0.1" in message and "Fix: check CORR_PIPELINE_DATABASE_URL" in message
    )
    assert not h.events_of(result, "ASSET_MATERIALIZATION")
    assert not store.exists() or not any(store.rglob("*.npy"))
    assert h.snapshot_counts(clean_db, D)["snapshots"] == 0
    # the password is nowhere: events (messages, errors, stack traces), console output
    assert secret not in h.all_event_text(result)
    captured = capfd.readouterr()
    # the console log was captured (at INFO, dagster.yaml's python_log_level: the failure and
    # its redacted error are there)
    assert "STEP_FAILURE" in captured.err + captured.out
    assert "postgres:***@127.0.0.1" in captured.err + captured.out
    assert secret not in captured.err + captured.out
    stored = [p for p in (tmp_path / "dagster_home").rglob("*") if p.is_file()]
    # the redacted error was stored (so the files were really written), the password never
    assert any(b"postgres:***@127.0.0.1" in p.read_bytes() for p in stored), stored
    for path in stored:  # run and event-log storage, compute logs
        assert secret.encode() not in path.read_bytes(), path


def test_run_recovers_when_the_database_comes_back(
    clean_db, tmp_path, fast_retries, unreachable_url, monkeypatch
):
    """Closed port at the first attempt; right after that attempt fails, a forwarder to the
    real server opens on the port (the database "comes back" during the backoff wait); the
    retried step and the rest of the run succeed and publish. The password reaches no event,
    metadata value, published row or matrix-store file."""
    url, secret, port, unix_socket = unreachable_url
    _seed_prices(clean_db)
    store = tmp_path / "store"
    proxy = h.TcpToUnixProxy(port, unix_socket)
    real_get_engine = db_engine.get_engine
    failures: list[str] = []

    def get_engine_then_recover(url=None):  # type: ignore[no-untyped-def]
        try:
            return real_get_engine(url)
        except db_engine.DatabaseUnavailableError as exc:
            failures.append(str(exc))
            if len(failures) == 1:
                proxy.start()
            raise

    monkeypatch.setattr(db_engine, "get_engine", get_engine_then_recover)
    try:
        result = h.materialize(store, KEY)
    finally:
        db_engine.dispose_engines()
        proxy.stop()

    assert result.success, h.failure_messages(result)
    assert len(failures) == 1 and secret not in failures[0]
    retried = [e.step_key for e in h.events_of(result, "STEP_UP_FOR_RETRY")]
    assert retried == ["snapshot"]
    counts = h.snapshot_counts(clean_db, D)
    assert counts["snapshots"] == 1 and counts["symbol_clusters"] == 12
    publication = materializations(result, "snapshot_publication")[0]
    assert publication.metadata["database"].value == f"127.0.0.1:{port}/{make_url(url).database}"

    assert secret not in h.all_event_text(result)
    with clean_db.connect() as conn:
        published = conn.execute(sa.text("SELECT params::text FROM snapshots")).scalar_one()
    assert secret not in published and "127.0.0.1" not in published
    stored_files = [p for p in store.rglob("*") if p.is_file()]
    assert stored_files
    for path in stored_files:
        assert secret.encode() not in path.read_bytes(), path
    assert MatrixStore(store).load("correlation_matrix", KEY, "corr").array.shape == (12, 12)
