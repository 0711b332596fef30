"""The child tables reference ``snapshots`` through triggers (migration 0002), which replaced the
foreign keys: same guarantees, checked per statement instead of per row. The upgrade of a
database that still has the foreign keys is in test_migrations.py."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db import schema
from corr_pipeline.db.publish import delete_snapshot, publish_snapshot
from corr_pipeline.snapshot.results import SnapshotResults

D1, D2, MISSING = dt.date(2024, 5, 1), dt.date(2024, 5, 2), dt.date(2024, 5, 3)


def _snapshot(conn: sa.Connection, day: dt.date) -> None:
    conn.execute(
        schema.snapshots.insert().values(
            snapshot_date=day, as_of_trade_date=day, n_symbols=2, n_dropped=0, lookback_days=5
        )
    )


def _publish(engine: sa.Engine, day: dt.date, n: int = 30, k: int = 3) -> None:
    rng = np.random.default_rng(day.toordinal())
    index = np.array([[(i + c + 1) % n for c in range(k)] for i in range(n)], dtype=np.int32)
    pairs = np.zeros(n, dtype=[(f, t) for f, t in zip(
        ("leader", "lagger", "lag", "lagged_corr", "sync_corr", "improvement", "overlap",
         "p_value", "q_value", "reverse_lag", "reverse_lagged_corr", "reverse_q_value"),
        ("i4", "i4", "i2", "f4", "f4", "f4", "i4", "f8", "f8", "i2", "f4", "f8"),
        strict=True)])  # fmt: skip
    pairs["leader"], pairs["lagger"] = np.arange(n), (np.arange(n) + 2) % n
    pairs["lag"], pairs["lagged_corr"], pairs["improvement"], pairs["overlap"] = 1, 0.5, 0.1, 40
    pairs["p_value"], pairs["q_value"] = 2.5e-6, 1e-3
    pairs["reverse_lag"], pairs["reverse_lagged_corr"], pairs["reverse_q_value"] = 2, -0.25, 0.02
    publish_snapshot(
        engine,
        SnapshotResults(
            snapshot_date=day,
            as_of_trade_date=day,
            symbols=[f"X{i}" for i in range(n)],
            n_dropped=0,
            lookback_days=50,
            params={},
            neighbor_index=index,
            neighbor_corr=rng.uniform(-1, 1, (n, k)).astype(np.float32),
            neighbor_overlap=np.full((n, k), 40, np.int16),
            cluster_labels=np.arange(n) % 4,
            lead_lag_pairs=pairs,
        ),
    )


def _orphans(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return sum(
            conn.execute(
                sa.text(
                    f"SELECT count(*) FROM {t} c WHERE NOT EXISTS "
                    "(SELECT 1 FROM snapshots s WHERE s.snapshot_date = c.snapshot_date)"
                )
            ).scalar_one()
            for t in schema.SNAPSHOT_CHILD_TABLES
        )


def _counts(engine: sa.Engine, day: dt.date) -> list[int]:
    with engine.connect() as conn:
        return [
            conn.execute(
                sa.text(f"SELECT count(*) FROM {t} WHERE snapshot_date = :d"), {"d": day}
            ).scalar_one()
            for t in ("snapshots", *schema.SNAPSHOT_CHILD_TABLES)
        ]


def test_no_foreign_keys_but_triggers(clean_db: sa.Engine) -> None:
    """The snapshot's tables reference ``snapshots`` by triggers; the only foreign keys are the
    change tables' (a few thousand rows a date) on ``change_summaries`` and the suspect prices'
    (a handful a date) on ``snapshots``."""
    with clean_db.connect() as conn:
        fks = conn.execute(
            sa.text(
                "SELECT conrelid::regclass::text, confrelid::regclass::text"
                " FROM pg_constraint WHERE contype = 'f'"
            )
        ).all()
        assert {table for table, _ in fks} <= {*schema.CHANGE_TABLES, "suspect_prices"}
        assert {referenced for table, referenced in fks if table != "suspect_prices"} <= {
            "change_summaries"
        }
        assert ("suspect_prices", "snapshots") in fks
        triggers = set(
            conn.execute(sa.text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars()
        )
    assert triggers == {"snapshots_children"} | {
        f"{table}_snapshot_ref_{event}"
        for table in schema.SNAPSHOT_CHILD_TABLES
        for event in ("insert", "update")
    }


def test_multirow_insert_with_one_missing_date_is_rejected_whole(clean_db: sa.Engine) -> None:
    with clean_db.begin() as conn:
        _snapshot(conn, D1)
    with pytest.raises(sa.exc.IntegrityError, match="snapshot reference"), clean_db.begin() as c:
        c.execute(
            schema.symbol_clusters.insert(),
            [
                {"snapshot_date": D1, "symbol": "A", "cluster_id": 0},
                {"snapshot_date": MISSING, "symbol": "B", "cluster_id": 1},
            ],
        )
    assert _counts(clean_db, D1) == [1, 0, 0, 0]


def test_updates_cannot_break_the_reference(clean_db: sa.Engine) -> None:
    _publish(clean_db, D1)
    with pytest.raises(sa.exc.IntegrityError), clean_db.begin() as conn:
        conn.execute(sa.text("UPDATE lead_lag_pairs SET snapshot_date = :m"), {"m": MISSING})
    with pytest.raises(sa.exc.IntegrityError), clean_db.begin() as conn:
        conn.execute(sa.text("UPDATE snapshots SET snapshot_date = :m"), {"m": MISSING})
    with clean_db.begin() as conn:  # an unreferenced snapshot may move
        _snapshot(conn, D2)
        conn.execute(sa.text("UPDATE snapshots SET snapshot_date = :m WHERE snapshot_date = :d"),
                     {"m": MISSING, "d": D2})  # fmt: skip
    assert _orphans(clean_db) == 0


def test_publish_replace_and_delete_leave_no_orphans(clean_db: sa.Engine) -> None:
    _publish(clean_db, D1)
    _publish(clean_db, D2)
    _publish(clean_db, D1, n=20)  # replace
    assert _counts(clean_db, D1) == [1, 60, 20, 20]
    assert delete_snapshot(clean_db, D1) is True
    assert delete_snapshot(clean_db, D1) is False
    assert _counts(clean_db, D1) == [0, 0, 0, 0] and _counts(clean_db, D2) == [1, 90, 30, 30]
    with clean_db.begin() as conn:  # a plain DELETE of the snapshots row cascades
        conn.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D2})
    assert _counts(clean_db, D2) == [0, 0, 0, 0] and _orphans(clean_db) == 0


def test_a_delete_waits_for_a_transaction_inserting_children(clean_db: sa.Engine) -> None:
    """The check locks the referenced snapshots row FOR KEY SHARE, as a foreign key does: a
    concurrent DELETE cannot slip in between the check and the commit and leave orphans."""
    with clean_db.begin() as conn:
        _snapshot(conn, D1)
    with clean_db.connect() as inserter, clean_db.connect() as deleter:
        inserter.execute(
            schema.symbol_clusters.insert().values(snapshot_date=D1, symbol="A", cluster_id=0)
        )  # transaction open, not committed
        deleter.execute(sa.text("SET lock_timeout = '300ms'"))
        with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
            deleter.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D1})
        deleter.rollback()
        inserter.commit()
        deleter.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D1})
        deleter.commit()
    assert _counts(clean_db, D1) == [0, 0, 0, 0] and _orphans(clean_db) == 0
