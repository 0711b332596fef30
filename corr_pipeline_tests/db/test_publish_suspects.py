"""A snapshot's suspect prices (SPEC §2) are published in the snapshot's transaction: written
with it, replaced with it, withdrawn with it; a value the table refuses fails before anything
is written."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corr_pipeline.compute.suspect import SuspectSymbol
from corr_pipeline.db.publish import PublishError, delete_snapshot, read_snapshot_counts
from corr_pipeline_tests.fixtures.published import D, make_results, publish, snapshot_row

STALE = SuspectSymbol("STALE", 0.3, 0.02, "stale closes: ...", False)
JUMP = SuspectSymbol("JUMP", 0.0, 1.0986, "price error: ...", True)


def _suspects(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                sa.text(
                    "SELECT symbol, zero_return_share, max_abs_return, reason, dropped "
                    "FROM suspect_prices WHERE snapshot_date = :d ORDER BY symbol"
                ),
                {"d": D},
            )
        ]


def test_suspects_are_published_replaced_and_withdrawn_with_the_snapshot(clean_db):
    report = publish(clean_db, make_results(n=20, k=3, seed=1), suspects=[STALE, JUMP])
    assert report.rows["suspect_prices"] == 2
    assert _suspects(clean_db) == [
        ("JUMP", 0.0, 1.0986, "price error: ...", True),
        ("STALE", 0.3, 0.02, "stale closes: ...", False),
    ]
    assert read_snapshot_counts(clean_db, D)["suspect_prices"] == 2
    publish(clean_db, make_results(n=20, k=3, seed=2), suspects=[STALE])
    assert [row[0] for row in _suspects(clean_db)] == ["STALE"]
    publish(clean_db, make_results(n=20, k=3, seed=2))
    assert _suspects(clean_db) == []
    publish(clean_db, make_results(n=20, k=3, seed=2), suspects=[JUMP])
    assert delete_snapshot(clean_db, D)
    assert _suspects(clean_db) == []


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (SuspectSymbol("X", 1.5, 0.1, "r", False), "zero_return_share 1.5 is not in [0, 1]"),
        (SuspectSymbol("X", 0.5, float("nan"), "r", False), "max_abs_return nan is not finite"),
        (SuspectSymbol("X", 0.5, 0.1, "", False), "no reason given"),
    ],
)
def test_a_suspect_the_table_refuses_fails_before_anything_is_written(clean_db, bad, says):
    publish(clean_db, make_results(n=20, k=3, seed=1), suspects=[STALE])
    before = snapshot_row(clean_db)
    with pytest.raises(PublishError, match=says.replace("[", r"\[").replace("]", r"\]")):
        publish(clean_db, make_results(n=20, k=3, seed=2), suspects=[bad])
    with pytest.raises(PublishError, match="twice"):
        publish(clean_db, make_results(n=20, k=3, seed=2), suspects=[STALE, STALE])
    assert snapshot_row(clean_db) == before
    assert [row[0] for row in _suspects(clean_db)] == ["STALE"]
