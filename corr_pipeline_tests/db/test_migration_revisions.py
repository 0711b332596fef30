"""Each revision after the first keeps the published rows through its upgrade and its
downgrade (``corr_pipeline/db/migrations``), one test a revision."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db import migrate
from corr_pipeline.db.published_reads import published_rows
from corr_pipeline_tests.db.migration_rows import (
    D1,
    D2,
    insert_d1_snapshot,
    opened,
    pairs_text,
    table_columns,
)
from corr_pipeline_tests.fixtures.published import publish_reference as publish


def test_revision_0006_records_publications_and_keeps_the_change_sets(
    new_database: Callable[[], str],
) -> None:
    """0005 -> 0006 adds change_summaries.snapshot_published_at / previous_published_at, NULL
    for the change sets recorded before (their staleness cannot be checked); 0006 -> 0005 drops
    them and keeps every row."""
    columns = ("snapshot_published_at", "previous_published_at")

    def present(conn: sa.Connection) -> set[str]:
        return set(table_columns(conn, "change_summaries"))

    with opened(new_database()) as db:
        migrate.upgrade(db, "0005")
        with db.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO change_summaries (snapshot_date, previous_date, n_symbols, "
                    "n_previous_symbols, n_common, n_entered, n_left) "
                    "VALUES (:d, :p, 3, 3, 3, 0, 0)"
                ),
                {"d": D2, "p": D1},
            )
            assert not present(conn) & set(columns)
        assert [rev.id for rev in migrate.upgrade(db, "0006").applied] == ["0006"]
        with db.connect() as conn:
            assert set(columns) <= present(conn)
            row = conn.execute(sa.text(f"SELECT {', '.join(columns)} FROM change_summaries")).one()
            assert tuple(row) == (None, None)
        assert [rev.id for rev in migrate.downgrade(db, "0005").applied] == ["0006"]
        with db.connect() as conn:
            assert not present(conn) & set(columns)
            assert conn.execute(sa.text("SELECT count(*) FROM change_summaries")).scalar_one() == 1


def test_revision_0007_adds_the_significance_and_keeps_the_pairs(
    new_database: Callable[[], str],
) -> None:
    """0006 -> 0007 adds lead_lag_pairs.p_value / q_value (double precision, NULL for the pairs
    published before: their significance was never computed), which the pipeline's reader
    returns as NaN; a publication fills them; 0007 -> 0006 drops them and keeps every row. The
    upgrade also passes on a database that already has one of them."""
    columns = ("p_value", "q_value")
    pair_columns = "leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap"

    with opened(new_database()) as db:
        migrate.upgrade(db, "0006")
        with db.begin() as conn:
            insert_d1_snapshot(conn)
            conn.execute(
                sa.text(
                    f"INSERT INTO lead_lag_pairs (snapshot_date, {pair_columns}) "
                    "VALUES (:d, :a, :b, :l, 0.625, :sync, 0.5, 39)"
                ),
                [
                    {"d": D1, "a": "AAA", "b": "日本株", "l": 1, "sync": None},
                    {"d": D1, "a": "Caf\u00e9", "b": "z", "l": 2, "sync": float("nan")},
                    {"d": D1, "a": "z", "b": "AAA", "l": 3, "sync": -0.125},
                ],
            )
            before = pairs_text(conn, pair_columns)
            assert not set(table_columns(conn, "lead_lag_pairs")) & set(columns)
        assert [rev.id for rev in migrate.upgrade(db, "0007").applied] == ["0007"]
        with db.connect() as conn:
            found = table_columns(conn, "lead_lag_pairs")
            assert {c: found[c] for c in columns} == {
                c: ("double precision", "YES") for c in columns
            }
            assert pairs_text(conn, pair_columns) == before
            nulls = conn.execute(
                sa.text(
                    "SELECT count(*) FROM lead_lag_pairs WHERE p_value IS NULL AND q_value IS NULL"
                )
            ).scalar_one()
            assert nulls == 3

        migrate.upgrade(db)  # the code's reader and publication need the newest revision
        old = published_rows(db, D1)
        assert old is not None and old.lead_lag_pairs.size == 3
        assert np.isnan(old.lead_lag_pairs["p_value"]).all()
        assert np.isnan(old.lead_lag_pairs["q_value"]).all()

        publish(db, D2, n=10)
        with db.connect() as conn:
            counts = conn.execute(
                sa.text(
                    "SELECT count(*), count(p_value), count(q_value) FROM lead_lag_pairs "
                    "WHERE snapshot_date = :d"
                ),
                {"d": D2},
            ).one()
        assert tuple(counts) == (10, 10, 10)

        assert [rev.id for rev in migrate.downgrade(db, "0006").applied] == [
            "0010",
            "0009",
            "0008",
            "0007",
        ]
        with db.connect() as conn:
            assert not set(table_columns(conn, "lead_lag_pairs")) & set(columns)
            assert pairs_text(conn, pair_columns)[:3] == before
            assert conn.execute(sa.text("SELECT count(*) FROM lead_lag_pairs")).scalar_one() == 13
        with db.begin() as conn:  # a development database that already has one of them
            conn.execute(sa.text("ALTER TABLE lead_lag_pairs ADD COLUMN p_value double precision"))
        assert [rev.id for rev in migrate.upgrade(db, "0007").applied] == ["0007"]
        with db.connect() as conn:
            assert set(columns) <= set(table_columns(conn, "lead_lag_pairs"))


def test_revision_0008_adds_the_reverse_direction_and_keeps_the_pairs(
    new_database: Callable[[], str],
) -> None:
    """0007 -> 0008 adds lead_lag_pairs.reverse_lag (smallint), reverse_lagged_corr (real) and
    reverse_q_value (double precision), NULL for the pairs published before (their reverse
    direction was never recorded), which the pipeline's reader returns as 0 and NaN; a
    publication (on the newest schema, which the code writes) fills them; going back to 0007
    drops them and keeps every row, significance included. The upgrade also passes on a
    database that already has one of them."""
    columns = {
        "reverse_lag": ("smallint", "YES"),
        "reverse_lagged_corr": ("real", "YES"),
        "reverse_q_value": ("double precision", "YES"),
    }
    pair_columns = (
        "leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap, p_value, q_value"
    )

    with opened(new_database()) as db:
        migrate.upgrade(db, "0007")
        with db.begin() as conn:
            insert_d1_snapshot(conn, '{"max_q_value": 0.05}')
            conn.execute(
                sa.text(
                    f"INSERT INTO lead_lag_pairs (snapshot_date, {pair_columns}) "
                    "VALUES (:d, :a, :b, :l, 0.625, :sync, 0.5, 39, :p, :q)"
                ),
                [
                    {
                        "d": D1,
                        "a": "AAA",
                        "b": "日本株",
                        "l": 1,
                        "sync": None,
                        "p": 1e-9,
                        "q": 1e-7,
                    },
                    {
                        "d": D1,
                        "a": "Caf\u00e9",
                        "b": "z",
                        "l": 2,
                        "sync": 0.25,
                        "p": None,
                        "q": None,
                    },
                    {"d": D1, "a": "z", "b": "AAA", "l": 3, "sync": -0.125, "p": 0.5, "q": 1.0},
                ],
            )
            before = pairs_text(conn, pair_columns)
            assert not set(table_columns(conn, "lead_lag_pairs")) & set(columns)
        assert [rev.id for rev in migrate.upgrade(db, "0008").applied] == ["0008"]
        with db.connect() as conn:
            found = table_columns(conn, "lead_lag_pairs")
            assert {c: found[c] for c in columns} == columns
            assert pairs_text(conn, pair_columns) == before
            nulls = conn.execute(
                sa.text(
                    "SELECT count(*) FROM lead_lag_pairs WHERE reverse_lag IS NULL "
                    "AND reverse_lagged_corr IS NULL AND reverse_q_value IS NULL"
                )
            ).scalar_one()
            assert nulls == 3

        old = published_rows(db, D1)
        assert old is not None and old.lead_lag_pairs.size == 3
        assert (old.lead_lag_pairs["reverse_lag"] == 0).all()
        assert np.isnan(old.lead_lag_pairs["reverse_lagged_corr"]).all()
        assert np.isnan(old.lead_lag_pairs["reverse_q_value"]).all()

        later = migrate.upgrade(db).applied  # the code publishes to the newest schema
        publish(db, D2, n=10)
        with db.connect() as conn:
            counts = conn.execute(
                sa.text(
                    "SELECT count(*), count(reverse_lag), count(reverse_lagged_corr), "
                    "count(reverse_q_value) FROM lead_lag_pairs WHERE snapshot_date = :d"
                ),
                {"d": D2},
            ).one()
        assert tuple(counts) == (10, 10, 10, 10)

        applied = [rev.id for rev in migrate.downgrade(db, "0007").applied]
        assert applied == [rev.id for rev in reversed(later)] + ["0008"]
        with db.connect() as conn:
            assert not set(table_columns(conn, "lead_lag_pairs")) & set(columns)
            assert pairs_text(conn, pair_columns)[:3] == before
            assert conn.execute(sa.text("SELECT count(*) FROM lead_lag_pairs")).scalar_one() == 13
        with db.begin() as conn:  # a development database that already has one of them
            conn.execute(sa.text("ALTER TABLE lead_lag_pairs ADD COLUMN reverse_lag smallint"))
        assert [rev.id for rev in migrate.upgrade(db, "0008").applied] == ["0008"]
        with db.connect() as conn:
            found = table_columns(conn, "lead_lag_pairs")
            assert {c: found[c] for c in columns} == columns


def test_revision_0009_records_the_sessions_between_and_keeps_the_change_sets(
    new_database: Callable[[], str],
) -> None:
    """0008 -> 0009 adds change_summaries.sessions_between (integer, >= 0), NULL for the change
    sets recorded before (their gap was never counted); 0009 -> 0008 drops it and keeps every
    row. The upgrade also passes on a database that already has it."""
    row_columns = "snapshot_date, previous_date, n_symbols, n_common, skipped"

    def rows(conn: sa.Connection) -> list[str]:
        return list(
            conn.execute(
                sa.text(
                    f"SELECT CAST(ROW({row_columns}) AS text) FROM change_summaries "
                    "ORDER BY snapshot_date"
                )
            ).scalars()
        )

    def insert(conn: sa.Connection, day: dt.date, between: int | None = None) -> None:
        extra = ("", "") if between is None else (", sessions_between", ", :n")
        conn.execute(
            sa.text(
                "INSERT INTO change_summaries (snapshot_date, previous_date, n_symbols, "
                f"n_previous_symbols, n_common, n_entered, n_left{extra[0]}) "
                f"VALUES (:d, :p, 3, 3, 3, 0, 0{extra[1]})"
            ),
            {"d": day, "p": D1, "n": between},
        )

    with opened(new_database()) as db:
        migrate.upgrade(db, "0008")
        with db.begin() as conn:
            insert(conn, D2)
            before = rows(conn)
            assert "sessions_between" not in table_columns(conn, "change_summaries")
        assert [rev.id for rev in migrate.upgrade(db, "0009").applied] == ["0009"]
        with db.begin() as conn:
            found = table_columns(conn, "change_summaries")
            assert found["sessions_between"] == ("integer", "YES")
            assert rows(conn) == before
            assert (
                conn.execute(sa.text("SELECT sessions_between FROM change_summaries")).scalar_one()
                is None
            )
            insert(conn, dt.date(2024, 5, 10), between=4)
        with pytest.raises(sa.exc.IntegrityError, match="sessions_between"), db.begin() as conn:
            insert(conn, dt.date(2024, 5, 13), between=-1)

        assert [rev.id for rev in migrate.downgrade(db, "0008").applied] == ["0009"]
        with db.connect() as conn:
            assert "sessions_between" not in table_columns(conn, "change_summaries")
            assert rows(conn)[:1] == before
            assert conn.execute(sa.text("SELECT count(*) FROM change_summaries")).scalar_one() == 2
        with db.begin() as conn:  # a development database that already has it
            conn.execute(
                sa.text("ALTER TABLE change_summaries ADD COLUMN sessions_between integer")
            )
        assert [rev.id for rev in migrate.upgrade(db, "0009").applied] == ["0009"]
        with db.connect() as conn:
            assert table_columns(conn, "change_summaries")["sessions_between"] == (
                "integer",
                "YES",
            )


@pytest.mark.parametrize(
    "name", ['fk "quoted"; DROP TABLE prices; --', "fk :colon %s %(x)s", "FK_Mixed_Case"]
)
def test_revision_0002_drops_foreign_keys_whatever_their_names(
    new_database: Callable[[], str], name: str
) -> None:
    """0002 replaces the first release's foreign keys by triggers; a key renamed by hand (quotes,
    a colon, percent signs, capitals) is dropped as well, its name never pasted into SQL."""
    with opened(new_database()) as db:
        migrate.upgrade(db, "0001")
        quoted = '"' + name.replace('"', '""') + '"'
        with db.begin() as conn:
            old = conn.execute(
                sa.text(
                    "SELECT conname FROM pg_constraint WHERE contype = 'f' "
                    "AND conrelid = 'peer_neighbors'::regclass"
                )
            ).scalar_one()
            rename = f'ALTER TABLE peer_neighbors RENAME CONSTRAINT "{old}" TO {quoted}'
            conn.exec_driver_sql(rename.replace("%", "%%"))  # psycopg's placeholders
        migrate.upgrade(db, "0002")
        with db.connect() as conn:
            left = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_constraint WHERE contype = 'f' "
                    "AND confrelid = 'snapshots'::regclass"
                )
            ).scalar_one()
            assert left == 0
            assert conn.execute(sa.text("SELECT to_regclass('prices')")).scalar_one() is not None


def test_revision_0010_adds_suspect_prices_referencing_snapshots(
    new_database: Callable[[], str],
) -> None:
    """0009 -> 0010 creates suspect_prices (the figures in range, a row only for a published
    snapshot, deleted with it); the snapshots published before keep every row and have none;
    0010 -> 0009 drops the table and keeps the snapshots."""

    def insert_snapshot(conn: sa.Connection, day: dt.date) -> None:
        conn.execute(
            sa.text(
                "INSERT INTO snapshots (snapshot_date, as_of_trade_date, n_symbols, n_dropped, "
                "lookback_days) VALUES (:d, :d, 3, 0, 40)"
            ),
            {"d": day},
        )

    def insert_suspect(conn: sa.Connection, day: dt.date, share: float, largest: float) -> None:
        conn.execute(
            sa.text(
                "INSERT INTO suspect_prices VALUES (:d, 'STALE', :share, :largest, 'why', false)"
            ),
            {"d": day, "share": share, "largest": largest},
        )

    with opened(new_database()) as db:
        migrate.upgrade(db, "0009")
        with db.begin() as conn:
            insert_snapshot(conn, D1)
        assert [rev.id for rev in migrate.upgrade(db, "0010").applied] == ["0010"]
        with db.begin() as conn:
            assert set(table_columns(conn, "suspect_prices")) == {
                "snapshot_date",
                "symbol",
                "zero_return_share",
                "max_abs_return",
                "reason",
                "dropped",
            }
            assert conn.execute(sa.text("SELECT count(*) FROM suspect_prices")).scalar_one() == 0
            insert_suspect(conn, D1, 0.3, 0.1)
        for share, largest, says in ((1.5, 0.1, "zero_return_share"), (0.1, -1.0, "max_abs")):
            with pytest.raises(sa.exc.IntegrityError, match=says), db.begin() as conn:
                insert_suspect(conn, D1, share, largest)
        with pytest.raises(sa.exc.IntegrityError, match="foreign key"), db.begin() as conn:
            insert_suspect(conn, D2, 0.3, 0.1)  # no snapshot of D2
        with db.begin() as conn:
            conn.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D1})
            assert conn.execute(sa.text("SELECT count(*) FROM suspect_prices")).scalar_one() == 0
            insert_snapshot(conn, D1)
            insert_suspect(conn, D1, 0.3, 0.1)
        assert [rev.id for rev in migrate.downgrade(db, "0009").applied] == ["0010"]
        with db.connect() as conn:
            assert table_columns(conn, "suspect_prices") == {}
            assert conn.execute(sa.text("SELECT count(*) FROM snapshots")).scalar_one() == 1
