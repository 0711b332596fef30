"""snapshot_changes (SPEC §10) in real materializations of the whole graph: nothing recorded for
the first session, the changes of the second against pandas on the stored matrices, the UI's
metadata, retention (keep = 1) keeping the previous session's matrices exactly until the
changes are computed, and a re-materialization replacing the date's changes."""

from __future__ import annotations

import datetime as dt
import math

import dagster as dg
import numpy as np
import pandas as pd
import sqlalchemy as sa

from corr_pipeline.db.published_reads import change_staleness
from corr_pipeline.defs import pictures
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.io_manager import MatrixStoreResource
from corr_pipeline.defs.partitions import snapshot_calendar
from corr_pipeline.snapshot import display, markdown
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.fixtures.pipeline import LAST, snapshot_resources

FIRST = "2026-11-25"


def _run(store_dir, day: str, **config) -> dg.ExecuteInProcessResult:
    resources = snapshot_resources(store_dir)
    resources["matrix_store"] = MatrixStoreResource(keep_matrices=1)
    run_config = {"ops": {"snapshot": {"config": config}}} if config else None
    result = dg.materialize(
        snapshot_assets, partition_key=day, resources=resources, run_config=run_config
    )
    assert result.success
    return result


def _metadata(result: dg.ExecuteInProcessResult, partition: str | None = None) -> dict:
    """The metadata of the run's snapshot_changes materialization of ``partition`` (default
    the run's own; a run that refreshes the next session's changes materializes that one too)."""
    partition = partition or result.dagster_run.tags["dagster/partition"]
    [event] = [e for e in materializations(result, "snapshot_changes") if e.partition == partition]
    return {key: value.value for key, value in event.metadata.items()}


def _pairs_frame(store: MatrixStore, day: str) -> pd.DataFrame:
    """Every pair (a < b by name) of the day's stored matrices, by plain loops."""
    corr = store.load("correlation_matrix", day, "corr")
    overlap = store.load("overlap_matrix", day, "overlap")
    symbols = corr.labels["symbols"]
    c, o = np.asarray(corr.array), np.asarray(overlap.array)
    rows = {}
    for i, a in enumerate(symbols):
        for j in range(i + 1, len(symbols)):
            rows[(a, symbols[j])] = (float(c[i, j]), int(o[i, j]))
    return pd.DataFrame.from_dict(rows, orient="index", columns=["corr", "overlap"])


def test_changes_in_the_pipeline(universe, engine, tmp_path):  # noqa: F811
    store_dir = tmp_path / "store"
    store = MatrixStore(store_dir)
    first = _run(store_dir, FIRST)
    assert _metadata(first)["recorded"] is False
    before = _pairs_frame(store, FIRST)  # read now: retention removes them once used

    # keep = 1: publishing LAST would remove FIRST's matrices; they stay until the changes of
    # LAST are computed, then retention prunes them (said in snapshot_publication's metadata)
    second = _run(store_dir, LAST, top_m=25)
    [publication] = materializations(second, "snapshot_publication")
    assert publication.metadata["retention_removed"].value == [FIRST]
    meta = _metadata(second)
    assert meta["recorded"] is True and meta["previous_date"] == FIRST
    # consecutive sessions (Thanksgiving between is no session): overnight changes
    assert meta["sessions_between"] == 0 and meta["compared_with"] == f"previous session: {FIRST}"
    assert "overnight" not in meta["largest_moves"]
    assert meta["skipped"] == {}
    assert store.files.partition_keys() == [LAST]
    picture = meta["picture: correlation changes"]
    assert picture.startswith("![")
    assert "| rank | symbol a |" in meta["largest_moves"]

    # the drift and the top moves against pandas on the stored matrices
    today = _pairs_frame(store, LAST)
    both = today.merge(before, left_index=True, right_index=True, suffixes=("_t", "_p"))
    ok = (
        np.isfinite(both.corr_t)
        & np.isfinite(both.corr_p)
        & (both.overlap_t >= 30)
        & (both.overlap_p >= 30)
    )
    both = both[ok].copy()
    both["d"] = both.corr_t - both.corr_p
    assert meta["n_pairs_compared"] == len(both) > 1000
    # metadata shows correlations to display.CORR_DECIMALS (4) decimals; the exact values are
    # compared with the brute force in compute/test_changes.py
    assert math.isclose(meta["mean_abs_change"], both.d.abs().mean(), abs_tol=1e-4)
    assert math.isclose(meta["mean_corr"], both.corr_t.mean(), abs_tol=1e-4)
    assert math.isclose(meta["median_abs_corr"], both.corr_t.abs().median(), abs_tol=1e-4)
    both["a"] = [a for a, _ in both.index]
    both["b"] = [b for _, b in both.index]
    top = both.assign(ad=both.d.abs()).sort_values(
        ["ad", "a", "b"], ascending=[False, True, True], kind="mergesort"
    )
    with engine.connect() as conn:
        published = conn.execute(
            sa.text(
                "SELECT symbol_a, symbol_b, change FROM change_pairs WHERE snapshot_date = :d "
                "ORDER BY rank"
            ),
            {"d": LAST},
        ).all()
        summary = (
            conn.execute(
                sa.text("SELECT * FROM change_summaries WHERE snapshot_date = :d"), {"d": LAST}
            )
            .one()
            ._mapping
        )
    assert [(a, b) for a, b, _ in published] == list(zip(top.a[:25], top.b[:25], strict=True))
    np.testing.assert_array_equal([c for _, _, c in published], top.d[:25].to_numpy())
    # the published value is exact, the metadata shows it rounded by the display rule
    assert math.isclose(summary["mean_abs_change"], both.d.abs().mean(), abs_tol=1e-12)
    assert meta["mean_abs_change"] == display.corr(summary["mean_abs_change"])
    assert summary["n_common"] == meta["n_common"]

    # a re-materialization replaces the date's changes: same rows, no duplicates
    again = _run(store_dir, LAST, top_m=10)
    assert _metadata(again)["replaced_previous"] is True
    # FIRST's matrices are gone now: the correlation parts are skipped, the rest recomputed
    assert set(_metadata(again)["skipped"]) == {"drift", "top_moves"}
    with engine.connect() as conn:
        counts = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM change_summaries WHERE snapshot_date = :d), "
                "(SELECT count(*) FROM change_pairs WHERE snapshot_date = :d), "
                "(SELECT n_pairs FROM change_summaries WHERE snapshot_date = :d)"
            ),
            {"d": LAST},
        ).one()
    assert tuple(counts) == (1, 0, None)


def test_only_snapshot_changes_depends_on_the_previous_session():
    """snapshot_changes of D depends on the publications of D and of the previous session (the
    previous partition: the calendar skips the Thanksgiving holiday between FIRST and LAST; the
    first partition has none). No other snapshot asset depends on another partition, so a
    backfill still runs the snapshots of its partitions in parallel (test_parallel_backfill);
    the real materializations of both partitions are test_changes_in_the_pipeline's."""
    from corr_pipeline.definitions import defs
    from corr_pipeline.defs.partitions import snapshot_partitions

    graph = defs.resolve_asset_graph()
    changes, publication = dg.AssetKey("snapshot_changes"), dg.AssetKey("snapshot_publication")

    def parents(key: str, parent: dg.AssetKey, child: dg.AssetKey) -> list[str]:
        found = graph.get_parent_partition_keys_for_child(key, parent, child)
        return sorted(found.partitions_subset.get_partition_keys())

    assert parents(LAST, publication, changes) == [FIRST, LAST]
    first = snapshot_partitions.get_first_partition_key()
    assert parents(first, publication, changes) == [first]
    for asset in snapshot_assets:
        for child in asset.keys:
            for parent in graph.get(child).parent_keys:
                if child == changes or not graph.get(parent).is_partitioned:
                    continue
                assert parents(LAST, parent, child) == [LAST], (child, parent)


def test_changes_of_the_next_session_are_refreshed_when_a_session_is_published_late(
    universe,  # noqa: F811
    engine,
    tmp_path,
):
    """A parallel backfill may materialize LAST before FIRST: LAST's changes then find no
    earlier session and record nothing; snapshot_changes of FIRST, once FIRST is published,
    computes LAST's changes against FIRST (and says so in its metadata)."""
    store_dir = tmp_path / "store"
    assert _metadata(_run(store_dir, LAST))["recorded"] is False
    result = _run(store_dir, FIRST)
    first = _metadata(result)
    assert first["recorded"] is False and first["refreshed_following"] == LAST
    assert _metadata(result, LAST)["previous_date"] == FIRST  # LAST's partition says it too
    with engine.connect() as conn:
        previous = conn.execute(
            sa.text("SELECT previous_date FROM change_summaries WHERE snapshot_date = :d"),
            {"d": LAST},
        ).scalar_one()
    assert previous.isoformat() == FIRST
    # FIRST re-published (a re-run): LAST's changes compared the old publication, so again
    assert _metadata(_run(store_dir, FIRST))["refreshed_following"] == LAST
    with engine.connect() as conn:
        summary = (
            conn.execute(
                sa.text("SELECT * FROM change_summaries WHERE snapshot_date = :d"), {"d": LAST}
            )
            .one()
            ._mapping
        )
        assert change_staleness(conn, summary) == []


#: a session published before a gap: 2026-11-19, 20, 23, 24 and 25 are sessions not published
BEFORE_GAP = "2026-11-18"


def test_changes_across_a_gap_say_so_in_the_metadata(
    universe,  # noqa: F811
    engine,
    tmp_path,
    monkeypatch,
):
    """The run of LAST after one of BEFORE_GAP only: its changes compare with BEFORE_GAP, and
    the materialization's metadata, markdown previews and picture title say how many sessions
    of the partitions' calendar lie between (counted here day by day), not overnight."""
    titles: list[str] = []
    draw = pictures.change_histogram_metadata

    def drawn(*args, title: str, **kwargs):
        titles.append(title)
        return draw(*args, title=title, **kwargs)

    monkeypatch.setattr(pictures, "change_histogram_metadata", drawn)
    store_dir = tmp_path / "store"
    _run(store_dir, BEFORE_GAP)
    meta = _metadata(_run(store_dir, LAST))
    earlier, later = dt.date.fromisoformat(BEFORE_GAP), dt.date.fromisoformat(LAST)
    between = [
        earlier + dt.timedelta(days=i)
        for i in range(1, (later - earlier).days)
        if snapshot_calendar.is_session(earlier + dt.timedelta(days=i))
    ]
    assert len(between) == 5  # Thanksgiving (11-26) and the weekend are no sessions
    assert meta["previous_date"] == BEFORE_GAP and meta["sessions_between"] == len(between)
    warning = f"previous published session: {BEFORE_GAP}, 5 sessions between the two"
    assert meta["compared_with"] == warning + " — NOT overnight changes"
    assert meta["largest_moves"].startswith("**" + markdown.escape(warning))
    assert meta["largest_turnover"].startswith("**" + markdown.escape(warning))
    assert titles == [
        f"Correlation changes {BEFORE_GAP} → {LAST} (5 sessions between: NOT overnight)"
    ]
    with engine.connect() as conn:
        recorded = conn.execute(
            sa.text("SELECT sessions_between FROM change_summaries WHERE snapshot_date = :d"),
            {"d": LAST},
        ).scalar_one()
    assert recorded == 5
