"""Changes across a gap in the published history (SPEC §7 "Ranges", §10): when the session before
``D`` is not published, the changes compare with the latest published earlier session, record
how many sessions of the calendar lie between the two, and say so wherever they are shown
(``query changes`` text and JSON, ``query changes SYMBOL``, the Dagster metadata and its
markdown previews); consecutive sessions record 0 and show no warning. Real PostgreSQL, a real
matrix store, the partitions' calendar."""

from __future__ import annotations

import argparse
import datetime as dt
import json

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.cli.query import add_query_commands
from corr_pipeline.defs import metadata
from corr_pipeline.defs.partitions import snapshot_calendar
from corr_pipeline.sessions import get_calendar
from corr_pipeline.snapshot import session_gap
from corr_pipeline.snapshot.changes import compute_and_publish
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.snapshot.changes_fixtures import publish_day, symbols_of

#: a backfill of 2014-07-14..18, then one of 2020-03-16..27: 2020-03-16 follows a six-year gap
OLD, AFTER_GAP, NEXT = dt.date(2014, 7, 18), dt.date(2020, 3, 16), dt.date(2020, 3, 17)


def brute_sessions_between(earlier: dt.date, later: dt.date) -> int:
    """The calendar's sessions strictly between the two dates, each day asked on its own."""
    calendar = get_calendar(snapshot_calendar.name, dt.date(2014, 1, 1), dt.date(2021, 1, 1))
    days = (earlier + dt.timedelta(days=i) for i in range(1, (later - earlier).days))
    return sum(calendar.is_session(day) for day in days)


def _query(engine: sa.Engine, argv: list[str], capsys) -> tuple[int, str]:
    """``corr-pipeline query ...`` as the command line runs it: (exit status, stdout)."""
    parser = argparse.ArgumentParser(prog="corr-pipeline")
    add_query_commands(parser.add_subparsers(dest="command"), engine_factory=lambda: engine)
    args = parser.parse_args(["query", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def _recorded(engine: sa.Engine, day: dt.date) -> tuple[dt.date, int | None]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT previous_date, sessions_between FROM change_summaries "
                "WHERE snapshot_date = :d"
            ),
            {"d": day},
        ).one()
    return row[0], row[1]


@pytest.fixture
def gap(clean_db, tmp_path):
    """OLD, AFTER_GAP and NEXT published with their matrices; the changes of AFTER_GAP and NEXT
    computed and published as snapshot_changes does (the partitions' calendar)."""
    store = MatrixStore(tmp_path / "store")
    rng = np.random.default_rng(3)
    symbols = symbols_of(rng, 30, 34)
    for seed, day in enumerate((OLD, AFTER_GAP, NEXT), start=1):
        publish_day(clean_db, store, day, symbols, seed)
    published = {
        day: compute_and_publish(clean_db, store, day, top_m=10, calendar=snapshot_calendar)
        for day in (AFTER_GAP, NEXT)
    }
    return clean_db, store, symbols, published


def test_changes_across_a_gap_record_the_sessions_between(gap):
    engine, _, _, published = gap
    expected = brute_sessions_between(OLD, AFTER_GAP)
    assert expected > 1000
    results, rows, _ = published[AFTER_GAP]
    assert (results.previous_date, results.sessions_between) == (OLD, expected)
    assert rows.summary["sessions_between"] == expected
    assert _recorded(engine, AFTER_GAP) == (OLD, expected)
    # the session after it is consecutive: overnight changes
    assert brute_sessions_between(AFTER_GAP, NEXT) == 0
    assert published[NEXT][0].sessions_between == 0
    assert _recorded(engine, NEXT) == (AFTER_GAP, 0)


def test_query_changes_say_the_changes_span_a_gap(gap, capsys):
    engine, store, symbols, _ = gap
    n = brute_sessions_between(OLD, AFTER_GAP)
    warning = (
        f"previous published session: {OLD}, {n:,} sessions between the two — NOT overnight changes"
    )
    for argv in (
        ["changes", "--date", str(AFTER_GAP)],
        ["changes", symbols[0], "--date", str(AFTER_GAP)],
    ):
        code, out = _query(engine, argv, capsys)
        assert code == 0 and out.splitlines()[1] == warning, out
        code, out = _query(engine, [*argv, "--json"], capsys)
        answer = json.loads(out)
        assert code == 0
        assert (answer["previous_date"], answer["sessions_between"]) == (OLD.isoformat(), n)

    # consecutive sessions: today's wording, no warning, 0 in the JSON
    for argv in (["changes", "--date", str(NEXT)], ["changes", symbols[0], "--date", str(NEXT)]):
        code, out = _query(engine, argv, capsys)
        assert code == 0 and f"since {AFTER_GAP}" in out.splitlines()[0], out
        assert "overnight" not in out and "previous published session" not in out, out
        code, out = _query(engine, [*argv, "--json"], capsys)
        answer = json.loads(out)
        assert (answer["previous_date"], answer["sessions_between"]) == (AFTER_GAP.isoformat(), 0)

    # a change set recorded before the gap was counted (schema revision 0009): not hidden either
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE change_summaries SET sessions_between = NULL WHERE snapshot_date = :d"),
            {"d": AFTER_GAP},
        )
    code, out = _query(engine, ["changes", "--date", str(AFTER_GAP)], capsys)
    assert out.splitlines()[1] == (
        f"previous published session: {OLD} (the sessions between the two are not recorded)"
    )
    code, out = _query(engine, ["changes", "--date", str(AFTER_GAP), "--json"], capsys)
    assert json.loads(out)["sessions_between"] is None


def test_the_metadata_of_snapshot_changes_say_the_changes_span_a_gap(gap):
    n = brute_sessions_between(OLD, AFTER_GAP)
    shown = {}
    for day, (results, rows, _) in gap[3].items():
        built = metadata.changes(results, dict(rows.summary), dict(rows.rows), StageStats())
        shown[day] = {key: value.value for key, value in built.items()}
    gap_shown, next_shown = shown[AFTER_GAP], shown[NEXT]
    assert gap_shown["previous_date"] == OLD.isoformat() and gap_shown["sessions_between"] == n
    assert gap_shown["compared_with"] == session_gap.compared_with(OLD, n)
    assert "NOT overnight changes" in gap_shown["compared_with"]
    for preview in ("largest_moves", "largest_turnover"):  # the markdown opened on its own
        first = gap_shown[preview].splitlines()[0]
        assert first.startswith("**previous published session: ") and "NOT overnight" in first
        assert "overnight" not in next_shown[preview]
    assert next_shown["sessions_between"] == 0
    assert next_shown["compared_with"] == f"previous session: {AFTER_GAP}"
    # the picture's title
    assert session_gap.title_note(n) == f" ({n:,} sessions between: NOT overnight)"
    assert session_gap.title_note(0) == ""
