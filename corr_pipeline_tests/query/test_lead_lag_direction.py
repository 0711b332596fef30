"""The direction of lead-lag pairs (SPEC §6 "Direction") through publication and the query:
``corr-pipeline query lead-lag`` shows each pair's reverse pair and whether it is two-way (at
``--max-q`` when given, else the snapshot's ``max_q_value``), ``--one-way`` keeps the pairs
known to be one-way, and the pairs of a snapshot published before the direction was recorded
(NULL reverse) are of unknown direction, never one-way.

The new snapshot goes through :func:`corr_pipeline.db.publish.publish_snapshot` into the real
PostgreSQL; the old one is inserted as a database at revision 0007 held it (no reverse columns
filled, no ``max_q_value`` in its params).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import query as q
from corr_pipeline.cli.query import add_query_commands
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.db import schema
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.query.published import consistent_read, direction_recorded
from corr_pipeline.snapshot.results import SnapshotResults

OLD, NEW = dt.date(2024, 3, 27), dt.date(2024, 3, 28)
SYMBOLS = ["AAA", "BBB", "CCC", "DDD", "O'REILLY"]
NAN = float("nan")

#: leader, lagger, lag, lagged_corr, improvement, q_value, and the reverse pair's lag,
#: lagged_corr and q-value (0 / NaN: it has no best lag); by improvement, as published
PAIRS = [
    ("AAA", "BBB", 1, 0.5, 0.4, 1e-6, 2, -0.3, 0.004),  # two-way at 0.05
    ("CCC", "AAA", 2, -0.4, 0.3, 1e-3, 1, 0.2, 0.3),  # one-way at 0.05, two-way at 0.5
    ("AAA", "DDD", 3, 0.3, 0.2, 0.01, 0, NAN, NAN),  # one-way: no reverse best lag
    ("BBB", "AAA", 2, -0.3, 0.1, 0.004, 1, 0.5, 1e-6),  # two-way (the reverse of the first)
    ("AAA", "O'REILLY", 1, 0.2, 0.05, 0.05, 1, 0.1, 0.05),  # two-way: the bound is included
]


def _pairs() -> np.ndarray:
    out = np.zeros(len(PAIRS), LEAD_LAG_DTYPE)
    for row, (a, b, lag, corr, imp, qv, back, back_corr, back_q) in zip(out, PAIRS, strict=True):
        row["leader"], row["lagger"], row["lag"] = SYMBOLS.index(a), SYMBOLS.index(b), lag
        row["lagged_corr"], row["sync_corr"], row["improvement"] = corr, 0.1, imp
        row["overlap"], row["p_value"], row["q_value"] = 50, qv / 10, qv
        row["reverse_lag"], row["reverse_lagged_corr"], row["reverse_q_value"] = (
            back,
            back_corr,
            back_q,
        )
    return out


@pytest.fixture
def engine(clean_db: sa.Engine) -> sa.Engine:
    """NEW published by the pipeline's publication (max_q_value 0.05); OLD as a snapshot
    published before schema revision 0008 left it: the same pairs, their reverse NULL."""
    n = len(SYMBOLS)
    publish_snapshot(
        clean_db,
        SnapshotResults(
            snapshot_date=NEW,
            as_of_trade_date=NEW,
            symbols=SYMBOLS,
            n_dropped=0,
            lookback_days=60,
            params={"max_q_value": 0.05, "lead_lag_market_modes": 1},
            neighbor_index=np.array([[(i + 1) % n] for i in range(n)], np.int32),
            neighbor_corr=np.full((n, 1), 0.5, np.float32),
            neighbor_overlap=np.full((n, 1), 50, np.int32),
            cluster_labels=np.zeros(n, np.int32),
            lead_lag_pairs=_pairs(),
        ),
    )
    with clean_db.begin() as conn:
        conn.execute(
            sa.insert(schema.snapshots).values(
                snapshot_date=OLD, as_of_trade_date=OLD, n_symbols=n, n_dropped=0, lookback_days=60
            )
        )
        conn.execute(
            sa.insert(schema.symbol_clusters),
            [{"snapshot_date": OLD, "symbol": s, "cluster_id": 0} for s in SYMBOLS],
        )
        conn.execute(
            sa.insert(schema.lead_lag_pairs),
            [
                {
                    "snapshot_date": OLD,
                    "leader": a,
                    "lagger": b,
                    "lag": lag,
                    "lagged_corr": corr,
                    "sync_corr": 0.1,
                    "improvement": imp,
                    "overlap": 50,
                    "p_value": qv / 10,
                    "q_value": qv,
                }
                for a, b, lag, corr, imp, qv, *_ in PAIRS
            ],
        )
    return clean_db


def _run(engine: sa.Engine, argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="corr-pipeline")
    add_query_commands(
        parser.add_subparsers(dest="command", required=True), engine_factory=lambda: engine
    )
    args = parser.parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    assert err == ""
    return code, out


def _cells(text: str) -> dict[tuple[str, str], list[str]]:
    """The table rows of ``query lead-lag``'s text by (leader, lagger): the cells after
    ``q_value`` (rev_lag, rev_corr, rev_q, direction; split on runs of two spaces)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("role"))
    out = {}
    for line in lines[header + 1 :]:
        if not line.startswith(("leads", "lags")):
            break
        cells = [c for c in line.split("  ") if c.strip()]
        out[cells[1].strip(), cells[2].strip()] = [c.strip() for c in cells[-4:]]
    return out


def test_pairs_carry_the_reverse_direction_at_the_snapshots_max_q_value(engine):
    """Without --max-q, two-way means reverse q <= the snapshot's max_q_value (0.05, the bound
    included); the reverse pair's lag, correlation (float32, shortest decimal) and q-value come
    back as published, null where it has no best lag (then one-way, not unknown)."""
    result = q.lead_lag(engine, "AAA")
    assert result.snapshot.snapshot_date == NEW
    assert result.direction_recorded and result.two_way_max_q == 0.05
    data = result.to_json()
    assert (data["two_way_max_q"], data["one_way"], data["direction_recorded"]) == (
        0.05,
        False,
        True,
    )
    got = [
        (
            p["leader"],
            p["lagger"],
            p["reverse_lag"],
            p["reverse_lagged_corr"],
            p["reverse_q_value"],
            p["two_way"],
        )
        for p in data["pairs"]
    ]
    assert got == [
        ("AAA", "BBB", 2, -0.3, 0.004, True),
        ("CCC", "AAA", 1, 0.2, 0.3, False),
        ("AAA", "DDD", None, None, None, False),
        ("BBB", "AAA", 1, 0.5, 1e-6, True),
        ("AAA", "O'REILLY", 1, 0.1, 0.05, True),
    ]
    assert (data["n_leads"], data["n_lags"], data["n_two_way"]) == (3, 2, 3)
    assert data["n_unknown_direction"] == 0

    text = q.to_text(result)
    assert "leads 3, lags 2, 3 two-way" in text.splitlines()[0]
    assert text.splitlines()[1].split()[-4:] == ["rev_lag", "rev_corr", "rev_q", "direction"]
    assert _cells(text) == {
        ("AAA", "BBB"): ["2", "-0.3000", "0.0040", "⇄ two-way"],
        ("CCC", "AAA"): ["1", "+0.2000", "0.3000", "one-way"],
        ("AAA", "DDD"): ["-", "-", "-", "one-way"],
        ("BBB", "AAA"): ["1", "+0.5000", "1.0e-06", "⇄ two-way"],
        ("AAA", "O'REILLY"): ["1", "+0.1000", "0.0500", "⇄ two-way"],
    }
    assert "⇄ two-way: rev_q <= 0.05, the snapshot's max_q_value" in text
    assert "unknown" not in text


def test_max_q_is_also_the_threshold_of_two_way(engine):
    """--max-q Q filters the pairs by their own q-value and judges the reverse at Q."""
    loose = q.lead_lag(engine, "AAA", max_q=0.5)
    assert loose.two_way_max_q == 0.5
    assert [loose.two_way(p) for p in loose.pairs] == [True, True, False, True, True]
    assert "rev_q <= 0.5, --max-q" in q.to_text(loose)
    strict = q.lead_lag(engine, "AAA", max_q=0.004)
    assert [(p["leader"], p["lagger"], strict.two_way(p)) for p in strict.pairs] == [
        ("AAA", "BBB", True),
        ("CCC", "AAA", False),
        ("BBB", "AAA", True),
    ]
    assert strict.n_two_way == 2


def test_one_way_keeps_the_pairs_whose_reverse_is_not_significant(engine):
    """--one-way: the reverse q-value above the threshold, or no reverse best lag; counted
    among the one-way pairs only."""
    result = q.lead_lag(engine, "AAA", one_way=True)
    assert [(p["leader"], p["lagger"]) for p in result.pairs] == [("CCC", "AAA"), ("AAA", "DDD")]
    assert (result.n_leads, result.n_lags, result.n_two_way) == (1, 1, 0)
    assert not result.truncated and result.to_json()["one_way"] is True
    assert "leads 1, lags 1 with a one-way direction" in q.to_text(result)
    both = q.lead_lag(engine, "AAA", one_way=True, max_q=0.5)
    assert [(p["leader"], p["lagger"]) for p in both.pairs] == [("AAA", "DDD")]
    assert "with q_value <= 0.5 and a one-way direction" in q.to_text(both)
    top = q.lead_lag(engine, "AAA", one_way=True, limit=1)
    assert top.truncated and "showing the 1 strongest of 2 pairs" in q.to_text(top)
    none = q.lead_lag(engine, "BBB", one_way=True)
    assert none.pairs == []
    assert "(no lead-lag pair with a one-way direction involves this symbol)" in q.to_text(none)


def test_an_old_snapshots_direction_is_unknown_never_one_way(engine):
    """A snapshot published before the direction was recorded: every pair's two_way is null
    (JSON) and ``unknown`` (text), the threshold the default 1 (no max_q_value recorded); with
    --one-way nothing passes and the pairs left out are counted and explained."""
    result = q.lead_lag(engine, "AAA", OLD)
    assert not result.direction_recorded and result.two_way_max_q == 1.0
    data = result.to_json()
    assert [p["two_way"] for p in data["pairs"]] == [None] * 5
    assert {p["reverse_lag"] for p in data["pairs"]} == {None}
    assert data["n_two_way"] == 0
    text = q.to_text(result)
    assert set(map(tuple, _cells(text).values())) == {("?", "?", "?", "unknown")}
    assert "one-way" not in text
    assert "published before the reverse direction was recorded" in text

    one_way = q.lead_lag(engine, "AAA", OLD, one_way=True)
    assert one_way.pairs == [] and (one_way.n_leads, one_way.n_lags) == (0, 0)
    assert one_way.n_unknown_direction == 5
    assert "(5 pair(s) of unknown direction left out" in q.to_text(one_way)


def test_direction_recorded_per_snapshot(engine):
    with consistent_read(engine) as conn:
        assert direction_recorded(conn, NEW)
        assert not direction_recorded(conn, OLD)
        assert not direction_recorded(conn, dt.date(2024, 1, 2))  # no pairs at all


def test_cli_one_way_and_json(engine, capsys):
    """``query lead-lag SYMBOL --one-way [--max-q Q] [--json]``."""
    code, out = _run(engine, ["query", "lead-lag", "AAA", "--one-way"], capsys)
    assert code == 0 and "leads 1, lags 1 with a one-way direction" in out
    assert "⇄" not in out.split("\n(")[0]  # no two-way row
    code, out = _run(engine, ["query", "lead-lag", "AAA", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and [p["two_way"] for p in data["pairs"]] == [True, False, False, True, True]
    assert data["pairs"][0]["reverse_lagged_corr"] == -0.3
    code, out = _run(
        engine, ["query", "lead-lag", "AAA", "--one-way", "--max-q", "0.5", "--json"], capsys
    )
    data = json.loads(out)
    assert (data["one_way"], data["max_q"], data["two_way_max_q"]) == (True, 0.5, 0.5)
    assert [(p["leader"], p["lagger"], p["two_way"]) for p in data["pairs"]] == [
        ("AAA", "DDD", False)
    ]
    code, out = _run(
        engine, ["query", "lead-lag", "AAA", "--date", OLD.isoformat(), "--json"], capsys
    )
    data = json.loads(out)
    assert data["direction_recorded"] is False
    assert all(p["two_way"] is None for p in data["pairs"])
