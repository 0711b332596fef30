"""The snapshot_changes step (SPEC §10) against the real PostgreSQL and a matrix store: the
previous session, symbols matched by name, the parts skipped when the previous matrices were
pruned, and every number against plain loops over the published values."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db.publish import delete_snapshot
from corr_pipeline.db.publish_changes import StaleChangesError, publish_changes
from corr_pipeline.defs import metadata, pictures
from corr_pipeline.query import changes as published_changes
from corr_pipeline.query.render import to_text
from corr_pipeline.snapshot import changes as changes_step
from corr_pipeline.snapshot.changes import (
    CORRELATION_PARTS,
    compute_and_publish,
    compute_changes,
    previous_session,
    publication,
)
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.snapshot.changes_fixtures import MIN_OVERLAP, publish_day, symbols_of

D0, D1, D2 = dt.date(2026, 11, 23), dt.date(2026, 11, 24), dt.date(2026, 11, 25)


@pytest.fixture
def store(tmp_path) -> MatrixStore:
    return MatrixStore(tmp_path / "store")


def _days(engine, store):
    rng = np.random.default_rng(5)
    s0, s1 = symbols_of(rng, 30, 36), symbols_of(rng, 28, 36)
    pairs0 = [(s0[0], s0[1], 1), (s0[2], s0[3], 2), (s0[4], s0[5], 1)]
    pairs1 = [(s0[0], s0[1], 3)] if s0[0] in s1 and s0[1] in s1 else []
    a = publish_day(engine, store, D0, s0, 1, pairs=pairs0)
    b = publish_day(engine, store, D2, s1, 2, pairs=pairs1)
    return s0, a, s1, b


def test_no_previous_session_records_nothing(clean_db, store):
    publish_day(clean_db, store, D1, ["A", "B", "C"], 1)
    assert previous_session(clean_db, D1) is None
    assert compute_changes(clean_db, store, D1) is None
    with pytest.raises(LookupError, match="not published"):
        compute_changes(clean_db, store, D2)


def test_changes_against_plain_loops(clean_db, store):
    s0, a, s1, b = _days(clean_db, store)
    # D1 has matrices but no publication (published, then withdrawn): D2's previous session is D0
    publish_day(clean_db, store, D1, s0, 3)
    delete_snapshot(clean_db, D1)
    assert previous_session(clean_db, D2) == D0
    got = compute_changes(clean_db, store, D2, top_m=7, working_memory_mb=1e-4)
    assert got is not None and got.previous_date == D0 and got.skipped == {}
    common = sorted(set(s0) & set(s1))
    assert got.match.common == common
    assert [s1[i] for i in got.match.entered] == sorted(set(s1) - set(s0))
    assert [s0[i] for i in got.match.left] == sorted(set(s0) - set(s1))
    # drift and top moves: plain loops over the names
    moves = []
    for x, p in enumerate(common):
        for q in common[x + 1 :]:
            i, j, k, m = s1.index(p), s1.index(q), s0.index(p), s0.index(q)
            ct, cp = float(b["corr"][i, j]), float(a["corr"][k, m])
            if (
                np.isfinite(ct)
                and np.isfinite(cp)
                and b["overlap"][i, j] >= MIN_OVERLAP
                and a["overlap"][k, m] >= MIN_OVERLAP
            ):
                moves.append((-abs(ct - cp), p, q, ct, cp))
    moves.sort()
    assert got.correlation is not None and got.correlation.n_pairs == len(moves)
    assert got.correlation.means["abs_change"] == pytest.approx(
        np.mean([-m[0] for m in moves]), abs=1e-12
    )
    top = [
        (common[p], common[q])
        for p, q in zip(got.correlation.top_p, got.correlation.top_q, strict=True)
    ]
    assert top == [(m[1], m[2]) for m in moves[:7]]
    # neighbor turnover by name
    for x, symbol in enumerate(common):
        today = {s1[j] for j in b["index"][s1.index(symbol)] if j >= 0}
        before = {s0[j] for j in a["index"][s0.index(symbol)] if j >= 0}
        assert got.new_neighbors[x] == len(today - before), symbol
    # lead-lag: (s0[0], s0[1]) changed lag if both stayed, the others vanished
    if s0[0] in s1 and s0[1] in s1:
        assert got.lead_lag.changed_today.tolist() == [0]
    vanished = {
        (s0[got.previous.lead_lag_pairs["leader"][r]], s0[got.previous.lead_lag_pairs["lagger"][r]])
        for r in got.lead_lag.vanished
    }
    expected = {(s0[2], s0[3]), (s0[4], s0[5])}
    assert vanished == {pq for pq in expected if set(pq) <= set(common)}


def test_pruned_previous_matrices_skip_only_the_correlation_parts(clean_db, store):
    _days(clean_db, store)
    store.collector.remove_partition(D0.isoformat(), reason="retention: test")
    got = compute_changes(clean_db, store, D2)
    assert got is not None and got.correlation is None
    assert set(got.skipped) == set(CORRELATION_PARTS)
    assert all("removed by retention" in reason for reason in got.skipped.values())
    assert got.n_neighbors.size == len(got.match.common)  # the rest is computed
    assert not (store.base_dir / "correlation_matrix" / D0.isoformat()).exists()


def test_a_date_published_again_during_the_scan_is_scanned_again(clean_db, store, monkeypatch):
    """The matrices are scanned by the heads read first while the rest of the rows is read; a
    date published again in between (here right after its head was read) is scanned again at
    the versions its rows pin: the result is the one of a run after the re-publication."""
    import corr_pipeline.snapshot.changes as module

    _, _, s1, _ = _days(clean_db, store)
    read_head = module.published_head
    republished = []

    def head_then_republish(engine, day):
        head = read_head(engine, day)
        if day == D2 and not republished:
            republished.append(publish_day(engine, store, D2, s1, 9))
        return head

    monkeypatch.setattr(module, "published_head", head_then_republish)
    said: list[str] = []
    got = compute_changes(clean_db, store, D2, top_m=5, log=said.append)
    monkeypatch.setattr(module, "published_head", read_head)
    again = compute_changes(clean_db, store, D2, top_m=5)
    assert republished and any("published again" in line for line in said)
    assert got is not None and again is not None
    assert got.today.published_at == again.today.published_at
    assert got.correlation is not None and again.correlation is not None
    assert got.correlation.means == again.correlation.means
    for name, values in again.correlation.quantiles.items():
        np.testing.assert_array_equal(got.correlation.quantiles[name], values)
    np.testing.assert_array_equal(got.correlation.top_p, again.correlation.top_p)
    np.testing.assert_array_equal(got.correlation.top_q, again.correlation.top_q)
    np.testing.assert_array_equal(got.correlation.top_change, again.correlation.top_change)


def _summary(engine, day):
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT previous_date, n_previous_symbols FROM change_summaries "
                "WHERE snapshot_date = :d"
            ),
            {"d": day},
        ).one_or_none()


def test_a_change_set_stale_at_publication_is_refused(clean_db, store):
    """The race of a parallel backfill: D2's changes computed against D0 while D1 was being
    published, and D1's run has already recorded D2's changes against D1. Publishing the stale
    set now would overwrite the current one: refused under the date's lock, nothing written."""
    s0, _, s1, _ = _days(clean_db, store)
    stale = compute_changes(clean_db, store, D2)
    assert stale is not None and stale.previous_date == D0
    publish_day(clean_db, store, D1, s1[:-3], 3)
    current = compute_and_publish(clean_db, store, D2)
    assert current is not None and current[0].previous_date == D1
    with pytest.raises(StaleChangesError, match=f"the previous session is now {D1}, not {D0}"):
        publish_changes(clean_db, publication(stale))
    assert tuple(_summary(clean_db, D2)) == (D1, len(s1) - 3)


def test_changes_computed_again_when_stale_at_publication(clean_db, store, monkeypatch):
    """compute_and_publish of D2 while D1 is published during the first computation (as a
    parallel backfill's run of D1 does): the first set (against D0) is refused as stale and
    computed again against D1; a set stale every time fails after the attempts."""
    s0, _, s1, _ = _days(clean_db, store)
    computed = []

    def racing(*args, **kwargs):
        results = compute_changes(*args, **kwargs)
        computed.append(results.previous_date)
        if len(computed) == 1:
            publish_day(clean_db, store, D1, s1[:-3], 3)
        return results

    monkeypatch.setattr(changes_step, "compute_changes", racing)
    logged: list[str] = []
    results, _, report = compute_and_publish(clean_db, store, D2, log=logged.append)
    assert computed == [D0, D1] and results.previous_date == D1
    assert any("stale" in line and "attempt 2 of 3" in line for line in logged), logged
    assert report.rows["change_summaries"] == 1
    assert tuple(_summary(clean_db, D2)) == (D1, len(s1) - 3)

    def always_stale(*args, **kwargs):  # the previous session republished every time
        results = compute_changes(*args, **kwargs)
        publish_day(clean_db, store, D1, s1[:-3], 3)
        return results

    monkeypatch.setattr(changes_step, "compute_changes", always_stale)
    with pytest.raises(StaleChangesError, match="re-published"):
        compute_and_publish(clean_db, store, D2, attempts=2)
    assert tuple(_summary(clean_db, D2)) == (D1, len(s1) - 3)  # the last current set stays


def test_withdrawing_a_snapshot_withdraws_its_recorded_changes(clean_db, store):
    """``db prune`` (:func:`delete_snapshot`) of a date takes its ``change_*`` rows with it:
    no change set is left describing a snapshot that is no longer published."""
    s0, _, _, _ = _days(clean_db, store)
    publish_changes(clean_db, publication(compute_changes(clean_db, store, D2, top_m=7)))
    count = "SELECT count(*) FROM {} WHERE snapshot_date = :d"
    tables = ("change_summaries", "change_pairs", "change_symbols", "change_clusters")
    with clean_db.connect() as conn:
        before = {t: conn.execute(sa.text(count.format(t)), {"d": D2}).scalar_one() for t in tables}
    assert all(before.values()), before
    assert delete_snapshot(clean_db, D2) is True
    with clean_db.connect() as conn:
        for table in (*tables, "change_lead_lag", "snapshots"):
            assert conn.execute(sa.text(count.format(table)), {"d": D2}).scalar_one() == 0, table
        assert conn.execute(sa.text(count.format("snapshots")), {"d": D0}).scalar_one() == 1


@pytest.mark.parametrize(
    "today",
    [
        [f"X{i:02d}" for i in range(12)],  # re-keyed: nothing in common with D0
        ["S000", *[f"X{i:02d}" for i in range(11)]],  # one symbol in common
        ["S001", "S002", "S003"],  # shrunk to a handful
    ],
    ids=["disjoint", "one-common", "handful"],
)
def test_changes_of_a_universe_that_changed_are_published(clean_db, store, today):
    """The session before shares few or no symbols: the changes record entered and left, and
    what the common symbols allow, and they are published (the step does not fail); so is the
    refresh of the following session's changes when the changed session is published between."""
    s0 = [f"S{i:03d}" for i in range(20)]
    publish_day(clean_db, store, D0, s0, 1)
    publish_day(clean_db, store, D2, s0[:15], 2)
    publish_day(clean_db, store, D1, today, 3)  # between: D2's changes are refreshed against D1
    results, rows, report = compute_and_publish(clean_db, store, D1)
    shown = metadata.changes(results, dict(rows.summary), dict(rows.rows), StageStats())
    assert shown["n_common"].value == len(set(today) & set(s0))  # the UI's metadata builds too
    corr = results.correlation
    if corr is not None:  # and its histogram is drawn, even of no pair
        pictures.change_histogram_metadata(
            corr.change_counts,
            corr.change_edges,
            mean_abs_change=corr.means["abs_change"],
            title="changes",
        )
    common = sorted(set(today) & set(s0))
    assert results.previous_date == D0 and results.match.common == common
    assert [today[i] for i in results.match.entered] == sorted(set(today) - set(s0))
    assert [s0[i] for i in results.match.left] == sorted(set(s0) - set(today))
    assert report.rows["change_summaries"] == 1
    refreshed, _, report2 = compute_and_publish(clean_db, store, D2)
    assert refreshed.previous_date == D1
    assert refreshed.match.common == sorted(set(today) & set(s0[:15]))
    assert report2.rows["change_summaries"] == 1
    assert tuple(_summary(clean_db, D1))[0] == D0
    assert tuple(_summary(clean_db, D2))[0] == D1
    for day in (D1, D2):  # and `query changes` shows them
        text = to_text(published_changes(clean_db, day))
        assert f"{len(set(today) & set(s0 if day == D1 else s0[:15]))} in both" in text, text
        if not set(today) & set(s0):
            assert "market drift: nothing to compare" in text and "NaN" not in text, text
