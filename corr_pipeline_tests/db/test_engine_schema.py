"""Engine, embedded server and schema: real PostgreSQL, no mocks."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from corr_pipeline import settings
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db import migrate, schema

# ---------------------------------------------------------------------------------------------
# URL handling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgres://u:p%40ss@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        ("postgresql://u@h/db?password=hunter2&x=1", "postgresql://u@h/db?password=***&x=1"),
        # not parsable by SQLAlchemy (it may be a libpq "key=value" string with a password):
        # not shown at all
        ("not a url at all, password=x", "<a database URL that cannot be parsed>"),
        # SQLAlchemy's rendering: an empty password is a password, query values are encoded
        ("postgresql+psycopg://u:@/db?host=/tmp", "postgresql+psycopg://u:***@/db?host=%2Ftmp"),
        ("postgresql://u%40x:p%3A%2F%25%20w@h/db", "postgresql://u%40x:***@h/db"),
        ("postgresql://h/db?sslpassword=k3y&user=u", "postgresql://h/db?sslpassword=***&user=u"),
        ("postgresql://u:p@ss@h/db", "<a database URL that cannot be parsed>"),
        ("postgresql://u/x:pass@h/db", "<a database URL that cannot be parsed>"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    if url.startswith("postgresql://u:pw"):
        url = db_engine.normalize_url(url)
    assert db_engine.redact_url(url) == expected


def test_normalize_url_uses_psycopg3_and_rejects_other_backends() -> None:
    assert db_engine.normalize_url("postgresql://u:p@h/db").startswith("postgresql+psycopg://")
    assert db_engine.normalize_url("postgres://h/db").startswith("postgresql+psycopg://")
    kept = "postgresql+psycopg://u@h/db"
    assert db_engine.normalize_url(kept) == kept
    with pytest.raises(ValueError, match="needs PostgreSQL") as info:
        db_engine.normalize_url("mysql://root:topsecret@h/db")
    assert "topsecret" not in str(info.value)


def test_env_url_is_used_and_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.ENV_DATABASE_URL, " postgresql://u:p@db.example:6543/prices ")
    assert db_engine.database_url() == "postgresql+psycopg://u:p@db.example:6543/prices"


def test_settings_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(settings.ENV_HOME, str(tmp_path / "h"))
    assert settings.corr_pipeline_home() == (tmp_path / "h").resolve()
    assert settings.pgdata_dir() == (tmp_path / "h" / "pgdata").resolve()
    assert settings.store_dir() == (tmp_path / "h" / "store").resolve()
    monkeypatch.setenv(settings.ENV_STORE_DIR, str(tmp_path / "s"))
    assert settings.store_dir() == (tmp_path / "s").resolve()
    monkeypatch.delenv(settings.ENV_HOME)
    monkeypatch.chdir(tmp_path)
    assert settings.corr_pipeline_home() == (tmp_path / ".corr_pipeline").resolve()
    assert settings.corr_pipeline_home().is_absolute()


# ---------------------------------------------------------------------------------------------
# Connection failures never leak credentials
# ---------------------------------------------------------------------------------------------


def test_unreachable_server_error_is_clear_and_redacted() -> None:
    secret = "s3cr3t-Pa55word"
    url = f"postgresql://alice:{secret}@127.0.0.1:1/pricesdb?connect_timeout=3"
    with pytest.raises(db_engine.DatabaseUnavailableError) as info:
        db_engine.get_engine(url)
    message = str(info.value)
    assert secret not in message
    assert "127.0.0.1:1/pricesdb" in message
    assert "alice:***@" in message
    assert "Fix:" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_server_rejection_error_is_redacted(database_url: str) -> None:
    """A real server-side refusal (unknown database) with a password in the URL."""
    secret = "An0ther-secret"
    url = make_url(database_url).set(password=secret, database="no_such_database_xyz")
    with pytest.raises(db_engine.DatabaseUnavailableError) as info:
        db_engine.get_engine(url.render_as_string(hide_password=False))
    message = str(info.value)
    assert secret not in message
    assert "no_such_database_xyz" in message


def test_get_engine_is_cached_per_url(database_url: str) -> None:
    first = db_engine.get_engine(database_url)
    assert db_engine.get_engine(database_url) is first
    with first.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------


def _columns(conn: sa.Connection, table: str) -> dict[str, str]:
    """Column -> type of ``table`` (``schema.table``, or a table of the current schema)."""
    namespace, _, name = table.rpartition(".")
    rows = conn.execute(
        sa.text(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = coalesce(CAST(:s AS text), current_schema()) "
            "AND table_name = :t"
        ),
        {"s": namespace or None, "t": name},
    )
    return {name: dtype for name, dtype in rows}


def _primary_key(conn: sa.Connection, table: str) -> list[str]:
    rows = conn.execute(
        sa.text(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = CAST(:t AS regclass) AND i.indisprimary "
            "ORDER BY array_position(i.indkey, a.attnum)"
        ),
        {"t": table},
    )
    return [r[0] for r in rows]


def test_init_schema_is_idempotent_and_matches_spec(engine: sa.Engine) -> None:
    schema.init_schema(engine)  # = corr-pipeline db init: upgrade to the newest revision
    schema.init_schema(engine)  # a second (third) run changes nothing and does not fail
    assert migrate.schema_status(engine).up_to_date
    with engine.connect() as conn:
        assert _columns(conn, "prices") == {
            "symbol": "text",
            "trade_date": "date",
            "close": "double precision",
        }
        assert _primary_key(conn, "prices") == ["symbol", "trade_date"]
        indexes = {ix["name"]: ix["column_names"] for ix in sa.inspect(conn).get_indexes("prices")}
        assert indexes["ix_prices_trade_date"] == ["trade_date"]

        assert set(_columns(conn, "snapshots")) == {
            "snapshot_date",
            "as_of_trade_date",
            "n_symbols",
            "n_dropped",
            "lookback_days",
            "params",
            "created_at",
            "matrix_versions",
        }
        assert _columns(conn, "snapshots")["params"] == "jsonb"
        assert _columns(conn, "snapshots")["matrix_versions"] == "jsonb"  # SPEC §8 pins
        assert _columns(conn, "snapshots")["created_at"] == "timestamp with time zone"
        assert _columns(conn, "snapshots")["matrix_versions"] == "jsonb"
        assert _primary_key(conn, "snapshots") == ["snapshot_date"]

        expected = {
            "peer_neighbors": (
                {"snapshot_date", "symbol", "rank", "neighbor", "corr", "overlap"},
                ["snapshot_date", "symbol", "rank"],
            ),
            "symbol_clusters": (
                {"snapshot_date", "symbol", "cluster_id"},
                ["snapshot_date", "symbol"],
            ),
            "lead_lag_pairs": (
                {
                    "snapshot_date",
                    "leader",
                    "lagger",
                    "lag",
                    "lagged_corr",
                    "sync_corr",
                    "improvement",
                    "overlap",
                    "p_value",
                    "q_value",
                    "reverse_lag",
                    "reverse_lagged_corr",
                    "reverse_q_value",
                },
                ["snapshot_date", "leader", "lagger"],
            ),
            "synthetic.lead_lag_truth": ({"leader", "lagger", "lag", "seed"}, ["leader", "lagger"]),
        }
        for table, (columns, key) in expected.items():
            assert set(_columns(conn, table)) == columns, table
            assert _primary_key(conn, table) == key, table
        # the synthetic ground truth is not among the production tables
        assert _columns(conn, "synthetic_lead_lag_truth") == {}
        significance = _columns(conn, "lead_lag_pairs")
        assert (significance["p_value"], significance["q_value"]) == ("double precision",) * 2
        # the reverse direction (SPEC §6 "Direction"): smallint, real like lagged_corr, double
        assert (
            significance["reverse_lag"],
            significance["reverse_lagged_corr"],
            significance["reverse_q_value"],
        ) == ("smallint", "real", "double precision")


def test_snapshot_children_cascade_and_created_at_default(clean_db: sa.Engine) -> None:
    day = dt.date(2024, 3, 1)
    with clean_db.begin() as conn:
        conn.execute(
            schema.snapshots.insert().values(
                snapshot_date=day,
                as_of_trade_date=day,
                n_symbols=2,
                n_dropped=0,
                lookback_days=60,
                params={"k": 2},
            )
        )
        conn.execute(
            schema.peer_neighbors.insert().values(
                snapshot_date=day, symbol="A", rank=1, neighbor="B", corr=0.5, overlap=60
            )
        )
        conn.execute(
            schema.symbol_clusters.insert().values(snapshot_date=day, symbol="A", cluster_id=0)
        )
        conn.execute(
            schema.lead_lag_pairs.insert().values(
                snapshot_date=day,
                leader="A",
                lagger="B",
                lag=1,
                lagged_corr=0.4,
                sync_corr=float("nan"),
                improvement=0.4,
                overlap=59,
            )
        )
    with clean_db.connect() as conn:
        created_at, params = conn.execute(
            sa.select(schema.snapshots.c.created_at, schema.snapshots.c.params)
        ).one()
        assert created_at.tzinfo is not None
        assert params == {"k": 2}
    with clean_db.begin() as conn:
        conn.execute(schema.snapshots.delete().where(schema.snapshots.c.snapshot_date == day))
    with clean_db.connect() as conn:
        for table in (schema.peer_neighbors, schema.symbol_clusters, schema.lead_lag_pairs):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_child_row_without_snapshot_is_rejected(clean_db: sa.Engine) -> None:
    with pytest.raises(sa.exc.IntegrityError), clean_db.begin() as conn:
        conn.execute(
            schema.symbol_clusters.insert().values(
                snapshot_date=dt.date(2024, 1, 2), symbol="A", cluster_id=0
            )
        )


def test_clean_db_empties_tables(clean_db: sa.Engine) -> None:
    with clean_db.begin() as conn:
        conn.execute(
            schema.prices.insert().values(symbol="X", trade_date=dt.date(2024, 1, 2), close=1.0)
        )
    schema.truncate_all(clean_db)
    with clean_db.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.prices)).scalar() == 0


# ---------------------------------------------------------------------------------------------
# Embedded server shared by several processes
# ---------------------------------------------------------------------------------------------

_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import sqlalchemy as sa
    from corr_pipeline.db.engine import get_engine, embedded_server
    engine = get_engine()
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT pg_postmaster_start_time()::text, current_setting('data_directory'), "
            "current_setting('listen_addresses'), current_database()"
        )).one()
    print(json.dumps({"start": row[0], "datadir": row[1], "listen": row[2], "db": row[3],
                      "server_pid": embedded_server().pid}), flush=True)
    release = Path(sys.argv[1])  # hold the server until the test creates this file
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


def test_embedded_server_is_shared_by_concurrent_processes(
    tmp_path: Path, pg_parent_dir: Path
) -> None:
    home = pg_parent_dir / "home"
    env = {k: v for k, v in os.environ.items() if k != settings.ENV_DATABASE_URL}
    env[settings.ENV_HOME] = str(home)
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)

    release = tmp_path / "release"
    first = subprocess.Popen(
        [sys.executable, str(script), str(release)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None
        first_info = json.loads(first.stdout.readline())
        # The first process now holds the running server; a second one must attach to it.
        second = subprocess.run(
            [sys.executable, str(script), str(script)],  # an existing file: exit at once
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        second_info = json.loads(second.stdout.splitlines()[-1])
        release.touch()
        assert first.wait(timeout=120) == 0
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()

    assert second_info["server_pid"] == first_info["server_pid"]
    assert second_info["start"] == first_info["start"]
    assert Path(first_info["datadir"]) == (home / "pgdata").resolve()
    assert first_info["listen"] == ""  # Unix socket only, no TCP
    assert first_info["db"] == db_engine.EMBEDDED_DATABASE
    # The last process to exit stopped the server.
    deadline = time.monotonic() + 30
    while (home / "pgdata" / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (home / "pgdata" / "postmaster.pid").exists()


def test_symbols_sort_in_code_point_order(clean_db: sa.Engine) -> None:
    """Symbol columns are COLLATE "C": ORDER BY symbol is code-point order (SPEC §2)."""
    symbols = ["b", "B", "a", "Z", "\u00e9", "_x", "BRK.B", "BRK-A", "10X"]
    with clean_db.begin() as conn:
        conn.execute(
            schema.prices.insert(),
            [{"symbol": s, "trade_date": dt.date(2024, 1, 2), "close": 1.0} for s in symbols],
        )
    with clean_db.connect() as conn:
        ordered = conn.execute(
            sa.select(schema.prices.c.symbol).order_by(schema.prices.c.symbol)
        ).scalars()
        assert list(ordered) == sorted(symbols)
