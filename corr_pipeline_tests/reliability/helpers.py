"""Shared helpers of the reliability tests: small price universes, snapshot runs, row dumps."""

from __future__ import annotations

import csv
import datetime as dt
import os
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.schema import PUBLISHED_TABLES, prices
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline_tests.fixtures.deployment import resources_at
from corr_pipeline_tests.fixtures.pipeline import FORTY_DAYS
from corr_pipeline_tests.reliability._payloads import (  # noqa: F401 (re-exported)
    expected_counts,
    publish_arguments,
    with_application_name,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Small but complete parameter set (every stage runs, each in well under a second).
PARAMS: dict[str, Any] = FORTY_DAYS
_ORDER = {
    "snapshots": "snapshot_date",
    "peer_neighbors": "symbol, rank",
    "symbol_clusters": "symbol",
    "lead_lag_pairs": "leader, lagger",
}


def weekdays(end: dt.date, n: int) -> list[dt.date]:
    """The ``n`` weekdays ending at ``end`` (inclusive), ascending."""
    out: list[dt.date] = []
    day = end
    while len(out) < n:
        if day.weekday() < 5:
            out.append(day)
        day -= dt.timedelta(days=1)
    return out[::-1]


def factor_prices(
    symbols: Sequence[str],
    dates: Sequence[dt.date],
    *,
    seed: int,
    lead_lag: tuple[str, str] | None = None,
) -> list[tuple[str, dt.date, float]]:
    """Prices of a two-factor universe (symbols alternate between the factors); with
    ``lead_lag=(a, b)`` the returns of ``b`` follow those of ``a`` one day later."""
    rng = np.random.default_rng(seed)
    t, n = len(dates) - 1, len(symbols)
    factors = rng.standard_normal((t, 2)) * 0.01
    returns = factors[:, np.arange(n) % 2] + 0.008 * rng.standard_normal((t, n))
    if lead_lag is not None:
        a, b = (list(symbols).index(s) for s in lead_lag)
        returns[1:, b] = returns[:-1, a] + 0.002 * rng.standard_normal(t - 1)
    closes = 100.0 * np.exp(np.vstack([np.zeros((1, n)), np.cumsum(returns, axis=0)]))
    return [
        (symbol, day, float(closes[t_, j]))
        for j, symbol in enumerate(symbols)
        for t_, day in enumerate(dates)
    ]


def insert_prices(engine: sa.Engine, rows: Iterable[tuple[str, dt.date, float]]) -> None:
    data = [{"symbol": s, "trade_date": d, "close": c} for s, d, c in rows]
    if data:
        with engine.begin() as conn:
            conn.execute(prices.insert(), data)


def write_prices_csv(path: Path, rows: Iterable[tuple[str, dt.date, float]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["symbol", "trade_date", "close"])
        for symbol, day, close in rows:
            writer.writerow([symbol, day.isoformat(), repr(close)])
    return path


def resources(store_dir: Path, **overrides: Any) -> dict[str, Any]:
    res = resources_at(store_dir)
    res["snapshot_params"] = SnapshotParams(**{**PARAMS, **overrides})
    return res


def materialize(
    store_dir: Path, partition_key: str, *, instance: dg.DagsterInstance | None = None, **overrides
) -> dg.ExecuteInProcessResult:
    """The whole snapshot graph in-process for one partition (what ``dg.materialize`` tests
    and the UI's "Materialize" do), never raising."""
    return dg.materialize(
        snapshot_assets,
        partition_key=partition_key,
        resources=resources(store_dir, **overrides),
        instance=instance,
        raise_on_error=False,
    )


def events_of(result: Any, kind: str) -> list[Any]:
    return [e for e in result.all_events if e.event_type_value == kind]


def failure_messages(result: Any) -> list[str]:
    """Error message (with its cause chain) of every failed step."""
    out = []
    for event in events_of(result, "STEP_FAILURE"):
        error = event.event_specific_data.error
        text = []
        while error is not None:
            text.append(error.message)
            error = error.cause
        out.append("\n".join(text))
    return out


def all_event_text(result: Any) -> str:
    """Every event of a run rendered as text: messages, step errors with stack traces,
    metadata values."""
    return "\n".join(f"{e.message}\n{e.event_specific_data!r}" for e in result.all_events)


def snapshot_rows(engine: sa.Engine, day: dt.date | str) -> dict[str, list[tuple]]:
    """Every published row of ``day`` (ordered), ``snapshots.created_at``, the recorded
    ``dagster_run_id`` and ``snapshots.matrix_versions`` (store version ids, new on every run)
    left out so that two runs producing the same snapshot compare equal."""
    out: dict[str, list[tuple]] = {}
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        for table in PUBLISHED_TABLES:
            rows = conn.execute(
                sa.text(f"SELECT * FROM {table} WHERE snapshot_date = :d ORDER BY {_ORDER[table]}"),
                {"d": day},
            ).mappings()
            cleaned = []
            for row in rows:
                row = dict(row)
                row.pop("created_at", None)
                row.pop("matrix_versions", None)
                if "params" in row:
                    row["params"] = {
                        k: v for k, v in row["params"].items() if k != "dagster_run_id"
                    }
                cleaned.append(tuple(sorted(row.items(), key=lambda kv: kv[0])))
            out[table] = cleaned
    return out


def snapshot_counts(engine: sa.Engine, day: dt.date | str) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: conn.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE snapshot_date = :d"), {"d": day}
            ).scalar_one()
            for table in PUBLISHED_TABLES
        }


def child_env(**extra: str) -> dict[str, str]:
    """Environment of a child Python process: ours (database URL, homes) plus the repository
    on ``PYTHONPATH`` so ``corr_pipeline_tests`` is importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH", "")])]
    )
    env.update(extra)
    return env


def python_module_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def free_tcp_port() -> int:
    """A loopback TCP port nobody listens on (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TcpToUnixProxy:
    """A loopback TCP port forwarding every connection to a Unix socket (the embedded
    PostgreSQL), started and stopped at will: "the database comes back" without touching the
    session's server."""

    def __init__(self, port: int, unix_socket: Path) -> None:
        self.port = port
        self.unix_socket = str(unix_socket)
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.unix_socket)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass
            self._sockets.clear()


def backends_of(engine: sa.Engine, application_name: str) -> list[dict[str, Any]]:
    """The server backends of ``application_name``: pid, state, whether they hold a
    transaction id (wrote something in an open transaction), current query."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pid, state, backend_xid IS NOT NULL AS has_xid, query "
                "FROM pg_stat_activity WHERE application_name = :a"
            ),
            {"a": application_name},
        ).mappings()
        return [dict(r) for r in rows]
