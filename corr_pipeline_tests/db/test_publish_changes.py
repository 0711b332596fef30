"""Publication of the changes (SPEC §10): the rows read back equal what was published, a
re-publication replaces the date atomically, invalid input writes nothing, and the date's
advisory lock is the snapshot's."""

from __future__ import annotations

import datetime as dt
import math
import threading
import time

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db.bulk import driver_connection
from corr_pipeline.db.publish import PublishError, lock_date
from corr_pipeline.db.publish_changes import (
    CHANGE_COLUMNS,
    ChangesPublication,
    publish_changes,
    read_change_counts,
)
from corr_pipeline.db.published_reads import recorded_change_dates
from corr_pipeline.db.schema import CHANGE_TABLES
from corr_pipeline.snapshot.changes import compute_changes, publication
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.snapshot.changes_fixtures import publish_day, symbols_of

D0, D1 = dt.date(2026, 11, 23), dt.date(2026, 11, 24)


def _changes(engine: sa.Engine, store: MatrixStore, seed: int) -> ChangesPublication:
    rng = np.random.default_rng(seed)
    s0, s1 = symbols_of(rng, 25, 30), symbols_of(rng, 24, 30)
    publish_day(engine, store, D0, s0, seed, pairs=[(s0[0], s0[1], 1), (s0[2], s0[3], 2)])
    publish_day(
        engine, store, D1, s1, seed + 1, labels=(np.arange(len(s1)) % 4).astype(np.int32),
        pairs=[(s1[0], s1[1], 2), (s1[5], s1[6], 1)],
    )  # fmt: skip
    results = compute_changes(engine, store, D1, top_m=10)
    assert results is not None
    return publication(results)


def _read_back(engine: sa.Engine, table: str, d: dt.date) -> list[tuple]:
    names = ", ".join(CHANGE_COLUMNS[table])
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(f"SELECT {names} FROM {table} WHERE snapshot_date = :d ORDER BY 1, 2"),
                {"d": d},
            )
        ]


def _same(a: tuple, b: tuple) -> bool:
    return all(
        (x == y) or (isinstance(x, float) and math.isclose(x, y, rel_tol=1e-7))
        for x, y in zip(a, b, strict=True)
    )


def test_rows_read_back_equal_the_publication(clean_db, tmp_path):
    changes = _changes(clean_db, MatrixStore(tmp_path / "store"), 1)
    report = publish_changes(clean_db, changes)
    assert not report.replaced_previous
    counts = read_change_counts(clean_db, D1)
    assert counts == {"change_summaries": 1} | {t: len(r) for t, r in changes.rows.items()}
    assert counts["change_pairs"] == 10 and counts["change_symbols"] > 25
    for table in CHANGE_COLUMNS:
        expected = sorted(changes.rows[table], key=lambda r: (r[0], r[1]))
        got = _read_back(clean_db, table, D1)
        assert len(got) == len(expected) and all(map(_same, got, expected)), table
    with clean_db.connect() as conn:
        row = (
            conn.execute(
                sa.text("SELECT * FROM change_summaries WHERE snapshot_date = :d"), {"d": D1}
            )
            .one()
            ._mapping
        )
    assert row["previous_date"] == D0 and row["skipped"] == {}
    assert row["mean_abs_change"] == changes.summary["mean_abs_change"]
    assert row["quantiles"] == changes.summary["quantiles"]
    # float32 values go into the real columns unchanged
    with clean_db.connect() as conn:
        corr = conn.execute(
            sa.text("SELECT corr FROM change_pairs WHERE snapshot_date = :d ORDER BY rank"),
            {"d": D1},
        ).scalars()
        assert [np.float32(c) for c in corr] == [
            np.float32(r[3]) for r in changes.rows["change_pairs"]
        ]
    assert recorded_change_dates(clean_db) == [D1]


def test_republication_replaces_the_date_atomically(clean_db, tmp_path):
    first = _changes(clean_db, MatrixStore(tmp_path / "a"), 1)
    publish_changes(clean_db, first)
    second = _changes(clean_db, MatrixStore(tmp_path / "b"), 7)
    report = publish_changes(clean_db, second)
    assert report.replaced_previous
    assert read_change_counts(clean_db, D1) == {"change_summaries": 1} | {
        t: len(r) for t, r in second.rows.items()
    }
    got = _read_back(clean_db, "change_symbols", D1)
    assert sorted(r[0] for r in got) == sorted(r[0] for r in second.rows["change_symbols"])


def test_invalid_changes_write_nothing(clean_db, tmp_path):
    good = _changes(clean_db, MatrixStore(tmp_path / "store"), 1)
    publish_changes(clean_db, good)
    before = read_change_counts(clean_db, D1)
    rows_before = {table: _read_back(clean_db, table, D1) for table in CHANGE_COLUMNS}
    bad_pairs = [(*good.rows["change_pairs"][0][:7], float("nan"))]
    row = good.rows["change_pairs"][0]
    bad_corr = [(*row[:3], float("-inf"), *row[4:])]  # a float4 column
    for bad in (
        ChangesPublication(D1, good.summary, {**good.rows, "change_pairs": bad_pairs}),
        ChangesPublication(D1, good.summary, {**good.rows, "change_pairs": bad_corr}),
        ChangesPublication(D1, {**good.summary, "mean_change": float("inf")}, good.rows),
        ChangesPublication(D1, {**good.summary, "previous_date": D1}, good.rows),
        ChangesPublication(D1, {**good.summary, "quantiles": {"x": float("nan")}}, good.rows),
        *(
            ChangesPublication(D1, {**good.summary, "sessions_between": bad_count}, good.rows)
            for bad_count in (-1, 2.0, "3", True)
        ),
    ):
        with pytest.raises(PublishError):
            publish_changes(clean_db, bad)
    # a database error in the middle (a duplicate key in the last COPY) rolls everything back
    twice = [("A", "B", "appeared", 1, None, 0.5, None)] * 2
    duplicate = {**good.rows, "change_lead_lag": twice}
    with pytest.raises(Exception, match="duplicate key"):
        publish_changes(clean_db, ChangesPublication(D1, good.summary, duplicate))
    assert read_change_counts(clean_db, D1) == before
    assert {table: _read_back(clean_db, table, D1) for table in CHANGE_COLUMNS} == rows_before


def test_publication_waits_for_the_snapshot_lock_of_its_date(clean_db, tmp_path):
    changes = _changes(clean_db, MatrixStore(tmp_path / "store"), 1)
    done = threading.Event()
    with clean_db.begin() as conn, driver_connection(conn).cursor() as cur:
        lock_date(cur, D1)  # what publish_snapshot of D1 holds
        worker = threading.Thread(target=lambda: (publish_changes(clean_db, changes), done.set()))
        worker.start()
        time.sleep(1.0)
        assert not done.is_set()  # blocked behind the snapshot's lock
    worker.join(30)
    assert done.is_set() and read_change_counts(clean_db, D1)["change_summaries"] == 1
    assert set(CHANGE_TABLES) == {"change_summaries", *CHANGE_COLUMNS}


def test_change_tables_reference_their_summary(clean_db, tmp_path):
    publish_changes(clean_db, _changes(clean_db, MatrixStore(tmp_path / "store"), 1))
    with pytest.raises(sa.exc.IntegrityError, match="change_summaries"), clean_db.begin() as c:
        c.execute(
            sa.text("INSERT INTO change_symbols VALUES (:d, 'A', 'kept', 0, 0, false, 1, 0)"),
            {"d": D0},
        )
    with clean_db.begin() as conn:
        conn.execute(sa.text("DELETE FROM change_summaries WHERE snapshot_date = :d"), {"d": D1})
    assert set(read_change_counts(clean_db, D1).values()) == {0}
