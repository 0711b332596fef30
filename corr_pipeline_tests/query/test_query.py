"""Query answers (corr_pipeline.query) and commands (corr_pipeline.cli.query) against snapshots
published into the real PostgreSQL.

The snapshot rows are inserted with SQLAlchemy (SPEC §7 tables) from a small factor-model
universe whose correlation matrix, neighbors and clusters are computed here by brute force;
the matrices go into a MatrixStore in tmp_path, exactly where the assets put them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.cli.query import add_query_commands, run_query
from corr_pipeline.db import schema
from corr_pipeline.store import MatrixStore

D1 = dt.date(2024, 3, 27)
D2 = dt.date(2024, 3, 28)
MIN_OVERLAP = 20
K = 4

#: Sorted by code point (SPEC §2), including names that break naive SQL or shell quoting.
SYMBOLS = sorted(
    [
        "AAPL",
        "BRK.B",
        "MSFT",
        "NVDA",
        "O'REILLY",
        "SPACE CO",
        "X'); DROP TABLE snapshots;--",
        "Ünïcødé",
        "日本株",
        'QUOTE"D',
    ]
)
N = len(SYMBOLS)


def _universe(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(corr float32 N x N with one NaN pair, overlap int16) of a 2-factor model."""
    rng = np.random.default_rng(seed)
    t = 60
    groups = np.array([i % 2 for i in range(N)])
    returns = rng.standard_normal((t, 2))[:, groups] + 0.8 * rng.standard_normal((t, N))
    corr = np.corrcoef(returns.T).astype(np.float32)
    overlap = np.full((N, N), t, dtype=np.int16)
    a, b = SYMBOLS.index("NVDA"), SYMBOLS.index("日本株")
    corr[a, b] = corr[b, a] = np.nan
    overlap[a, b] = overlap[b, a] = 12  # below MIN_OVERLAP
    return corr, overlap


def _neighbors(corr: np.ndarray, k: int) -> list[tuple[int, int, int, float]]:
    """(i, rank, j, corr) by brute force (SPEC §4: |corr| desc, ties to smaller j)."""
    out = []
    for i in range(corr.shape[0]):
        cand = [
            (-abs(float(corr[i, j])), j)
            for j in range(corr.shape[0])
            if j != i and np.isfinite(corr[i, j])
        ]
        for rank, (_, j) in enumerate(sorted(cand)[:k], start=1):
            out.append((i, rank, j, float(corr[i, j])))
    return out


def _publish(engine: sa.Engine, day: dt.date, seed: int, store: MatrixStore) -> dict:
    corr, overlap = _universe(seed)
    labels = [i % 2 if SYMBOLS[i] != "BRK.B" else 2 for i in range(N)]  # BRK.B alone
    neighbors = _neighbors(corr, K)
    pairs = [
        # leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap, p_value, q_value
        # (None: no significance recorded, as in a snapshot published before migration 0007)
        ("AAPL", "MSFT", 2, 0.41, 0.05, 0.36, 58, 3.2e-07, 4.1e-05),
        ("O'REILLY", "AAPL", 1, -0.33, float("nan"), 0.33, 59, 0.0011, 0.0123),
        ("AAPL", "日本株", 3, 0.30, 0.10, 0.20, 57, None, None),
        ("MSFT", "NVDA", 1, 0.25, 0.20, 0.05, 59, 0.3, 0.9),
    ]
    with engine.begin() as conn:
        conn.execute(sa.delete(schema.snapshots).where(schema.snapshots.c.snapshot_date == day))
        conn.execute(
            sa.insert(schema.snapshots).values(
                snapshot_date=day,
                as_of_trade_date=day,
                n_symbols=N,
                n_dropped=1,
                lookback_days=60,
                params={"min_overlap": MIN_OVERLAP, "min_history_days": 40, "k_neighbors": K},
            )
        )
        conn.execute(
            sa.insert(schema.peer_neighbors),
            [
                {
                    "snapshot_date": day,
                    "symbol": SYMBOLS[i],
                    "rank": rank,
                    "neighbor": SYMBOLS[j],
                    "corr": c,
                    "overlap": int(overlap[i, j]),
                }
                for i, rank, j, c in neighbors
            ],
        )
        conn.execute(
            sa.insert(schema.symbol_clusters),
            [
                {"snapshot_date": day, "symbol": s, "cluster_id": labels[i]}
                for i, s in enumerate(SYMBOLS)
            ],
        )
        conn.execute(
            sa.insert(schema.lead_lag_pairs),
            [
                dict(
                    zip(
                        (
                            "leader",
                            "lagger",
                            "lag",
                            "lagged_corr",
                            "sync_corr",
                            "improvement",
                            "overlap",
                            "p_value",
                            "q_value",
                        ),
                        p,
                        strict=True,
                    ),
                    snapshot_date=day,
                )
                for p in pairs
            ],
        )
    key = day.isoformat()
    store.save(
        q.CORR_ASSET,
        key,
        q.CORR_ARRAY,
        corr,
        labels={"symbols": SYMBOLS},
        params={"min_overlap": MIN_OVERLAP},
    )
    store.save(q.OVERLAP_ASSET, key, q.OVERLAP_ARRAY, overlap, labels={"symbols": SYMBOLS})
    return {"corr": corr, "overlap": overlap, "neighbors": neighbors, "labels": labels}


@pytest.fixture
def published(clean_db: sa.Engine, tmp_path, monkeypatch):
    """Two snapshots (D1, D2) in the database, their matrices in a store under tmp_path; a
    dropped symbol with prices only."""
    store = MatrixStore(tmp_path / "store")
    monkeypatch.setenv("CORR_PIPELINE_STORE_DIR", str(store.base_dir))
    first = _publish(clean_db, D1, seed=1, store=store)
    second = _publish(clean_db, D2, seed=2, store=store)
    with clean_db.begin() as conn:
        conn.execute(sa.insert(schema.prices).values(symbol="DROPPED", trade_date=D2, close=10.0))
    return {"engine": clean_db, "store": store, D1: first, D2: second}


# --------------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------------


def test_peers_latest_snapshot_by_default(published):
    engine, truth = published["engine"], published[D2]
    result = q.peers(engine, "AAPL")
    assert result.snapshot.snapshot_date == D2
    i = SYMBOLS.index("AAPL")
    want = [(rank, SYMBOLS[j], c) for (ii, rank, j, c) in truth["neighbors"] if ii == i]
    got = [(p["rank"], p["neighbor"], p["corr"]) for p in result.peers]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == pytest.approx([w[2] for w in want], abs=1e-7)
    assert result.cluster_id == truth["labels"][i]
    text = q.to_text(result)
    assert text.splitlines()[0].startswith("peers of AAPL in snapshot 2024-03-28")
    assert text.splitlines()[1].split() == [
        "rank",
        "neighbor",
        "corr",
        "overlap",
        "same",
        "cluster",
    ]


def test_peers_for_a_given_date_and_limit(published):
    engine, truth = published["engine"], published[D1]
    result = q.peers(engine, "MSFT", "2024-03-27", limit=2)
    assert result.snapshot.snapshot_date == D1
    i = SYMBOLS.index("MSFT")
    want = [SYMBOLS[j] for (ii, rank, j, c) in truth["neighbors"] if ii == i][:2]
    assert [p["neighbor"] for p in result.peers] == want


@pytest.mark.parametrize(
    "symbol", ["O'REILLY", "X'); DROP TABLE snapshots;--", "SPACE CO", "日本株", 'QUOTE"D']
)
def test_odd_symbols_are_bound_parameters_and_come_back_verbatim(published, symbol):
    engine = published["engine"]
    result = q.peers(engine, symbol)
    assert result.symbol == symbol and len(result.peers) == K
    payload = json.loads(json.dumps(result.to_json(), ensure_ascii=False))
    assert payload["symbol"] == symbol
    assert {p["neighbor"] for p in payload["peers"]} <= set(SYMBOLS)
    # every neighbor name is itself queryable verbatim
    for p in payload["peers"]:
        assert q.peers(engine, p["neighbor"]).symbol == p["neighbor"]
    with engine.connect() as conn:  # the "injection" did nothing
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.snapshots)).scalar() == 2


def test_peers_json_shape(published):
    data = q.peers(published["engine"], "AAPL").to_json()
    assert data["query"] == "peers" and data["snapshot_date"] == "2024-03-28"
    assert set(data["peers"][0]) == {"rank", "neighbor", "corr", "overlap", "neighbor_cluster_id"}
    # float32 values are printed as their shortest exact decimal
    c = data["peers"][0]["corr"]
    assert float(np.float32(c)) == pytest.approx(c, abs=0) or len(repr(c)) <= 12


# --------------------------------------------------------------------------------------------
# errors: unknown symbols, dates without a snapshot
# --------------------------------------------------------------------------------------------


def test_unknown_symbol_suggests_close_matches(published):
    engine = published["engine"]
    with pytest.raises(q.UnknownSymbolError) as info:
        q.peers(engine, "APPL")
    err = info.value
    assert err.exit_code == 2 and "AAPL" in err.suggestions and not err.has_prices
    assert 'unknown symbol "APPL": not in the snapshot of 2024-03-28' in str(err)
    assert 'did you mean "AAPL"' in str(err)
    with pytest.raises(q.UnknownSymbolError) as info:
        q.lead_lag(engine, "aapl")
    assert info.value.suggestions[0] == "AAPL"
    with pytest.raises(q.UnknownSymbolError) as info:
        q.cluster(engine, "ZZZZZZZZ")
    assert info.value.suggestions == []


def test_peers_say_whether_each_neighbor_shares_the_cluster(published):
    result = q.peers(published["engine"], "AAPL")
    lines = q.to_text(result).splitlines()[2:]  # past the title and the header
    same = [p["neighbor_cluster_id"] == result.cluster_id for p in result.peers]
    assert [line.split()[-1] for line in lines[-len(same) :]] == [
        "yes" if s else "no" for s in same
    ]


def test_dropped_symbol_is_told_apart(published):
    with pytest.raises(q.UnknownSymbolError) as info:
        q.peers(published["engine"], "DROPPED")
    assert info.value.has_prices
    assert "has prices but was dropped" in str(info.value)
    assert "min_history_days=40" in str(info.value)


def test_date_without_snapshot_lists_the_latest(published):
    with pytest.raises(q.SnapshotNotFoundError) as info:
        q.peers(published["engine"], "AAPL", "2024-03-30")
    err = info.value
    assert err.latest == [D2, D1] and err.nearest_earlier == D2 and err.total == 2
    assert str(err) == "no snapshot for 2024-03-30; latest snapshots: 2024-03-28, 2024-03-27"
    with pytest.raises(q.SnapshotNotFoundError) as info:
        q.cluster(published["engine"], "AAPL", "2020-01-01")
    assert "none is earlier than 2020-01-01" in str(info.value)
    assert info.value.to_json()["latest"] == ["2024-03-28", "2024-03-27"]


def test_bad_date_and_nothing_published(clean_db):
    with pytest.raises(q.QueryError, match="expected a date YYYY-MM-DD"):
        q.peers(clean_db, "AAPL", "28/03/2024")
    with pytest.raises(q.QueryError) as info:
        q.peers(clean_db, "AAPL", "2024-02-30")
    assert str(info.value) == "--date 2024-02-30: not a date (February 2024 has 29 days)"
    with pytest.raises(q.NoSnapshotError, match="no snapshot has been published yet"):
        q.peers(clean_db, "AAPL")
    assert q.to_text(q.snapshots(clean_db)) == "no snapshot has been published yet"


# --------------------------------------------------------------------------------------------
# cluster, lead-lag, snapshots
# --------------------------------------------------------------------------------------------


def test_cluster(published):
    truth = published[D2]
    result = q.cluster(published["engine"], "AAPL", members=3)
    label = truth["labels"][SYMBOLS.index("AAPL")]
    members = sorted(s for i, s in enumerate(SYMBOLS) if truth["labels"][i] == label)
    assert result.cluster_id == label and result.size == len(members)
    assert result.n_clusters == 3
    assert result.members == members[:3]
    data = result.to_json()
    assert data["members_truncated"] is True
    same = [p["neighbor"] for p in result.peers_in_cluster]
    assert all(truth["labels"][SYMBOLS.index(s)] == label for s in same)
    assert "cluster id" in q.to_text(result)
    alone = q.cluster(published["engine"], "BRK.B", members=None)
    assert (alone.size, alone.members) == (1, ["BRK.B"])


def test_lead_lag_both_roles_ordered_by_improvement(published):
    result = q.lead_lag(published["engine"], "AAPL")
    got = [(p["leader"], p["lagger"], p["lag"]) for p in result.pairs]
    assert got == [("AAPL", "MSFT", 2), ("O'REILLY", "AAPL", 1), ("AAPL", "日本株", 3)]
    assert (result.n_leads, result.n_lags) == (2, 1)
    data = result.to_json()
    assert [p["role"] for p in data["pairs"]] == ["leads", "lags", "leads"]
    assert data["pairs"][1]["sync_corr"] is None  # NaN published, null in JSON
    assert data["pairs"][0]["lagged_corr"] == 0.41
    assert "NaN" in q.to_text(result)
    top = q.lead_lag(published["engine"], "AAPL", limit=1)
    assert len(top.pairs) == 1 and (top.n_leads, top.n_lags) == (2, 1) and top.truncated
    assert "showing the 1 strongest of 3 pairs" in q.to_text(top)
    assert top.to_json()["truncated"] is True
    none = q.lead_lag(published["engine"], "SPACE CO")
    assert none.pairs == [] and "no lead-lag pair" in q.to_text(none)


def test_lead_lag_shows_the_significance(published):
    """p_value and q_value come back as published (float64, exact), print readably (``3.2e-07``,
    ``0.0123``) and as ``-`` where a pair has none (NULL, null in JSON)."""
    result = q.lead_lag(published["engine"], "AAPL")
    data = result.to_json()
    assert data["max_q"] is None and data["n_without_q"] == 0
    assert [(p["p_value"], p["q_value"]) for p in data["pairs"]] == [
        (3.2e-07, 4.1e-05),
        (0.0011, 0.0123),
        (None, None),
    ]
    lines = q.to_text(result).splitlines()
    # the reverse direction's four columns follow (this snapshot did not record it: unknown)
    assert lines[1].split()[-6:-4] == ["p_value", "q_value"]
    assert lines[2].split()[-6:-4] == ["3.2e-07", "4.1e-05"]
    assert lines[3].split()[-6:-4] == ["0.0011", "0.0123"]
    assert lines[4].split()[-6:-4] == ["-", "-"]
    assert "Benjamini–Hochberg" in q.to_text(result)


def test_lead_lag_max_q_keeps_the_pairs_at_most_q(published):
    """``max_q``: only pairs with q_value <= max_q (the bound included), counted and listed;
    a pair without a q-value never passes and is reported as left out."""
    engine = published["engine"]
    result = q.lead_lag(engine, "AAPL", max_q=0.05)
    assert [(p["leader"], p["lagger"]) for p in result.pairs] == [
        ("AAPL", "MSFT"),
        ("O'REILLY", "AAPL"),
    ]
    assert (result.n_leads, result.n_lags, result.n_without_q) == (1, 1, 1)
    assert not result.truncated
    data = result.to_json()
    assert data["max_q"] == 0.05 and data["n_without_q"] == 1
    text = q.to_text(result)
    assert "leads 1, lags 1 with q_value <= 0.05" in text
    assert "(1 pair(s) without a q-value left out)" in text
    edge = q.lead_lag(engine, "AAPL", max_q=0.0123)
    assert [p["q_value"] for p in edge.pairs] == [4.1e-05, 0.0123]
    strict = q.lead_lag(engine, "AAPL", max_q=0.001, limit=5)
    assert [p["lagger"] for p in strict.pairs] == ["MSFT"]
    assert (strict.n_leads, strict.n_lags) == (1, 0)
    top = q.lead_lag(engine, "AAPL", max_q=0.05, limit=1)
    assert top.truncated and "showing the 1 strongest of 2 pairs" in q.to_text(top)
    everything = q.lead_lag(engine, "AAPL", max_q=1.0)
    assert len(everything.pairs) == 2  # 1 still leaves out the pair without a q-value
    nothing = q.lead_lag(engine, "MSFT", max_q=1e-9)
    assert nothing.pairs == [] and (nothing.n_leads, nothing.n_lags) == (0, 0)
    assert "(no lead-lag pair with q_value <= 1e-09 involves this symbol)" in q.to_text(nothing)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_lead_lag_max_q_must_lie_in_zero_one(published, bad):
    with pytest.raises(
        q.QueryError, match=r"out of range: a q-value bound Q must satisfy 0 < Q <= 1"
    ):
        q.lead_lag(published["engine"], "AAPL", max_q=bad)


def test_snapshots_listing(published):
    result = q.snapshots(published["engine"])
    assert [s.snapshot_date for s in result.snapshots] == [D2, D1] and result.total == 2
    assert q.to_text(result).splitlines()[0] == "2 snapshot(s) published"


# --------------------------------------------------------------------------------------------
# corr from the memory-mapped matrix
# --------------------------------------------------------------------------------------------


def test_corr_reads_one_element_of_the_stored_matrix(published):
    truth = published[D1]
    a, b = "AAPL", "O'REILLY"
    result = q.corr(published["engine"], a, b, "2024-03-27", store=published["store"])
    ia, ib = SYMBOLS.index(a), SYMBOLS.index(b)
    assert result.corr == float(truth["corr"][ia, ib])
    assert result.overlap == int(truth["overlap"][ia, ib]) and result.published
    assert (result.index_a, result.index_b) == (ia, ib)
    assert result.to_json()["corr"] == float(str(truth["corr"][ia, ib]))
    # default store from $CORR_PIPELINE_STORE_DIR and latest date
    latest = q.corr(published["engine"], b, a)
    assert latest.snapshot_date == D2
    assert latest.corr == float(published[D2]["corr"][ib, ia])


def test_corr_nan_is_explained(published):
    result = q.corr(published["engine"], "NVDA", "日本株")
    assert np.isnan(result.corr) and result.overlap == 12
    assert result.reason == f"only 12 common returns, fewer than min_overlap={MIN_OVERLAP}"
    data = result.to_json()
    assert data["corr"] is None and data["undefined_reason"].startswith("only 12")


def test_corr_of_a_dropped_symbol_says_it_was_dropped(published):
    """Like peers and cluster: a symbol with prices that the window dropped is told apart from
    an unknown one, not offered look-alikes as if it were a typo."""
    with pytest.raises(q.UnknownSymbolError) as info:
        q.corr(published["engine"], "AAPL", "DROPPED")
    assert info.value.has_prices and "has prices but was dropped" in str(info.value)
    assert "min_history_days=40" in str(info.value)


def test_corr_errors(published, tmp_path):
    engine = published["engine"]
    with pytest.raises(q.UnknownSymbolError) as info:
        q.corr(engine, "AAPL", "MSTF")
    assert "MSFT" in info.value.suggestions
    with pytest.raises(q.SnapshotNotFoundError):
        q.corr(engine, "AAPL", "MSFT", "2024-01-02")
    empty = MatrixStore(tmp_path / "other_store")
    with pytest.raises(q.MatrixUnavailableError, match="not in the matrix store"):
        q.corr(engine, "AAPL", "MSFT", store=empty)


def test_corr_from_the_store_alone_and_unpublished_dates(published):
    engine, store = published["engine"], published["store"]
    result = q.corr_from_store(store, "AAPL", "MSFT")
    assert result.snapshot_date == D2 and not result.published
    corr, overlap = _universe(3)
    store.save(q.CORR_ASSET, "2024-03-29", q.CORR_ARRAY, corr, labels={"symbols": SYMBOLS})
    unpublished = q.corr(engine, "AAPL", "MSFT", "2024-03-29")
    assert not unpublished.published and "not published" in q.to_text(unpublished)
    assert unpublished.overlap is None  # no overlap matrix stored for that date
    with pytest.raises(q.SnapshotNotFoundError):
        q.corr_from_store(store, "AAPL", "MSFT", "2024-04-01")


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def _parser(engine: sa.Engine) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corr-pipeline")
    add_query_commands(
        parser.add_subparsers(dest="command", required=True), engine_factory=lambda: engine
    )
    return parser


def _run(engine: sa.Engine, argv: list[str], capsys) -> tuple[int, str, str]:
    args = _parser(engine).parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_tables_and_json(published, capsys):
    engine = published["engine"]
    code, out, err = _run(engine, ["query", "peers", "O'REILLY"], capsys)
    assert code == 0 and err == ""
    assert out.splitlines()[0].startswith("peers of O'REILLY in snapshot 2024-03-28")
    code, out, _ = _run(
        engine, ["query", "peers", "O'REILLY", "--json", "--date", "2024-03-27"], capsys
    )
    data = json.loads(out)
    assert code == 0 and data["symbol"] == "O'REILLY" and data["snapshot_date"] == "2024-03-27"
    for argv in (
        ["query", "cluster", "日本株", "--json"],
        ["query", "lead-lag", "AAPL", "--json"],
        ["query", "corr", "AAPL", "MSFT", "--json"],
        ["query", "snapshots", "--json"],
    ):
        code, out, _ = _run(engine, argv, capsys)
        assert code == 0 and json.loads(out)["query"] == argv[1]


def test_cli_errors_exit_2_with_message_and_json(published, capsys):
    engine = published["engine"]
    code, out, err = _run(engine, ["query", "peers", "APPL"], capsys)
    assert code == 2 and out == ""
    assert err.startswith('corr-pipeline query: unknown symbol "APPL"') and "AAPL" in err
    code, out, err = _run(
        engine, ["query", "lead-lag", "AAPL", "--date", "2024-03-30", "--json"], capsys
    )
    assert code == 2
    error = json.loads(out)["error"]
    assert error["type"] == "snapshot_not_found" and error["latest"] == ["2024-03-28", "2024-03-27"]
    assert "no snapshot for 2024-03-30" in err


def test_cli_lead_lag_max_q(published, capsys):
    """``query lead-lag --max-q Q`` filters by q-value; a Q outside (0, 1] or not a number is
    refused in one line saying the valid range (exit status 2), before the database is
    opened."""
    engine = published["engine"]
    code, out, err = _run(engine, ["query", "lead-lag", "AAPL", "--max-q", "0.01"], capsys)
    assert code == 0 and err == ""
    assert "leads 1, lags 0 with q_value <= 0.01" in out and "3.2e-07" in out
    code, out, _ = _run(engine, ["query", "lead-lag", "AAPL", "--max-q", "5e-2", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["max_q"] == 0.05
    assert [p["q_value"] for p in data["pairs"]] == [4.1e-05, 0.0123]
    for bad, what in (
        ("0", "out of range"),
        ("1.01", "out of range"),
        ("-0.5", "out of range"),
        ("nan", "out of range"),
        ("q", "not a number"),
    ):
        args = _parser(engine).parse_args(["query", "lead-lag", "AAPL", "--max-q", bad])
        code = run_query(args, engine_factory=_never_opened)
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        shown = bad if what == "out of range" else f'"{bad}"'
        assert err == (
            f"corr-pipeline query: --max-q {shown}: {what}: a q-value bound Q must satisfy "
            "0 < Q <= 1\n"
        )


def _never_opened() -> sa.Engine:
    raise AssertionError("the database was opened for an argument refused beforehand")


def test_format_table_aligns_wide_characters():
    table = q.format_table(["name", "x"], [["日本株", 1], ["AB", 22], ["a\nb", 3]], "lr")
    lines = table.splitlines()
    assert lines == ["name     x", "日本株   1", "AB      22", "a\\nb     3"]


def test_installed_command_end_to_end(published):
    """The real ``corr-pipeline`` entry point in a subprocess (same database and store)."""
    from corr_pipeline import cli

    if "query" not in cli.build_parser()._subparsers._group_actions[0].choices:  # noqa: SLF001
        pytest.skip("corr-pipeline has no query command registered yet")
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "corr_pipeline.cli", "query"]
    ok = subprocess.run(
        [*cmd, "peers", "X'); DROP TABLE snapshots;--", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["symbol"] == "X'); DROP TABLE snapshots;--"
    bad = subprocess.run(
        [*cmd, "cluster", "MSFTT"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert 'unknown symbol "MSFTT"' in bad.stderr and '"MSFT"' in bad.stderr


def test_close_matches_scores_equal_difflib():
    """The bounded search returns the same top scores as difflib.get_close_matches."""
    import difflib
    import random

    rng = random.Random(0)
    for _ in range(300):
        names = sorted(
            {"".join(rng.choice("ABCDE") for _ in range(rng.randint(1, 5))) for _ in range(200)}
        )
        word = "".join(rng.choice("ABCDEX") for _ in range(rng.randint(1, 5)))

        def score(name: str, word: str = word) -> float:
            return difflib.SequenceMatcher(None, name, word).ratio()

        got = q.close_matches(word, names, n=5)
        want = difflib.get_close_matches(word, names, n=5)
        assert [score(x) for x in got] == sorted((score(x) for x in want), reverse=True)
    # ties prefer the longer common prefix (a typo at the end of a ticker)
    names = [f"Z{i:05d}" for i in range(3000)]
    assert q.close_matches("Z0234X", names)[:3] == ["Z02340", "Z02341", "Z02342"]
