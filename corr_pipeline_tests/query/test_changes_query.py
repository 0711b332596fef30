"""``query changes`` (SPEC §10) against changes published into the real PostgreSQL: the market
answer, one symbol's answer (its largest moves against plain loops over the stored matrices),
the same error rules as the other queries, and the command line."""

from __future__ import annotations

import argparse
import datetime as dt
import json

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.cli.query import add_query_commands
from corr_pipeline.db.publish_changes import publish_changes
from corr_pipeline.db.published_reads import changes_to_refresh
from corr_pipeline.snapshot.changes import compute_changes, publication
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.snapshot.changes_fixtures import MIN_OVERLAP, publish_day, symbols_of

D0, D1, D2 = dt.date(2026, 11, 23), dt.date(2026, 11, 24), dt.date(2026, 11, 25)


@pytest.fixture
def published(clean_db, tmp_path):
    store = MatrixStore(tmp_path / "store")
    rng = np.random.default_rng(11)
    s0, s1 = symbols_of(rng, 30, 36), symbols_of(rng, 29, 36)
    common = sorted(set(s0) & set(s1))
    pairs0 = [(common[0], common[1], 1), (common[2], common[3], 2)]
    pairs1 = [(common[0], common[1], 3), (common[4], common[0], 1)]
    day0 = publish_day(clean_db, store, D0, s0, 1, pairs=pairs0)
    day1 = publish_day(
        clean_db, store, D1, s1, 2, pairs=pairs1, labels=(np.arange(len(s1)) % 4).astype(np.int32)
    )
    results = compute_changes(clean_db, store, D1, top_m=12)
    assert results is not None
    rows = publication(results)
    publish_changes(clean_db, rows)
    return dict(engine=clean_db, store=store, s0=s0, s1=s1, day0=day0, day1=day1, rows=rows)


def test_market_changes(published):
    engine, s0, s1, rows = published["engine"], published["s0"], published["s1"], published["rows"]
    got = q.changes(engine, limit=5)  # the latest snapshot
    assert got.snapshot.snapshot_date == D1 and got.previous_date == D0
    assert got.entered == sorted(set(s1) - set(s0)) and got.left == sorted(set(s0) - set(s1))
    assert [(m["symbol_a"], m["symbol_b"]) for m in got.moves] == [
        (r[1], r[2]) for r in rows.rows["change_pairs"][:5]
    ]
    assert got.summary["mean_abs_change"] == rows.summary["mean_abs_change"]
    symbols = rows.rows["change_symbols"]
    assert got.counts["moved_symbols"] == sum(1 for r in symbols if r[4])
    clusters = rows.rows["change_clusters"]
    assert got.counts["clusters_appeared"] == sum(1 for r in clusters if r[6] == "appeared")
    assert got.counts["clusters_split"] == sum(1 for r in clusters if r[7])
    assert got.counts["lead_lag_lag_changed"] == 1  # common[0] -> common[1]: lag 1 -> 3
    assert got.counts["lead_lag_appeared"] == 1 and got.counts["lead_lag_vanished"] == 1
    data = got.to_json()
    assert data["query"] == "changes" and data["previous_date"] == D0.isoformat()
    assert len(data["largest_moves"]) == 5 and data["drift"]["skipped"] == {}
    text = q.to_text(got)
    assert f"since {D0}" in text and "largest correlation moves:" in text
    # the columns are labelled by their dates, never "today"
    assert "today" not in text
    headers = [line.split() for line in text.splitlines() if line.lstrip().startswith("rank")]
    assert headers == [["rank", "symbol", "a", "symbol", "b", str(D0), str(D1), "change"]]
    symbol_text = q.to_text(q.symbol_changes(engine, s1[0], D1, store=published["store"]))
    assert "today" not in symbol_text and f"{D0}" in symbol_text
    assert len(q.changes(engine, D1, limit=None).moves) == 12


def test_symbol_changes_against_plain_loops(published):
    engine, s0, s1 = published["engine"], published["s0"], published["s1"]
    day0, day1 = published["day0"], published["day1"]
    common = sorted(set(s0) & set(s1))
    symbol = common[0]
    got = q.symbol_changes(engine, symbol, D1, limit=6, store=published["store"])
    assert got.status == "kept" and got.moves_source == "matrices"
    i, j = s1.index(symbol), s0.index(symbol)
    expected = []
    for other in common:
        if other == symbol:
            continue
        a, b = s1.index(other), s0.index(other)
        ct, cp = float(day1["corr"][i, a]), float(day0["corr"][j, b])
        ok = np.isfinite(ct) and np.isfinite(cp)
        ok = ok and day1["overlap"][i, a] >= MIN_OVERLAP and day0["overlap"][j, b] >= MIN_OVERLAP
        if ok:
            expected.append((-abs(ct - cp), other, ct - cp))
    expected.sort()
    assert [(m["other"], m["change"]) for m in got.moves] == [(o, d) for _, o, d in expected[:6]]
    today = [s1[x] for x in day1["index"][i] if x >= 0]
    before = [s0[x] for x in day0["index"][j] if x >= 0]
    assert got.new_neighbors == [s for s in today if s not in before]
    assert got.dropped_neighbors == [s for s in before if s not in today]
    assert got.cluster_id == day1["labels"][i] and got.previous_cluster_id == day0["labels"][j]
    assert {(r["change"], r["leader"], r["lagger"]) for r in got.lead_lag} == {
        ("lag_changed", common[0], common[1]),
        ("appeared", common[4], common[0]),
    }
    assert q.to_text(got).startswith(f"changes of {symbol} in snapshot {D1}")
    assert got.to_json()["largest_moves"][0]["other"] == expected[0][1]


def test_entered_left_and_pruned_matrices(published):
    engine, s0, s1, store = (published[k] for k in ("engine", "s0", "s1", "store"))
    entered, left = sorted(set(s1) - set(s0))[0], sorted(set(s0) - set(s1))[0]
    got = q.symbol_changes(engine, entered, store=store)
    assert got.status == "entered" and got.moves == [] and "entered the universe" in q.to_text(got)
    got = q.symbol_changes(engine, left, store=store)  # not in today's snapshot, but it left
    assert got.status == "left" and got.previous_cluster_id is not None
    # retention removed D0's matrices: the symbol's rows among the market's top moves
    store.collector.remove_partition(D0.isoformat(), reason="retention: test")
    top = published["rows"].rows["change_pairs"][0]
    got = q.symbol_changes(engine, top[1], store=store)
    assert got.moves_source == "top_moves" and got.moves[0]["other"] == top[2]
    assert "among the market's top moves only" in q.to_text(got)


def test_errors_follow_the_other_queries(published, clean_db):
    engine = published["engine"]
    first = q.changes(engine, D0)  # the first published snapshot: an answer, not an error
    assert first.previous_date is None and first.to_json()["previous_date"] is None
    assert "no snapshot before it is published" in q.to_text(first)
    first_symbol = q.symbol_changes(engine, published["s0"][0], D0)
    assert first_symbol.status == "first" and "nothing to compare" in q.to_text(first_symbol)
    with pytest.raises(q.UnknownSymbolError):
        q.symbol_changes(engine, "NOPE", D0)
    with pytest.raises(q.SnapshotNotFoundError, match="no snapshot for 2026-11-20"):
        q.changes(engine, "2026-11-20")
    with pytest.raises(q.UnknownSymbolError, match="unknown symbol") as info:
        q.symbol_changes(engine, published["s1"][0] + "X", D1)
    assert published["s1"][0] in str(info.value)
    with pytest.raises(q.QueryError, match='--date "yesterday": expected a date'):
        q.changes(engine, "yesterday")
    publish_day(engine, None, D2, published["s1"], 3)  # published, changes not computed
    with pytest.raises(q.ChangesNotRecordedError, match="materialize snapshot_changes"):
        q.changes(engine)


def _run(engine, argv, capsys):
    parser = argparse.ArgumentParser(prog="corr-pipeline")
    add_query_commands(parser.add_subparsers(dest="command"), engine_factory=lambda: engine)
    args = parser.parse_args(argv)
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli(published, capsys):
    engine = published["engine"]
    code, out, err = _run(engine, ["query", "changes"], capsys)
    assert code == 0 and err == "" and out.startswith(f"changes in snapshot {D1}")
    code, out, _ = _run(engine, ["query", "changes", "--json", "--date", str(D1)], capsys)
    assert code == 0 and json.loads(out)["previous_date"] == D0.isoformat()
    symbol = published["rows"].rows["change_pairs"][0][1]
    code, out, _ = _run(engine, ["query", "changes", symbol, "--json"], capsys)
    assert code == 0 and json.loads(out)["symbol"] == symbol
    code, out, err = _run(engine, ["query", "changes", "--date", str(D0), "--json"], capsys)
    assert code == 0 and json.loads(out)["previous_date"] is None
    publish_day(engine, None, D2, published["s1"], 3)  # published, changes not computed
    code, out, err = _run(engine, ["query", "changes", "--json"], capsys)
    assert code == 2 and json.loads(out)["error"]["type"] == "changes_not_recorded"
    assert err.startswith("corr-pipeline query: the changes of 2026-11-25")
    code, out, err = _run(engine, ["query", "changes", "NOPE", "--date", str(D1)], capsys)
    assert code == 2 and out == "" and 'unknown symbol "NOPE"' in err


def test_changes_go_stale_when_a_compared_snapshot_is_republished(published, capsys):
    """The change set records the publications it compared (snapshots.created_at of both days):
    re-publishing either date, or publishing a session between them, makes `query changes` say
    STALE (text and JSON) until snapshot_changes runs again, which clears it."""
    engine, store, s0, s1 = (
        published["engine"],
        published["store"],
        published["s0"],
        published["s1"],
    )
    got = q.changes(engine, D1)
    assert got.stale == [] and got.to_json()["stale"] == []
    assert got.summary["snapshot_published_at"] is not None
    assert got.summary["previous_published_at"] is not None
    assert "STALE" not in q.to_text(got)
    assert changes_to_refresh(engine, D0) is None and changes_to_refresh(engine, D1) is None

    publish_day(engine, store, D0, s0, 5)  # the previous session re-published
    assert changes_to_refresh(engine, D0) == D1  # what snapshot_changes of D0 recomputes
    got = q.changes(engine, D1)
    assert len(got.stale) == 1 and f"the snapshot of {D0} was re-published" in got.stale[0]
    text = q.to_text(got)
    assert "STALE: the snapshot of" in text and f"materialize snapshot_changes for {D1}" in text
    symbol = sorted(set(s0) & set(s1))[0]
    assert q.symbol_changes(engine, symbol, D1, store=store).stale == got.stale
    assert "STALE" in q.to_text(q.symbol_changes(engine, symbol, D1, store=store))

    publish_day(engine, store, D1, s1, 6)  # and today's: two reasons
    assert [r.split(" was ")[0] for r in q.changes(engine, D1).stale] == [
        f"the snapshot of {D1}",
        f"the snapshot of {D0}",
    ]

    publish_changes(engine, publication(compute_changes(engine, store, D1, top_m=12)))
    assert q.changes(engine, D1).stale == []  # recomputed: current again

    publish_day(engine, None, dt.date(2026, 11, 20), s0, 7)  # an earlier date: no effect
    assert q.changes(engine, D1).stale == []
    publish_day(engine, store, D2, s1, 8)
    publish_changes(engine, publication(compute_changes(engine, store, D2, top_m=12)))
    publish_day(engine, store, D1, s1, 9)  # D1 re-published: D2's changes compared the old D1
    stale_d2 = q.changes(engine, D2).stale
    assert len(stale_d2) == 1 and f"the snapshot of {D1} was re-published" in stale_d2[0]
    assert json.loads(json.dumps(q.changes(engine, D2).to_json()))["stale"] == stale_d2
    with engine.begin() as conn:  # D1 gone: D2's previous session is D0 now
        conn.execute(sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": D1})
    assert q.changes(engine, D2).stale == [f"the previous session is now {D0}, not {D1}"]
