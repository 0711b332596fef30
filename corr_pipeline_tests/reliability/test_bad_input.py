"""Bad input, end to end through the Dagster materialization: every failure is loud, specific,
not retried, and harmless (the previously published snapshot of the date stays whole, nothing is
published, nothing half-written).

Already covered elsewhere (not repeated here): CSV rejections by kind with file and line
(``db/test_prices_import.py``), window errors at the function level (``db/test_window.py``),
parameter rules field by field (``defs/test_config_and_schedule.py``), a partition before the
data (``defs/test_pipeline.py::test_window_too_short_is_a_clear_non_retried_failure``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.compute import find_lead_lag_pairs, pairwise_correlation
from corr_pipeline.compute.clusters import hierarchical_clusters
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.neighbors import top_k_neighbors
from corr_pipeline.db.prices_import import PricesImportError, import_prices_csv
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.defs.run import materialize_snapshot
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.fixtures.deployment import use_store
from corr_pipeline_tests.reliability import helpers as h

D = dt.date(2026, 10, 30)  # a Friday
KEY = D.isoformat()


def publish_previous(engine: sa.Engine) -> dict[str, list[tuple]]:
    """A small earlier version of the snapshot of D, published directly; returns its rows."""
    pairs = np.zeros(
        1,
        dtype=LEAD_LAG_DTYPE,
    )
    pairs[0] = (0, 1, 1, 0.5, 0.1, 0.4, 25, 0.001, 0.002, 2, -0.3, 0.01)
    publish_snapshot(
        engine,
        SnapshotResults(
            snapshot_date=D,
            as_of_trade_date=D,
            symbols=["PREV_A", "PREV_B", "PREV_C"],
            n_dropped=0,
            lookback_days=40,
            params={"version": "previous"},
            neighbor_index=np.array([[1], [0], [0]], dtype=np.int32),
            neighbor_corr=np.array([[0.9], [0.9], [0.2]], dtype=np.float32),
            neighbor_overlap=np.array([[30], [30], [30]], dtype=np.int16),
            cluster_labels=np.array([0, 0, 1], dtype=np.int32),
            lead_lag_pairs=pairs,
        ),
    )
    rows = h.snapshot_rows(engine, D)
    assert len(rows["peer_neighbors"]) == 3
    return rows


def assert_failed_cleanly(result, engine, previous, store_dir: Path, *fragments: str) -> str:
    """The run failed in its window with a message holding ``fragments``, was not retried,
    ran nothing downstream, and left the published snapshot and the store untouched."""
    assert not result.success
    failed = [e.step_key for e in h.events_of(result, "STEP_FAILURE")]
    assert failed == ["snapshot"], failed
    (message,) = h.failure_messages(result)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert not h.events_of(result, "STEP_UP_FOR_RETRY")  # bad data is not retried
    assert not h.events_of(result, "ASSET_MATERIALIZATION")
    assert h.snapshot_rows(engine, D) == previous
    assert not store_dir.exists() or not any(store_dir.rglob("*.npy"))
    return message


CASES = {
    "empty_prices_table": ([], ["the prices table is empty"]),
    "window_shorter_than_min_history_days": (
        # 21 trade dates = 20 returns < min_history_days = 30
        h.factor_prices(["AAA", "BBB", "CCC"], h.weekdays(D, 21), seed=1),
        ["only 21 trade date(s)", "20 returns", "min_history_days=30"],
    ),
    "every_symbol_dropped": (
        # FLAT: constant price (zero variance); SHORT: 10 of 45 dates (too few returns)
        [("FLAT", day, 10.0) for day in h.weekdays(D, 45)]
        + h.factor_prices(["SHORT"], h.weekdays(D, 10), seed=2)
        + [("ANCHOR_DATES", day, -1.0) for day in h.weekdays(D, 45)],  # bad prices only
        ["every one of the 3 symbols", "min_history_days=30", "zero variance"],
    ),
    "no_prices_on_or_before_the_date": (
        h.factor_prices(["AAA", "BBB"], h.weekdays(D + dt.timedelta(days=60), 40), seed=3),
        ["no prices on or before the snapshot date 2026-10-30"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_window_fails_clearly_and_keeps_the_previous_snapshot(clean_db, tmp_path, case):
    rows, fragments = CASES[case]
    previous = publish_previous(clean_db)
    h.insert_prices(clean_db, rows)
    store = tmp_path / "store"
    result = h.materialize(store, KEY)
    message = assert_failed_cleanly(result, clean_db, previous, store, *fragments)
    assert f"returns_matrix {KEY} failed: WindowError" in message


def test_one_symbol_is_refused_by_the_returns_check(clean_db, tmp_path):
    """N = 1 (decision, see docs/operations.md): the numerical core handles it (a 1 x 1
    correlation [[1]], neighbors all padding, one cluster, no pairs), but a one-symbol universe
    almost always means a broken price feed, so the pipeline refuses to publish it: the blocking
    ``returns_contract`` check fails with "only 1 symbol(s) kept" and the previous snapshot of
    the date stays published."""
    dates = h.weekdays(D, 45)
    rows = h.factor_prices(["ONLY"], dates, seed=4)
    rows += [("FLAT", day, 10.0) for day in dates]  # dropped: zero variance
    previous = publish_previous(clean_db)
    h.insert_prices(clean_db, rows)
    store = tmp_path / "store"
    result = h.materialize(store, KEY)

    assert not result.success
    assert [e.step_key for e in h.events_of(result, "STEP_FAILURE")] == ["snapshot"]
    assert "blocking asset check failed" in h.failure_messages(result)[0]
    (check,) = [
        e.event_specific_data
        for e in h.events_of(result, "ASSET_CHECK_EVALUATION")
        if e.event_specific_data.check_name == "returns_contract"
    ]
    assert not check.passed
    assert "only 1 symbol(s) kept: nothing to correlate" in check.metadata["problems"].value
    assert check.metadata["n_symbols"].value == 1
    assert not h.events_of(result, "STEP_UP_FOR_RETRY")
    materialized = {
        e.asset_key.to_user_string() for e in h.events_of(result, "ASSET_MATERIALIZATION")
    }
    assert materialized == {"returns_matrix"}  # nothing after the failed check
    assert h.snapshot_rows(clean_db, D) == previous

    # the numerical core itself is well defined at N = 1 (SPEC §3-§6)
    R = np.random.default_rng(0).standard_normal((44, 1)).astype(np.float32)
    corr = pairwise_correlation(R, min_overlap=20)
    assert corr.corr.tolist() == [[1.0]] and corr.overlap.tolist() == [[44]]
    neighbors = top_k_neighbors(corr.corr, k=3, overlap=corr.overlap)
    assert neighbors.index.tolist() == [[-1, -1, -1]] and np.isnan(neighbors.corr).all()
    assert hierarchical_clusters(corr.corr, distance_threshold=1.2).tolist() == [0]
    pairs = find_lead_lag_pairs(
        R, max_lag=2, k_leaders=2, k_laggers=2, min_overlap=20, corr=corr.corr
    )
    assert len(pairs) == 0


def test_invalid_configuration_names_every_field_and_runs_nothing(clean_db, tmp_path):
    """Through the project runner (``corr-pipeline`` / scripts): unknown, mistyped and
    inconsistent parameters are refused before any step runs, each field named."""
    h.insert_prices(clean_db, h.factor_prices(["AAA", "BBB"], h.weekdays(D, 45), seed=5))
    previous = publish_previous(clean_db)
    store = use_store(tmp_path / "store")
    cases = [
        ({"lookbak_days": 40}, ValueError, ["lookbak_days"]),  # the resource has no such field
        ({"lookback_days": "forty"}, ValueError, ["lookback_days"]),
        (
            {"k_neighbors": 0, "min_overlap": 500, "linkage_method": "ward", "max_lag": 0},
            ValueError,
            ["k_neighbors", "min_overlap", "linkage_method", "max_lag"],
        ),
    ]
    for params, error_type, fields in cases:
        with pytest.raises(error_type) as info:  # the top-level message names the fields
            materialize_snapshot(KEY, params=params, in_process=True)
        for field in fields:
            assert field in str(info.value), (field, str(info.value))
    assert h.snapshot_rows(clean_db, D) == previous
    assert not store.exists() or not any(store.rglob("*.npy"))
    with pytest.raises(ValueError, match="is not a snapshot partition"):
        materialize_snapshot("2026-10-31", params=h.PARAMS)  # a Saturday


ODD_SYMBOLS = [
    "O'REILLY",
    'QUOTE"D',
    "X'); DROP TABLE prices;--",
    "semi;colon",
    "SPACE CO",
    "comma,inside",
    "back\\slash",
    "\\N",  # COPY's text-format NULL marker
    "NULL",
    "Ünïcødé",
    "Cafe\u0301",  # decomposed é ...
    "Caf\u00e9",  # ... and composed é: two different symbols, kept apart
    "日本株",
    "📈 emoji",
    "%s %(x)s {}",  # driver/format placeholders
]


def test_odd_symbol_names_round_trip_verbatim(clean_db, tmp_path):
    """CSV import -> snapshot -> store and query: names with quotes, semicolons, spaces,
    commas, backslashes, NULL markers, placeholders and non-ASCII come back byte for byte."""
    symbols = sorted(ODD_SYMBOLS)
    leader, lagger = "X'); DROP TABLE prices;--", "日本株"
    rows = h.factor_prices(symbols, h.weekdays(D, 45), seed=6, lead_lag=(leader, lagger))
    csv_path = h.write_prices_csv(tmp_path / "odd.csv", rows)
    report = import_prices_csv(clean_db, csv_path)
    assert report.rows == len(rows) and report.inserted == len(rows)
    with clean_db.connect() as conn:
        stored = sorted(conn.execute(sa.text("SELECT DISTINCT symbol FROM prices")).scalars())
    assert stored == symbols

    store = tmp_path / "store"
    result = h.materialize(store, KEY)
    assert result.success, h.failure_messages(result)

    with clean_db.connect() as conn:
        clustered = sorted(
            conn.execute(
                sa.text("SELECT symbol FROM symbol_clusters WHERE snapshot_date = :d"), {"d": D}
            ).scalars()
        )
        neighbor_names = set(
            conn.execute(
                sa.text(
                    "SELECT symbol FROM peer_neighbors WHERE snapshot_date = :d UNION "
                    "SELECT neighbor FROM peer_neighbors WHERE snapshot_date = :d"
                ),
                {"d": D},
            ).scalars()
        )
        pairs = {
            (r.leader, r.lagger): r.lag
            for r in conn.execute(
                sa.text("SELECT leader, lagger, lag FROM lead_lag_pairs WHERE snapshot_date = :d"),
                {"d": D},
            )
        }
    assert clustered == symbols
    assert neighbor_names == set(symbols)
    assert pairs.get((leader, lagger)) == 1, pairs
    assert set().union(*pairs) <= set(symbols)

    matrices = MatrixStore(store)
    assert matrices.load("correlation_matrix", KEY, "corr").labels["symbols"] == symbols
    assert matrices.load_bundle("returns_matrix", KEY).labels["symbols"] == symbols

    for symbol in symbols:
        peers = q.peers(clean_db, symbol, D)
        assert peers.symbol == symbol and len(peers.peers) == h.PARAMS["k_neighbors"]
        assert {p["neighbor"] for p in peers.peers} <= set(symbols)
        assert q.cluster(clean_db, symbol, D).symbol == symbol
    lead_lag = q.lead_lag(clean_db, leader, D)
    assert (leader, lagger, 1) in {(p["leader"], p["lagger"], p["lag"]) for p in lead_lag.pairs}
    value = q.corr(clean_db, "Cafe\u0301", "Caf\u00e9", D, store=matrices)
    assert (value.a, value.b) == ("Cafe\u0301", "Caf\u00e9") and value.index_a != value.index_b
    assert np.isfinite(value.corr) and value.overlap == h.PARAMS["lookback_days"]
    with pytest.raises(q.UnknownSymbolError):
        q.peers(clean_db, "CAFÉ", D)  # no case or normalisation folding: verbatim only
    with clean_db.connect() as conn:  # the "injection" in a symbol did nothing
        assert conn.execute(sa.text("SELECT count(*) FROM prices")).scalar_one() == len(rows)


def test_huge_csv_cut_short_loads_nothing(clean_db, tmp_path):
    """A multi-chunk file (the importer streams 1 MiB chunks) truncated in the middle of a
    line, as an interrupted copy or a full disk leaves it: rejected with the file and the last
    line named, nothing loaded. Small truncated files are in db/test_prices_import.py."""
    dates = h.weekdays(D, 250)
    symbols = [f"SYM{i:04d}" for i in range(400)]  # 100,000 rows, ~3 MiB
    rows = h.factor_prices(symbols, dates, seed=7)
    full = h.write_prices_csv(tmp_path / "full.csv", rows)
    data = full.read_bytes()
    assert len(data) > 3 * (1 << 20)
    h.insert_prices(clean_db, [("KEEP", D, 1.0)])
    for cut_inside in ("trade_date", "close"):
        # cut 2/3 into the file, inside the chosen field of that line
        start = data.rfind(b"\n", 0, 2 * len(data) // 3) + 1
        line = data[start : data.index(b"\n", start)]
        symbol, day, close = line.decode().rstrip("\r").split(",")
        offset = len(symbol) + 1 + (4 if cut_inside == "trade_date" else len(day) + 3)
        truncated = tmp_path / f"cut_in_{cut_inside}.csv"
        truncated.write_bytes(data[: start + offset])
        line_number = data[:start].count(b"\n") + 1
        with pytest.raises(PricesImportError) as info:
            import_prices_csv(clean_db, truncated)
        assert info.value.line == line_number, str(info.value)
        assert str(info.value).startswith(f"{truncated} line {line_number}: ")
        if cut_inside == "close":  # "SYM0266,2026-07-08,76" parses: only the cut is wrong
            assert "cut short" in str(info.value)
        else:
            assert 'missing data for column "close"' in str(info.value)
        with clean_db.connect() as conn:
            assert conn.execute(sa.text("SELECT symbol FROM prices")).scalars().all() == ["KEEP"]
