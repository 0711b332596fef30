"""``corr-pipeline db status|upgrade`` and the refusal of a database whose schema is not the
code's: the query and import commands (real subprocesses), the demo, and a snapshot run."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from corr_pipeline import cli, settings
from corr_pipeline.cli.demo import DemoContext, demo_step_database
from corr_pipeline.db import migrate
from corr_pipeline.db.migrate import SchemaVersionError
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import PostgresResource
from corr_pipeline_tests.fixtures.commands import run_cli
from corr_pipeline_tests.reliability import helpers as h

HEAD = migrate.head_revision()
UPGRADE = f"run {migrate.UPGRADE_COMMAND}"


def _env(url: str) -> dict[str, str]:
    return {**os.environ, settings.ENV_DATABASE_URL: url}


class InProcess:
    """``corr-pipeline ARGS`` run in this process (``cli.main``) against ``url``: the same
    code as the installed command, without a Python start-up per call (the refusals themselves
    are checked through real subprocesses)."""

    def __init__(
        self, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ):
        self.url, self.monkeypatch, self.capsys = url, monkeypatch, capsys

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.capsys.readouterr()
        with self.monkeypatch.context() as mp:
            mp.setenv(settings.ENV_DATABASE_URL, self.url)
            code = cli.main(list(args))
        out = self.capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def _error_line(result) -> str:  # type: ignore[no-untyped-def]
    """The one line a refused command prints (exit status 2, no traceback)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "embedded PostgreSQL" not in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _set_revision(url: str, revision: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = :r"),
                         {"r": revision})  # fmt: skip
    finally:
        engine.dispose()


def _prices_count(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM prices")).scalar_one())
    finally:
        engine.dispose()


def test_older_schema_is_refused_until_db_upgrade(
    new_database: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = new_database()
    corr_pipeline = InProcess(url, monkeypatch, capsys)
    engine = sa.create_engine(url)
    try:
        migrate.upgrade(engine, "0002")
    finally:
        engine.dispose()
    env = _env(url)
    expected = f"corr-pipeline: error: database schema is at 0002, the code needs {HEAD}: {UPGRADE}"

    assert _error_line(run_cli("query", "peers", "AAA", env=env)) == expected
    csv = tmp_path / "prices.csv"
    csv.write_text("symbol,trade_date,close\nAAA,2024-01-02,1\n")
    assert _error_line(run_cli("prices", "import", str(csv), env=env)) == expected
    assert _prices_count(url) == 0  # nothing loaded, the schema untouched

    status = run_cli("db", "status", env=env)
    assert status.returncode == 1, status.stderr
    assert "schema revision: 0002\n" in status.stdout
    assert f"code revision:   {HEAD}\n" in status.stdout
    assert "pending:         8 migration(s)\n  0003  " in status.stdout
    assert f"status:          database schema is at 0002, the code needs {HEAD}" in status.stdout

    upgraded = corr_pipeline("db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert (
        f"revision {HEAD} (upgraded from 0002 to {HEAD}: applied 0003, 0004, 0005, 0006, 0007, "
        "0008, 0009, 0010)" in upgraded.stdout
    )
    status = corr_pipeline("db", "status")
    assert status.returncode == 0 and "status:          up to date" in status.stdout
    again = corr_pipeline("db", "init")  # = upgrade, idempotent
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert corr_pipeline("prices", "import", str(csv)).returncode == 0
    assert _prices_count(url) == 1


def test_newer_schema_is_refused(
    new_database: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = new_database()
    corr_pipeline = InProcess(url, monkeypatch, capsys)
    engine = sa.create_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    _set_revision(url, "0099")
    env = _env(url)
    expected = (
        f"corr-pipeline: error: database schema is at 0099, newer than this code (which needs "
        f"{HEAD}): run the corr_pipeline version that upgraded it (pip install --upgrade "
        "corr_pipeline), or restore the backup taken before"
    )
    assert _error_line(run_cli("query", "snapshots", env=env)) == expected
    assert _error_line(corr_pipeline("db", "upgrade")) == expected
    status = corr_pipeline("db", "status")
    assert status.returncode == 1
    assert "schema revision: 0099 (unknown to this code: written by a newer version)" in (
        status.stdout
    )


def test_fresh_database_query_refused_db_init_creates(
    new_database: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A query never creates the schema: on a fresh database it says to run db init."""
    url = new_database()
    corr_pipeline = InProcess(url, monkeypatch, capsys)
    env = _env(url)
    assert _error_line(run_cli("query", "snapshots", env=env)) == (
        f"corr-pipeline: error: the database has no corr_pipeline schema, the code needs "
        f"{HEAD}: run corr-pipeline db init"
    )
    status = corr_pipeline("db", "status")
    assert status.returncode == 1 and "schema revision: none (no corr_pipeline tables" in (
        status.stdout
    )
    created = corr_pipeline("db", "init")
    assert created.returncode == 0, created.stderr
    assert "schema ready at" in created.stdout and "created: applied 0001, 0002, 0003" in (
        created.stdout
    )
    answered = corr_pipeline("query", "snapshots")
    assert answered.returncode == 0 and "no snapshot has been published yet" in answered.stdout


def test_demo_and_pipeline_refuse_an_older_schema(
    new_database: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's database step, the Dagster resource, and a whole snapshot run: refused with
    the one line, the run not retried and nothing materialized."""
    url = new_database()
    engine = sa.create_engine(url)
    try:
        migrate.upgrade(engine, "0003")
        day = dt.date(2026, 10, 30)
        with engine.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO prices VALUES (:s, :d, :c)"),
                [
                    {"s": s, "d": d, "c": c}
                    for s, d, c in h.factor_prices(["A", "B", "C"], h.weekdays(day, 45), seed=1)
                ],
            )
    finally:
        engine.dispose()
    message = f"database schema is at 0003, the code needs {HEAD}: {UPGRADE}"

    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    with pytest.raises(SchemaVersionError) as info:
        demo_step_database(DemoContext(echo=lambda line: None))
    assert str(info.value) == message
    with pytest.raises(SchemaVersionError, match=message):
        PostgresResource().get_engine()

    resources = h.resources(tmp_path / "store")
    resources["postgres"] = PostgresResource()
    result = dg.materialize(
        snapshot_assets,
        partition_key=day.isoformat(),
        resources=resources,
        raise_on_error=False,
    )
    assert not result.success
    assert [e.step_key for e in h.events_of(result, "STEP_FAILURE")] == ["snapshot"]
    (failure,) = h.failure_messages(result)
    assert message in failure
    assert not h.events_of(result, "STEP_UP_FOR_RETRY")
    assert not h.events_of(result, "ASSET_MATERIALIZATION")
