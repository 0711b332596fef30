"""The child tables reference ``snapshots`` through triggers (migration 0002), which replaced the
foreign keys: same guarantees, checked per statement instead of per row. The upgrade of a
database that still has the foreign keys is in test_migrations.py."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from corr_pipeline.db import schema
from corr_pipeline.db.publish import delete_snapshot
from corr_pipeline_tests.fixtures.published import publish_reference, table_counts

D1, D2, MISSING = dt.date(2024, 5, 1), dt.date(2024, 5, 2), dt.date(2024, 5, 3)


def _snapshot(conn: sa.Connection, day: dt.date) -> None:
    conn.execute(
        schema.snapshots.insert().values(
            snapshot_date=day, as_of_trade_date=day, n_symbols=2, n_dropped=0, lookback_days=5
        )
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
    assert table_counts(clean_db, D1) == [1, 0, 0, 0]


def test_updates_cannot_break_the_reference(clean_db: sa.Engine) -> None:
    publish_reference(clean_db, D1)
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
    publish_reference(clean_db, D1)
    publish_reference(clean_db, D2)
    publish_reference(clean_db, D1, n=20)  # replace
    assert table_counts(clean_db, D1) == [1, 60, 20, 20]
    assert delete_snapshot(clean_db, D1) is True
    assert delete_snapshot(clean_db, D1) is False
    assert table_counts(clean_db, D1) == [0, 0, 0, 0] and table_counts(clean_db, D2) == [
        1,
        90,
        30,
        30,
    ]
    with clean_db.begin() as conn:  # a plain DELETE of the snapshots row cascades
        conn.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D2})
    assert table_counts(clean_db, D2) == [0, 0, 0, 0] and _orphans(clean_db) == 0


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
    assert table_counts(clean_db, D1) == [0, 0, 0, 0] and _orphans(clean_db) == 0
