"""What the migration tests share: the head revision, two dates and the symbols of the rows
they write, a database opened by URL, and small readers and writers of the published tables."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from corr_pipeline.db import migrate

HEAD = migrate.head_revision()
D1, D2 = dt.date(2024, 5, 2), dt.date(2024, 5, 3)
SYMBOLS = ["AAA", "Caf\u00e9", "Cafe\u0301", "O'REILLY", "日本株", "back\\slash", "z"]


@contextmanager
def opened(url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def table_columns(conn: sa.Connection, table: str) -> dict[str, tuple[str, str]]:
    """The columns of ``table``: name -> (data type, is nullable)."""
    return {
        name: (kind, nullable)
        for name, kind, nullable in conn.execute(
            sa.text(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_name = :table"
            ),
            {"table": table},
        )
    }


def pairs_text(conn: sa.Connection, pair_columns: str) -> list[str]:
    """Every lead_lag_pairs row's ``pair_columns`` as PostgreSQL's text of a row, in order."""
    return list(
        conn.execute(
            sa.text(
                f"SELECT CAST(ROW(snapshot_date, {pair_columns}) AS text) FROM lead_lag_pairs "
                "ORDER BY snapshot_date, leader, lagger"
            )
        ).scalars()
    )


def insert_d1_snapshot(conn: sa.Connection, params: str = "{}") -> None:
    """A snapshot of ``SYMBOLS`` on ``D1`` (lookback 40, one cluster), ``params`` its JSON."""
    conn.execute(
        sa.text(
            "INSERT INTO snapshots (snapshot_date, as_of_trade_date, n_symbols, "
            "n_dropped, lookback_days, params) VALUES (:d, :d, 7, 0, 40, CAST(:params AS jsonb))"
        ),
        {"d": D1, "params": params},
    )
    conn.execute(
        sa.text("INSERT INTO symbol_clusters VALUES (:d, :s, 0)"),
        [{"d": D1, "s": s} for s in SYMBOLS],
    )
