"""Publishing a snapshot (SPEC §7): exact rows, replace-not-duplicate, atomicity, concurrency."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.db.publish import (
    PublishError,
    read_snapshot_counts,
)
from corr_pipeline.db.published_reads import published_rows
from corr_pipeline_tests.fixtures.published import AS_OF, D, make_results, publish, snapshot_row


def expected_rows(results: dict, snapshot_date=D) -> dict[str, set]:
    s = results["symbols"]
    neighbors = set()
    for i, row in enumerate(results["neighbor_index"]):
        for c, j in enumerate(row):
            if j >= 0:
                neighbors.add(
                    (
                        snapshot_date,
                        s[i],
                        c + 1,
                        s[j],
                        float(results["neighbor_corr"][i, c]),
                        int(results["neighbor_overlap"][i, c]),
                    )
                )
    clusters = {(snapshot_date, s[i], int(c)) for i, c in enumerate(results["cluster_labels"])}
    pairs = set()
    for p in results["lead_lag_pairs"]:
        sync = float(p["sync_corr"])
        back = int(p["reverse_lag"])
        pairs.add(
            (
                snapshot_date,
                s[p["leader"]],
                s[p["lagger"]],
                int(p["lag"]),
                float(p["lagged_corr"]),
                None if np.isnan(sync) else sync,
                float(p["improvement"]),
                int(p["overlap"]),
                float(p["p_value"]),
                float(p["q_value"]),
                back or None,  # no reverse best lag: the three are NULL
                float(p["reverse_lagged_corr"]) if back else None,
                float(p["reverse_q_value"]) if back else None,
            )
        )
    return {"peer_neighbors": neighbors, "symbol_clusters": clusters, "lead_lag_pairs": pairs}


def read_rows(engine, snapshot_date=D) -> dict[str, set]:
    out = {}
    with engine.connect() as conn:
        for table, cols in (
            ("peer_neighbors", "snapshot_date, symbol, rank, neighbor, corr, overlap"),
            ("symbol_clusters", "snapshot_date, symbol, cluster_id"),
            (
                "lead_lag_pairs",
                "snapshot_date, leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap, "
                "p_value, q_value, reverse_lag, reverse_lagged_corr, reverse_q_value",
            ),
        ):
            # real columns come back as the shortest decimal of the float4; widen exactly
            # (the double precision p_value, q_value and reverse_q_value are exact as they are)
            doubles = {8, 9, 12} if table == "lead_lag_pairs" else set()
            out[table] = {
                tuple(
                    float(np.float32(v)) if isinstance(v, float) and i not in doubles else v
                    for i, v in enumerate(r)
                )
                for r in conn.execute(
                    sa.text(f"SELECT {cols} FROM {table} WHERE snapshot_date = :d"),
                    {"d": snapshot_date},
                )
            }
    return out


@contextlib.contextmanager
def trigger_on(engine, table: str, body: str, *, when: str = "BEFORE", level: str = "STATEMENT"):
    """A real PostgreSQL trigger on ``table`` for the duration of the block."""
    name = f"test_{table}_trg"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN {body} RETURN NULL; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER {name} {when} INSERT ON {table} FOR EACH {level} "
                f"EXECUTE FUNCTION {name}()"
            )
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER IF EXISTS {name} ON {table}"))
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {name}()"))


# ------------------------------------------------------------------------------------------


def test_published_rows_are_exact(clean_db):
    results = make_results(n=60, k=5, seed=1)
    report = publish(clean_db, results)
    want = expected_rows(results)
    assert read_rows(clean_db) == want  # padding skipped, NaN sync -> NULL, float32 exact
    assert report.rows == {
        "snapshots": 1,
        "peer_neighbors": len(want["peer_neighbors"]),
        "symbol_clusters": 60,
        "lead_lag_pairs": 20,
        "suspect_prices": 0,
    }
    assert report.rows["peer_neighbors"] < 60 * 5  # some rows were padded
    assert read_snapshot_counts(clean_db, D) == report.rows
    assert not report.replaced_previous
    (row,) = snapshot_row(clean_db)
    assert row["as_of_trade_date"] == AS_OF
    assert (row["n_symbols"], row["n_dropped"], row["lookback_days"]) == (60, 3, 252)
    assert row["params"] == {"k": 5, "as_of": "2024-03-28", "min_overlap": 30}
    assert row["created_at"] is not None
    with clean_db.connect() as conn:
        nulls = conn.execute(
            sa.text("SELECT count(*) FROM lead_lag_pairs WHERE sync_corr IS NULL")
        ).scalar()
    assert nulls == int(np.isnan(results["lead_lag_pairs"]["sync_corr"]).sum()) == 5


def test_published_rows_reads_the_pairs_back_in_spec_order(clean_db):
    """``published_rows`` (twelve binary arrays, sorted here) gives back exactly the published
    lead-lag pairs, NaN sync_corr, float64 p/q values and the reverse direction (0 and NaN
    where it is NULL) included, in SPEC §6 order: improvement descending, then
    leader and lagger names. Tied improvements (a quarter of the pairs share one value) and
    symbols whose names do not sort like their input positions exercise the ties."""
    results = make_results(n=50, k=3, seed=5, n_pairs=40)
    results["symbols"] = [f"Z{(37 * i) % 50:02d}" for i in range(50)]  # shuffled name order
    pairs = results["lead_lag_pairs"]
    pairs["improvement"][::4] = np.float32(0.25)
    publish(clean_db, results)
    got = published_rows(clean_db, D)
    assert got is not None and got.symbols == sorted(results["symbols"])
    position = {name: i for i, name in enumerate(got.symbols)}
    expected = pairs.copy()
    for side in ("leader", "lagger"):
        expected[side] = [position[results["symbols"][i]] for i in pairs[side]]
    names = (
        [results["symbols"][i] for i in pairs["leader"]],
        [results["symbols"][i] for i in pairs["lagger"]],
    )
    order = sorted(
        range(pairs.size), key=lambda r: (-pairs["improvement"][r], names[0][r], names[1][r])
    )
    assert got.lead_lag_pairs.dtype == LEAD_LAG_DTYPE
    for name in LEAD_LAG_DTYPE.names:
        np.testing.assert_array_equal(got.lead_lag_pairs[name], expected[order][name], err_msg=name)
    assert np.isnan(got.lead_lag_pairs["sync_corr"]).sum() == 10
    assert (got.lead_lag_pairs["reverse_lag"] == 0).sum() == 6
    assert published_rows(clean_db, dt.date(2024, 1, 2)) is None


def test_republish_replaces_not_duplicates(clean_db):
    other_day = dt.date(2024, 3, 27)
    first = make_results(n=40, k=4, seed=2)
    second = make_results(n=25, k=3, seed=3, n_pairs=7)
    publish(clean_db, first)
    publish(clean_db, first, snapshot_date=other_day, as_of_trade_date=other_day)
    report = publish(clean_db, second, n_dropped=9)
    assert report.replaced_previous
    assert read_rows(clean_db) == expected_rows(second)
    assert len(snapshot_row(clean_db)) == 1 and snapshot_row(clean_db)[0]["n_dropped"] == 9
    # the other snapshot date is untouched
    assert read_rows(clean_db, other_day) == expected_rows(first, other_day)
    # re-publishing identical content twice leaves one copy
    publish(clean_db, second)
    assert read_snapshot_counts(clean_db, D) == report.rows


def test_failure_mid_publish_keeps_previous_snapshot(clean_db):
    previous = make_results(n=30, k=3, seed=4)
    publish(clean_db, previous)
    before = read_rows(clean_db)
    before_row = snapshot_row(clean_db)
    # the last insert of the transaction fails inside PostgreSQL, after the snapshot row was
    # deleted and re-inserted and the neighbors/clusters were inserted
    with trigger_on(clean_db, "lead_lag_pairs", "RAISE EXCEPTION 'simulated failure mid-publish';"):
        with pytest.raises(psycopg.errors.RaiseException, match="simulated failure mid-publish"):
            publish(clean_db, make_results(n=50, k=4, seed=5))
    assert read_rows(clean_db) == before
    assert snapshot_row(clean_db) == before_row


def test_readers_never_see_a_half_published_snapshot(clean_db):
    old = make_results(n=30, k=3, seed=6)
    new = make_results(n=45, k=2, seed=7)
    publish(clean_db, old)
    old_counts = read_snapshot_counts(clean_db, D)
    seen: list[dict] = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            seen.append(read_snapshot_counts(clean_db, D))
            time.sleep(0.02)

    # slow the publisher down between its neighbor insert and the rest
    with trigger_on(clean_db, "peer_neighbors", "PERFORM pg_sleep(1.0);", when="AFTER"):
        t = threading.Thread(target=reader)
        t.start()
        try:
            report = publish(clean_db, new)
        finally:
            done.set()
            t.join()
    new_counts = read_snapshot_counts(clean_db, D)
    assert new_counts == report.rows
    assert len(seen) > 5
    assert all(c in (old_counts, new_counts) for c in seen), [
        c for c in seen if c not in (old_counts, new_counts)
    ]
    assert old_counts in seen  # the reader ran while the publisher was mid-transaction


def test_concurrent_publishers_end_with_one_whole_snapshot(clean_db):
    versions = [make_results(n=200, k=5, seed=10), make_results(n=150, k=3, seed=11)]
    for _attempt in range(3):
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        reports = [None, None]

        def run(slot: int, barrier=barrier, reports=reports, errors=errors) -> None:
            try:
                barrier.wait()
                reports[slot] = publish(clean_db, versions[slot], n_dropped=slot)
            except BaseException as exc:  # pragma: no cover - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        (row,) = snapshot_row(clean_db)
        winner = versions[row["n_dropped"]]
        assert read_rows(clean_db) == expected_rows(winner)
        # one of the two waited for the other's lock
        assert max(r.lock_wait_seconds for r in reports) >= 0.0


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda r: r["neighbor_index"].__setitem__((0, slice(0, 2)), [-1, 5]), "padding"),
        (lambda r: r["neighbor_corr"].__setitem__((1, 0), np.nan), "non-finite corr"),
        (lambda r: r["neighbor_index"].__setitem__((2, 0), 2), "itself"),
        (lambda r: r["neighbor_index"].__setitem__((3, 0), 99), r"\[-1, 20\)"),
        (lambda r: r.__setitem__("cluster_labels", r["cluster_labels"][:-1]), "19 entries"),
        (lambda r: r.__setitem__("symbols", r["symbols"][:-1] + [r["symbols"][0]]), "duplicates"),
        (
            lambda r: r.__setitem__(
                "lead_lag_pairs", np.concatenate([r["lead_lag_pairs"], r["lead_lag_pairs"][:1]])
            ),
            "twice",
        ),
        (lambda r: r["lead_lag_pairs"]["lagged_corr"].__setitem__(0, np.nan), "finite"),
        (lambda r: r["lead_lag_pairs"]["p_value"].__setitem__(1, np.nan), r"p_value must be fin"),
        (lambda r: r["lead_lag_pairs"]["q_value"].__setitem__(2, np.nan), r"q_value must be fin"),
        (lambda r: r["lead_lag_pairs"]["p_value"].__setitem__(0, -1e-9), r"p_value .* \[0, 1\]"),
        (lambda r: r["lead_lag_pairs"]["q_value"].__setitem__(3, 1.5), r"q_value .* \[0, 1\]"),
        (lambda r: r["lead_lag_pairs"]["q_value"].__setitem__(4, np.inf), r"q_value must be fin"),
        (lambda r: r["lead_lag_pairs"]["reverse_lag"].__setitem__(0, -1), r"reverse_lag .* 0\.\."),
        (
            lambda r: r["lead_lag_pairs"]["reverse_lagged_corr"].__setitem__(1, np.nan),
            r"reverse_lagged_corr must be finite where reverse_lag > 0",
        ),
        (
            lambda r: r["lead_lag_pairs"]["reverse_q_value"].__setitem__(2, 1.5),
            r"reverse_q_value must be finite and lie in \[0, 1\] where reverse_lag > 0",
        ),
        (
            lambda r: r["lead_lag_pairs"]["reverse_q_value"].__setitem__(3, np.nan),
            r"reverse_q_value must be finite",
        ),
        (lambda r: r.__setitem__("neighbor_overlap", None), "required"),
        (
            lambda r: r.__setitem__("lead_lag_pairs", r["lead_lag_pairs"][["leader", "lagger"]]),
            "missing",
        ),
    ],
)
def test_invalid_results_are_rejected_before_writing(clean_db, mutate, message):
    good = make_results(n=20, k=3, seed=12, n_pairs=5)
    publish(clean_db, good)
    bad = make_results(n=20, k=3, seed=12, n_pairs=5)
    mutate(bad)
    with pytest.raises(PublishError, match=message):
        publish(clean_db, bad)
    assert read_rows(clean_db) == expected_rows(good)


def test_params_must_be_json(clean_db):
    with pytest.raises(PublishError, match="jsonb"):
        publish(clean_db, make_results(n=10, k=2, seed=13), params={"x": float("nan")})
    assert read_snapshot_counts(clean_db, D)["snapshots"] == 0


def test_empty_lead_lag_and_string_dates(clean_db):
    results = make_results(n=10, k=2, seed=14)
    results["lead_lag_pairs"] = np.zeros(0, dtype=LEAD_LAG_DTYPE)
    report = publish(clean_db, results, snapshot_date="2024-03-29", as_of_trade_date="2024-03-28")
    assert report.rows["lead_lag_pairs"] == 0
    assert json.loads(json.dumps(snapshot_row(clean_db)[0]["params"]))["k"] == 2


def test_significance_round_trips_bit_for_bit(clean_db):
    """p_value and q_value go into double precision columns as float8 (binary COPY) and read
    back exactly, both through SQL and through ``published_rows``' binary arrays: the extremes
    of [0, 1], subnormal and smallest positive doubles, values with all 53 bits used."""
    results = make_results(n=12, k=2, seed=15, n_pairs=8)
    special = np.array([0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1 / 3, np.nextafter(1, 0)])
    pairs = results["lead_lag_pairs"]
    pairs["p_value"][: special.size] = special
    pairs["q_value"][: special.size] = np.minimum(1.0, special * 3)
    pairs["p_value"][-1] = pairs["q_value"][-1] = 1.0
    publish(clean_db, results)
    assert read_rows(clean_db) == expected_rows(results)
    got = published_rows(clean_db, D)
    assert got is not None
    by_pair = {
        (got.symbols[a], got.symbols[b]): (p, q)
        for a, b, p, q in got.lead_lag_pairs[["leader", "lagger", "p_value", "q_value"]].tolist()
    }
    symbols = results["symbols"]
    for a, b, p, q in pairs[["leader", "lagger", "p_value", "q_value"]].tolist():
        assert by_pair[symbols[a], symbols[b]] == (p, q)
    with clean_db.connect() as conn:
        types = conn.execute(
            sa.text(
                "SELECT DISTINCT pg_typeof(p_value)::text, pg_typeof(q_value)::text "
                "FROM lead_lag_pairs"
            )
        ).all()
    assert types == [("double precision", "double precision")]


def test_binary_arrays_are_read_exactly_or_refused(clean_db):
    """``array_send`` bytes from the server read back as numpy arrays (an empty aggregate's NULL
    as an empty array); another element type, NULL elements or a truncated body are refused."""
    import sqlalchemy as sa

    from corr_pipeline.db.published_reads import _from_array_send

    with clean_db.connect() as conn:
        ints, floats, doubles, nulls, none = conn.execute(
            sa.text(
                "SELECT array_send(ARRAY[1, -2, 2147483647]::int4[]), "
                "array_send(ARRAY[0.5, 'NaN', '-Infinity']::float4[]), "
                "array_send(ARRAY[5e-324, 'NaN', 0.1]::float8[]), "
                "array_send(ARRAY[1, NULL]::int4[]), "
                "array_send((SELECT array_agg(x) FROM generate_series(1, 0) x))"
            )
        ).one()
    assert _from_array_send(ints, ">i4").tolist() == [1, -2, 2147483647]
    got = _from_array_send(floats, ">f4")
    assert got[0] == 0.5 and np.isnan(got[1]) and got[2] == -np.inf
    got = _from_array_send(doubles, ">f8")
    assert got[0] == 5e-324 and np.isnan(got[1]) and got[2] == 0.1
    assert _from_array_send(none, ">i4").size == 0
    assert _from_array_send(none, ">f8").size == 0
    for bad, kind in (
        (ints, ">f4"),
        (nulls, ">i4"),
        (bytes(ints)[:-2], ">i4"),
        (floats, ">f8"),
        (doubles, ">f4"),
        (bytes(doubles)[:-4], ">f8"),
    ):
        with pytest.raises(ValueError, match="unexpected array_send output"):
            _from_array_send(bad, kind)


def test_reverse_direction_round_trips_and_none_is_null(clean_db):
    """The reverse direction (SPEC §6 "Direction") goes into smallint, real and double
    precision columns exactly (float32 and float64 bit for bit, the extremes of [0, 1] and
    subnormal q-values included) and reads back through ``published_rows``. A reverse_lag of 0
    (no reverse best lag) publishes all three as NULL whatever its two float fields hold (here
    the zeros of ``np.zeros``, or NaN), and reads back as 0 and NaN."""
    results = make_results(n=12, k=2, seed=16, n_pairs=8)
    pairs = results["lead_lag_pairs"]
    pairs["reverse_lag"] = [1, 32767, 3, 0, 2, 0, 5, 1]
    pairs["reverse_lagged_corr"] = np.array(
        [-1.0, 1.0, np.float32(1 / 3), 0.0, -1e-30, np.nan, 0.5, -0.25], dtype=np.float32
    )
    pairs["reverse_q_value"] = [0.0, 1.0, 5e-324, 0.0, 1 / 3, np.nan, 0.05, np.nextafter(0.05, 1)]
    publish(clean_db, results)
    assert read_rows(clean_db) == expected_rows(results)
    with clean_db.connect() as conn:
        types = conn.execute(
            sa.text(
                "SELECT DISTINCT pg_typeof(reverse_lag)::text, pg_typeof(reverse_lagged_corr)::text,"
                " pg_typeof(reverse_q_value)::text FROM lead_lag_pairs WHERE reverse_lag > 0"
            )
        ).all()
        nulls = conn.execute(
            sa.text(
                "SELECT count(*) FROM lead_lag_pairs WHERE reverse_lag IS NULL "
                "AND reverse_lagged_corr IS NULL AND reverse_q_value IS NULL"
            )
        ).scalar_one()
    assert types == [("smallint", "real", "double precision")]
    assert nulls == 2
    got = published_rows(clean_db, D)
    assert got is not None
    fields = ["leader", "lagger", "reverse_lag", "reverse_lagged_corr", "reverse_q_value"]
    by_pair = {
        (got.symbols[a], got.symbols[b]): rest
        for a, b, *rest in got.lead_lag_pairs[fields].tolist()
    }
    symbols = results["symbols"]
    for a, b, lag, corr, q in pairs[fields].tolist():
        back = by_pair[symbols[a], symbols[b]]
        if lag:
            assert back == [lag, corr, q]
        else:
            assert back[0] == 0 and np.isnan(back[1]) and np.isnan(back[2])
