"""Security: credentials never reach output, keys never steer paths out of the matrix store,
the embedded PostgreSQL is reachable only through its Unix socket.

Already covered elsewhere (not repeated here): URL redaction rules
(``db/test_engine_schema.py::test_redact_url``, ``::test_unreachable_server_error_is_clear_and_
redacted``, ``::test_server_rejection_error_is_redacted``); ``../``, ``/abs`` and separators in
store keys (``store/test_matrix_store.py::test_path_traversal_is_rejected``); odd symbols as bound
parameters (``test_query.py``, ``reliability/test_bad_input.py``); the password of a URL absent
from Dagster events, console output, published rows, store and Dagster storage files
(``reliability/test_faults.py::test_unreachable_database_fails_after_backed_off_retries``,
``::test_run_recovers_when_the_database_comes_back``).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
import traceback
import uuid
from pathlib import Path
from urllib.parse import quote

import dagster as dg
import numpy as np
import psutil
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from corr_pipeline import cli, settings
from corr_pipeline import query as q
from corr_pipeline.db import engine as db_engine
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.io_manager import MatrixStoreIOManager
from corr_pipeline.defs.partitions import snapshot_date
from corr_pipeline.defs.resources import PostgresResource
from corr_pipeline.defs.retries import DATABASE_RETRY_POLICY
from corr_pipeline.defs.run import materialize_snapshot, open_instance
from corr_pipeline.store.matrix_store import InvalidStoreKeyError, MatrixBundle, MatrixStore
from corr_pipeline_tests.fixtures.deployment import use_store
from corr_pipeline_tests.reliability import helpers as h

# --------------------------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------------------------


def _bad_urls(port: int, secret: str) -> dict[str, tuple[str, list[str], str]]:
    """name -> (CORR_PIPELINE_DATABASE_URL, fragments of the secret that must not show,
    text the error must contain)."""
    return {
        "closed_port": (
            f"postgresql://alice:{secret}@127.0.0.1:{port}/pricesdb?connect_timeout=3",
            [secret],
            f"cannot connect to PostgreSQL at 127.0.0.1:{port}/pricesdb",
        ),
        "password_in_query": (
            f"postgresql://127.0.0.1:{port}/pricesdb?user=alice&password={secret}"
            "&connect_timeout=3",
            [secret],
            f"127.0.0.1:{port}/pricesdb",
        ),
        "unencoded_at_and_slash_in_password": (
            f"postgresql://alice:{secret[:6]}@{secret[6:12]}/{secret[12:]}@127.0.0.1:{port}/db",
            [secret[:6], secret[6:12], secret[12:]],
            "not a valid database URL",
        ),
        "slash_and_hash_in_password": (
            f"postgresql://alice:{secret[:6]}/{secret[6:12]}#{secret[12:]}@127.0.0.1:{port}/db"
            "?connect_timeout=3",
            [secret[:6], secret[6:12], secret[12:]],
            f"cannot connect to PostgreSQL at 127.0.0.1:{port}/db",
        ),
        "libpq_key_value_form": (
            f"host=127.0.0.1 port={port} user=alice password={secret} dbname=pricesdb",
            [secret],
            "not a valid database URL",
        ),
        "not_postgres": (
            f"mysql://alice:{secret}@127.0.0.1:{port}/pricesdb",
            [secret],
            "corr_pipeline needs PostgreSQL",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "closed_port",
        "password_in_query",
        "unencoded_at_and_slash_in_password",
        "slash_and_hash_in_password",
        "libpq_key_value_form",
        "not_postgres",
    ],
)
def test_cli_errors_never_show_the_password(case, monkeypatch, capsys, caplog):
    """``corr-pipeline db init`` against a bad database URL: exit 2 and a one-line error naming
    the server and the variable, with neither the password nor a piece of it -- also not in
    log records, nor in the full traceback that ``--debug`` shows."""
    port, secret = h.free_tcp_port(), f"Pw{uuid.uuid4().hex[:16]}"
    url, fragments, expected = _bad_urls(port, secret)[case]
    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    caplog.set_level(logging.DEBUG)

    assert cli.main(["db", "init"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("corr-pipeline: error: ") and expected in err, err
    assert settings.ENV_DATABASE_URL in err, err
    with pytest.raises(Exception) as info:  # --debug: the exception propagates
        cli.main(["--debug", "db", "init"])
    shown = "".join(traceback.format_exception(info.value))
    for text in (out, err, shown, caplog.text, *capsys.readouterr()):
        for fragment in fragments:
            assert fragment not in text, (case, fragment, text)
    db_engine.dispose_engines()


def test_installed_command_stderr_has_no_password():
    """The real ``corr-pipeline`` process (what an operator or a cron mail sees)."""
    port, secret = h.free_tcp_port(), f"Pw{uuid.uuid4().hex[:16]}"
    url = f"postgresql://alice:{secret}@127.0.0.1:{port}/pricesdb?connect_timeout=3"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("corr-pipeline")), "db", "init"],
        capture_output=True,
        text=True,
        env=h.child_env(**{settings.ENV_DATABASE_URL: url}),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/pricesdb" in proc.stderr
    assert "alice:***@" in proc.stderr
    assert secret not in proc.stdout + proc.stderr


# Every character of issue 12 item 6 that must be percent-encoded in a user name or password
SPECIAL_CHARACTERS = {"space": " ", "at": "@", "colon": ":", "percent": "%", "slash": "/"}
ALL_SPECIALS = "".join(SPECIAL_CHARACTERS.values())


def _credentials(special: str) -> tuple[str, str, list[str]]:
    """A user name and a password both containing ``special``, and every text of the password
    that must never show: decoded, percent-encoded (as typed in the URL), and each of the two
    halves around ``special`` (what a parser splitting the URL there would leak)."""
    tag = uuid.uuid4().hex
    head, tail = f"Pw{tag[:12]}", f"Sc{tag[12:24]}"
    password = f"{head}{special}{tail}"
    user = f"us{special}er{tag[24:28]}"
    return user, password, [password, quote(password, safe=""), head, tail]


def _url(user: str, password: str, port: int, *, encoded: bool = True) -> str:
    """The URL as a user types it: user name and password percent-encoded (or not)."""
    if encoded:
        user, password = quote(user, safe=""), quote(password, safe="")
    return f"postgresql://{user}:{password}@127.0.0.1:{port}/pricesdb?connect_timeout=3"


def _assert_hidden(secrets: list[str], *texts: str) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, (secret, text)


@pytest.mark.parametrize("encoded", [True, False], ids=["encoded", "typed_raw"])
@pytest.mark.parametrize("special", SPECIAL_CHARACTERS.values(), ids=SPECIAL_CHARACTERS.keys())
def test_db_url_never_shows_the_password(special, encoded, monkeypatch, capsys, caplog):
    """``corr-pipeline db url`` with CORR_PIPELINE_DATABASE_URL set: SQLAlchemy's rendering with
    the password hidden. Typed without encoding, ``@`` and ``/`` make the URL ambiguous: it is
    refused, in one line, without being shown."""
    user, password, secrets = _credentials(special)
    port = h.free_tcp_port()
    monkeypatch.setenv(settings.ENV_DATABASE_URL, _url(user, password, port, encoded=encoded))
    caplog.set_level(logging.DEBUG)
    code = cli.main(["db", "url"])
    out, err = capsys.readouterr()
    _assert_hidden(secrets, out, err, caplog.text)
    if encoded or special in " %":
        assert code == 0, err
        shown_user = quote(user, safe=" +") if encoded or special == " " else "us%25er"
        assert out.startswith(f"postgresql+psycopg://{shown_user}"), out
        assert f":***@127.0.0.1:{port}/pricesdb?connect_timeout=3" in out, out
    elif special == ":":  # the first ':' ends the user name; the rest is (hidden) password
        assert code == 0 and out.startswith("postgresql+psycopg://us:***@127.0.0.1"), out
    else:
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "not a valid database URL" in err, err
        assert settings.ENV_DATABASE_URL in err


@pytest.mark.parametrize("encoded", [True, False], ids=["encoded", "typed_raw"])
@pytest.mark.parametrize("special", SPECIAL_CHARACTERS.values(), ids=SPECIAL_CHARACTERS.keys())
def test_unreachable_database_error_never_shows_the_password(
    special, encoded, monkeypatch, capsys, caplog
):
    """``corr-pipeline query peers X`` against an unreachable server: exit 2, one line, no
    password; the exception itself (message, traceback with ``--debug``) has none either."""
    user, password, secrets = _credentials(special)
    port = h.free_tcp_port()
    url = _url(user, password, port, encoded=encoded)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    caplog.set_level(logging.DEBUG)

    assert cli.main(["query", "peers", "X"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("corr-pipeline: error: "), err
    if encoded:
        assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/pricesdb" in err, err
        assert f"{quote(user, safe=' +')}:***@127.0.0.1:{port}" in err, err
    with pytest.raises(Exception) as raised:  # --debug: the exception propagates
        cli.main(["--debug", "query", "peers", "X"])
    shown = "".join(traceback.format_exception(raised.value))
    _assert_hidden(secrets, out, err, caplog.text, shown, *capsys.readouterr())

    exc_type = db_engine.DatabaseUnavailableError if encoded or special in " %:" else ValueError
    with pytest.raises(exc_type) as direct:
        db_engine.get_engine(url)
    error = direct.value
    assert error.__cause__ is None  # the driver's exception (with its conninfo) is not chained
    assert error.__context__ is None or error.__suppress_context__
    _assert_hidden(
        secrets,
        str(error),
        repr(error),
        repr(error.args),
        "".join(traceback.format_exception(error)),
    )
    db_engine.dispose_engines()


def test_installed_command_never_shows_a_password_with_every_special_character():
    """The real ``corr-pipeline`` process, every special character at once in the user name and
    the password: ``db url`` and an unreachable ``query peers``."""
    user, password, secrets = _credentials(ALL_SPECIALS)
    port = h.free_tcp_port()
    env = h.child_env(**{settings.ENV_DATABASE_URL: _url(user, password, port)})
    command = str(Path(sys.executable).with_name("corr-pipeline"))
    url = subprocess.run(
        [command, "db", "url"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert url.returncode == 0, url.stderr
    assert url.stdout.startswith(f"postgresql+psycopg://{quote(user, safe=' +')}:***@127.0.0.1")
    query = subprocess.run(
        [command, "query", "peers", "X"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert query.returncode == 2 and query.stderr.count("\n") == 1, query.stderr
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/pricesdb" in query.stderr
    _assert_hidden(secrets, url.stdout, url.stderr, query.stdout, query.stderr)


@pytest.fixture
def fast_database_retries(monkeypatch):
    """The database assets' RetryPolicy with a 0.1 s base delay instead of 15 s (test only)."""
    fast = dg.RetryPolicy(
        max_retries=DATABASE_RETRY_POLICY.max_retries, delay=0.1, backoff=dg.Backoff.EXPONENTIAL
    )
    for asset in snapshot_assets:
        if asset.op.retry_policy == DATABASE_RETRY_POLICY:
            monkeypatch.setattr(asset.op, "_retry_policy", fast)
    return fast


def test_the_database_is_deployment_configuration_never_a_resource_field():
    """No literal URL, with or without a password, can reach a job snapshot, the launchpad or a
    run config: ``PostgresResource`` has no field for it (``$CORR_PIPELINE_DATABASE_URL``)."""
    with pytest.raises(Exception, match="database_url"):
        PostgresResource(database_url="postgresql://someone@127.0.0.1/db")


def test_dagster_run_storage_never_holds_the_password(tmp_path, monkeypatch, fast_database_retries):
    """``returns_matrix`` materialized with a PostgresResource pointing at an unreachable URL
    whose user name and password hold every special character, into a real DagsterInstance in a
    temporary directory: the failure is recorded (4 attempts), and neither the password nor any
    piece of it, decoded or encoded, is in any event log entry, run record, job or execution
    plan snapshot (stored compressed, so read through the instance), or any file of the instance
    (SQLite storage, compute logs). The URL reaches the resource through
    ``$CORR_PIPELINE_DATABASE_URL``, the only way a URL reaches the pipeline."""
    user, password, secrets = _credentials(ALL_SPECIALS)
    port = h.free_tcp_port()
    url = _url(user, password, port)
    resources = h.resources(tmp_path / "store")
    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    resources["postgres"] = PostgresResource()
    (returns_matrix,) = [a for a in snapshot_assets if dg.AssetKey("returns_matrix") in a.keys]
    dagster_home = tmp_path / "dagster_home"
    instance = open_instance(dagster_home)
    try:
        result = dg.materialize(
            [returns_matrix],
            partition_key="2026-10-30",
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
        assert not result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None
        stored = [dg.serialize_value(entry) for entry in instance.all_logs(result.run_id)] + [
            dg.serialize_value(run),
            *(repr(record) for record in instance.get_run_records()),
            *(dg.serialize_value(record.dagster_run) for record in instance.get_run_records()),
            dg.serialize_value(instance.get_job_snapshot(run.job_snapshot_id)),
            dg.serialize_value(
                instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
            ),
        ]
    finally:
        instance.dispose()
    text = "\n".join(stored)
    assert text.count("STEP_UP_FOR_RETRY") >= fast_database_retries.max_retries
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/pricesdb" in text
    assert f"{quote(user, safe=' +')}:***@127.0.0.1" in text  # the error as it was stored
    _assert_hidden(secrets, text)
    files = [path for path in dagster_home.rglob("*") if path.is_file()]
    assert any(path.suffix == ".db" for path in files), files
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, (secret, path)


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------

P = "2026-10-30"


@pytest.mark.parametrize(
    "asset,partition,name",
    [
        ("a", P + "\x00", "x"),
        ("a", "\x00../../x", "x"),
        ("a\x00", P, "x"),
        ("a", P, "x\x00"),
        ("a", "\uff0e\uff0e", "x"),  # fullwidth dots
        ("a", "2026\u201110\u201130", "x"),  # non-ASCII hyphens
        ("\u0430", P, "x"),  # Cyrillic a
        ("a", "C:\\x", "x"),
        ("a", "~root", "x"),
        ("a", P, "x" * 201),
    ],
)
def test_store_rejects_nul_and_lookalike_keys(tmp_path, asset, partition, name):
    base = tmp_path / "store"
    store = MatrixStore(base)
    source = store.save("ok", P, "src", np.zeros(2))
    for call in (
        lambda: store.save(asset, partition, name, np.zeros(2)),
        lambda: store.load(asset, partition, name),
        lambda: store.allocate(asset, partition, name, (2,), np.float32),
        lambda: store.writer.link(source, asset, partition, name),
        lambda: store.manifests.delete(asset, partition, name),
        lambda: store.save_bundle(asset, partition, MatrixBundle({name: np.zeros(1)})),
    ):
        with pytest.raises(InvalidStoreKeyError):
            call()
    assert sorted(p.name for p in base.iterdir()) == ["ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_partition_keys_and_asset_names_from_dagster_cannot_leave_the_store(tmp_path):
    """Dagster accepts any dynamic partition key and asset-key elements such as ``..``; the
    matrix-store IO manager refuses every one that is not a plain name, before touching the
    disk, and an asset-key prefix never becomes part of the path."""
    store_dir = tmp_path / "store"
    keys = dg.DynamicPartitionsDefinition(name="keys")

    @dg.asset(partitions_def=keys, io_manager_key="matrices")
    def victim() -> MatrixBundle:
        return MatrixBundle({"x": np.arange(3.0)})

    @dg.asset(key=dg.AssetKey([".."]), io_manager_key="matrices")
    def dotdot() -> MatrixBundle:
        return MatrixBundle({"x": np.arange(3.0)})

    @dg.asset(key=dg.AssetKey(["..", "..", "prefixed"]), io_manager_key="matrices")
    def prefixed() -> MatrixBundle:
        return MatrixBundle({"x": np.arange(3.0)})

    instance = dg.DagsterInstance.ephemeral()
    use_store(store_dir)
    resources = {"matrices": MatrixStoreIOManager()}
    for key in ("../../escape", "/abs/path", "a\x00b", "..", "ok/../../x", " 2026-10-30"):
        instance.add_dynamic_partitions("keys", [key])
        result = dg.materialize(
            [victim],
            partition_key=key,
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
        assert not result.success, key
        assert "InvalidStoreKeyError" in h.all_event_text(result), key
    result = dg.materialize([dotdot], resources=resources, raise_on_error=False)
    assert not result.success
    assert "invalid asset name '..'" in h.all_event_text(result)
    assert dg.materialize([prefixed], resources=resources).success

    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    files = sorted(str(p.relative_to(store_dir)) for p in store_dir.rglob("*") if p.is_file())
    assert files and all(f.startswith("prefixed/_unpartitioned/") for f in files), files


def test_project_entry_points_refuse_path_like_partition_keys(tmp_path):
    use_store(tmp_path / "store")
    for key in ("../../etc", "/etc/passwd", "2026-10-30/../x", "2026-10-30\x00"):
        with pytest.raises(ValueError):
            materialize_snapshot(key)
        with pytest.raises(ValueError):
            snapshot_date(key)
        with pytest.raises((ValueError, q.QueryError)):
            q.corr_from_store(MatrixStore(tmp_path / "store"), "A", "B", key)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.npy"))


# --------------------------------------------------------------------------------------------
# Where the embedded PostgreSQL listens
# --------------------------------------------------------------------------------------------


def test_embedded_server_listens_only_on_its_unix_socket(engine, database_url):
    socket_dir = make_url(database_url).query.get("host")
    if not socket_dir or not Path(str(socket_dir)).is_dir():
        pytest.skip("the suite runs against an external server ($CORR_PIPELINE_TEST_DATABASE_URL)")
    with engine.connect() as conn:
        listen = conn.execute(sa.text("SHOW listen_addresses")).scalar_one()
        directories = conn.execute(sa.text("SHOW unix_socket_directories")).scalar_one()
        port = int(conn.execute(sa.text("SHOW port")).scalar_one())
        data_directory = Path(conn.execute(sa.text("SHOW data_directory")).scalar_one())
        server_addr = conn.execute(sa.text("SELECT inet_server_addr()")).scalar_one()
    assert listen == "", f"listen_addresses = {listen!r}: the server accepts TCP connections"
    assert [Path(d.strip()) for d in directories.split(",")] == [Path(str(socket_dir))]
    assert server_addr is None  # this very connection came through the socket

    postmaster_pid = int((data_directory / "postmaster.pid").read_text().splitlines()[0])
    postmaster = psutil.Process(postmaster_pid)
    inet = [c for c in postmaster.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert inet == [], f"the postmaster listens on {inet}"
    unix = [c.laddr for c in postmaster.net_connections(kind="unix")]
    assert str(Path(str(socket_dir)) / f".s.PGSQL.{port}") in unix, unix
    ours = {postmaster.pid, *(child.pid for child in postmaster.children(recursive=True))}
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(2)
                probe.connect((host, port))
        except OSError:  # refused (or no IPv6 here)
            continue
        # something accepts: fine only if it is another server of the machine (a system
        # PostgreSQL on 5432, say), not ours
        listeners = {
            c.pid
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        }
        assert listeners and not listeners & ours, f"our server accepts TCP on {host}:{port}"
    # the socket (trust authentication) sits in a directory other local users cannot enter
    mode = stat.S_IMODE(os.stat(str(socket_dir)).st_mode)
    assert mode & 0o007 == 0, f"socket directory {socket_dir} has mode {oct(mode)}"
