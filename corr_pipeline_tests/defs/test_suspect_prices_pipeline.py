"""Suspect prices through a real Dagster run (SPEC §2): ``returns_matrix`` reports how many
symbols are suspect (an integer the UI plots) and lists them with both figures; the snapshot
publishes them, and ``corr-pipeline query quality`` answers for the published date, in text
and JSON, with the figures of a brute-force reference. ``drop_suspect`` removes them from the
universe with that reason; a threshold out of range stops the run before anything runs."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from corr_pipeline.cli.query import add_query_commands
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.run import SnapshotRunSummary
from corr_pipeline.snapshot import display
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.fixtures.deployment import resources_at
from corr_pipeline_tests.fixtures.suspect_prices import (
    DAYS,
    GOOD,
    price_error_prices,
    reference_figures,
    stale_prices,
)
from corr_pipeline_tests.reliability import helpers as h

DAY = DAYS[-1].isoformat()  # 2026-11-27, a session


@pytest.fixture
def universe(clean_db: sa.Engine):
    rows = h.factor_prices(GOOD, DAYS, seed=11)
    rows += stale_prices("STALE", n_zero=12, seed=1) + price_error_prices("JUMP", seed=2)
    h.insert_prices(clean_db, rows)
    return clean_db, reference_figures(rows)


def _query(engine: sa.Engine, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="corr-pipeline")
    add_query_commands(
        parser.add_subparsers(dest="command", required=True), engine_factory=lambda: engine
    )
    args = parser.parse_args(["query", "quality", *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = args.func(args)
    return code, out.getvalue()


def _published_symbols(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT symbol FROM symbol_clusters WHERE snapshot_date = :d ORDER BY 1"),
                {"d": DAYS[-1]},
            ).scalars()
        )


def test_suspects_are_reported_published_and_queried(universe, tmp_path: Path):
    engine, ref = universe
    result = h.materialize(tmp_path / "store", DAY)
    assert result.success, h.failure_messages(result)
    (window,) = materializations(result, "returns_matrix")
    shown = window.metadata
    assert isinstance(shown["n_suspect_symbols"], dg.IntMetadataValue)
    assert shown["n_suspect_symbols"].value == 2
    assert shown["n_dropped_suspect_prices"].value == 0
    table = shown["suspect_symbols"].value.splitlines()
    assert table[0] == "| symbol | zero-return share | max abs return | reason | universe |"
    # cells between unescaped pipes (a reason's "|log return|" is escaped)
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table[2:]]
    assert [c[0] for c in cells] == ["JUMP", "STALE"]
    for c in cells:
        share, largest = ref[c[0]]
        assert c[1] == display.figure_text(share) and c[2] == display.figure_text(largest)
        assert c[4] == "kept"
    assert "stale closes" in cells[1][3] and "price error" in cells[0][3]
    assert _published_symbols(engine) == sorted([*GOOD, "JUMP", "STALE"])

    code, text = _query(engine, "--date", DAY)
    lines = text.splitlines()
    assert code == 0
    assert lines[0].startswith(f"suspect prices in snapshot {DAY}")
    assert "zero-return share > 0.25" in lines[1] and "largest |log return| > 0.5" in lines[1]
    assert "(drop_suspect=false)" in lines[1]
    assert lines[2] == "2 suspect symbol(s):"
    jump = next(line for line in lines if line.startswith("JUMP"))
    assert display.figure_text(ref["JUMP"][1]) in jump and "kept" in jump

    code, out = _query(engine, "--json")
    answer = json.loads(out)
    assert code == 0 and answer["query"] == "quality" and answer["snapshot_date"] == DAY
    assert (answer["max_zero_return_share"], answer["max_abs_return"]) == (0.25, 0.5)
    assert answer["drop_suspect"] is False and answer["n_suspect"] == 2
    for suspect in answer["suspects"]:
        share, largest = ref[suspect["symbol"]]
        assert suspect["zero_return_share"] == share
        assert suspect["max_abs_return"] == pytest.approx(largest, rel=1e-7, abs=0)
        assert suspect["dropped"] is False

    # drop_suspect: the same two, out of the universe, with their reason
    again = h.materialize(tmp_path / "store", DAY, drop_suspect=True)
    assert again.success, h.failure_messages(again)
    (window,) = materializations(again, "returns_matrix")
    assert window.metadata["n_suspect_symbols"].value == 2
    assert window.metadata["n_dropped_suspect_prices"].value == 2
    dropped = window.metadata["dropped_symbols"].value
    assert "JUMP" in dropped and "STALE" in dropped and "suspect prices" in dropped
    assert _published_symbols(engine) == GOOD
    code, out = _query(engine, "--json")
    answer = json.loads(out)
    assert answer["drop_suspect"] is True
    assert [(s["symbol"], s["dropped"]) for s in answer["suspects"]] == [
        ("JUMP", True),
        ("STALE", True),
    ]
    code, text = _query(engine)
    assert "suspect symbols dropped from the universe (drop_suspect=true)" in text

    # a snapshot published before the screen was recorded: said, never "no suspect"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE snapshots SET params = params - 'max_zero_return_share' "
                "- 'max_abs_return' - 'drop_suspect'"
            )
        )
        conn.execute(sa.text("DELETE FROM suspect_prices"))
    code, text = _query(engine, "--date", DAY)
    assert code == 2 and "was published before its suspect prices were recorded" in text


def test_clean_prices_have_no_suspect(clean_db: sa.Engine, tmp_path: Path):
    h.insert_prices(clean_db, h.factor_prices(GOOD, DAYS, seed=11))
    result = h.materialize(tmp_path / "store", DAY)
    assert result.success, h.failure_messages(result)
    (window,) = materializations(result, "returns_matrix")
    assert window.metadata["n_suspect_symbols"].value == 0
    assert window.metadata["suspect_symbols"].value == "_no suspect prices_"
    code, text = _query(clean_db)
    assert code == 0 and "no suspect prices: every symbol's zero-return share is at most" in text


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"max_zero_return_share": 0.0}, "max_zero_return_share must lie in (0, 1]"),
        ({"max_abs_return": -0.5}, "max_abs_return must be a finite number > 0"),
    ],
)
def test_a_threshold_out_of_range_stops_the_run_before_anything_runs(
    universe, tmp_path: Path, config, says
):
    engine, _ = universe
    result = dg.materialize(
        snapshot_assets,
        partition_key=DAY,
        resources={**resources_at(tmp_path), "snapshot_params": SnapshotParams()},
        run_config={"resources": {"snapshot_params": {"config": config}}},
        raise_on_error=False,
    )
    assert not result.success
    errors = " ".join(
        str(e.event_specific_data)
        for e in result.all_events
        if e.event_type_value in ("RESOURCE_INIT_FAILURE", "STEP_FAILURE")
    )
    assert says in errors
    assert not materializations(result, "returns_matrix")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM snapshots")).scalar_one() == 0


def test_run_summary_counts_the_suspect_symbols(tmp_path: Path):
    """The demo's summary line of the window says how many symbols are suspect ('?' when the
    run did not record it)."""
    summary = SnapshotRunSummary(DAY, "run", True, tmp_path, tmp_path)
    summary.metadata["returns_matrix"] = {"n_symbols": 2811, "n_dropped": 189, "bad_prices": 6}
    assert "6 bad prices in the window, ? suspect symbols" in str(summary)
    summary.metadata["returns_matrix"]["n_suspect_symbols"] = 4
    assert "2811 symbols kept, 189 dropped, 6 bad prices in the window, 4 suspect symbols" in str(
        summary
    )
