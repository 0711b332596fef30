"""The lead_lag_pairs asset's metadata: how many pairs are significant at the snapshot's
max_q_value, at q <= 0.05 and q <= 0.01 (SPEC §6 "Significance") and how many are two-way
(SPEC §6 "Direction"), as integers the UI plots across partitions, beside the quant metrics; the
strongest pairs' preview marking the two-way ones; and the run summary the demo prints, which
reads them back."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.defs import metadata
from corr_pipeline.defs.run import SnapshotRunSummary
from corr_pipeline.snapshot.measure import StageStats


def _pairs(q_values: list[float]) -> np.ndarray:
    pairs = np.zeros(len(q_values), LEAD_LAG_DTYPE)
    pairs["leader"] = np.arange(len(q_values))
    pairs["lagger"] = (pairs["leader"] + 1) % max(2, len(q_values))
    pairs["lag"] = 1
    pairs["improvement"] = np.linspace(0.5, 0.1, len(q_values))
    pairs["q_value"] = q_values
    pairs["p_value"] = np.asarray(q_values) / 10
    return pairs


def test_significant_pairs_count_q_at_most_each_level() -> None:
    """q exactly at a level counts (``<=``); NaN (no q-value) never counts."""
    q = [1e-12, 0.001, 0.01, np.nextafter(0.01, 1), 0.03, 0.05, np.nextafter(0.05, 1), 0.5, np.nan]
    shown = metadata.lead_lag(_pairs(q), [f"S{i}" for i in range(len(q))], StageStats())
    assert isinstance(shown["significant_pairs_q05"], dg.IntMetadataValue)
    assert isinstance(shown["significant_pairs_q01"], dg.IntMetadataValue)
    assert shown["significant_pairs_q05"].value == 6
    assert shown["significant_pairs_q01"].value == 3
    assert shown["n_pairs"].value == len(q)
    # with the quant metrics, ahead of the stage's housekeeping (time, memory)
    keys = list(shown)
    assert keys.index("significant_pairs_q01") < keys.index("stage_seconds")
    assert keys[:6] == [
        "n_pairs",
        "significant_pairs",
        "two_way_pairs",
        "max_q_value",
        "significant_pairs_q05",
        "significant_pairs_q01",
    ]
    # the default threshold is 1: every pair with a q-value is significant
    assert shown["significant_pairs"].value == len(q) - 1
    assert shown["max_q_value"].value == 1.0
    assert metadata.significant_pairs(_pairs(q)) == {
        "significant_pairs_q05": 6,
        "significant_pairs_q01": 3,
    }


def test_no_pairs_none_significant() -> None:
    shown = metadata.lead_lag(np.zeros(0, LEAD_LAG_DTYPE), [], StageStats(), max_q_value=0.05)
    assert shown["significant_pairs_q05"].value == shown["significant_pairs_q01"].value == 0
    assert shown["significant_pairs"].value == shown["two_way_pairs"].value == 0


def test_significant_and_two_way_pairs_at_the_snapshots_max_q_value() -> None:
    """``significant_pairs``: q <= max_q_value; ``two_way_pairs``: the reverse pair has a best
    lag whose q-value is <= max_q_value (the bound included; a reverse_lag of 0 never counts);
    the preview's ``⇄ two-way`` column marks the same pairs with the reverse lag and q-value."""
    pairs = _pairs([1e-9, 1e-4, 0.01, 0.05, 0.2])
    pairs["reverse_lag"] = [2, 1, 0, 3, 1]
    pairs["reverse_lagged_corr"] = [-0.3, 0.2, np.nan, 0.1, 0.4]
    pairs["reverse_q_value"] = [0.004, np.nextafter(0.05, 1), np.nan, 0.05, 1e-3]
    symbols = ["A", "B", "C", "D", "E"]
    shown = metadata.lead_lag(pairs, symbols, StageStats(), max_q_value=0.05)
    assert isinstance(shown["two_way_pairs"], dg.IntMetadataValue)
    assert shown["significant_pairs"].value == 4
    assert shown["two_way_pairs"].value == 3  # rows 0, 3 and 4 (4's own q is 0.2)
    assert shown["max_q_value"].value == 0.05
    table = shown["strongest_pairs"].value.splitlines()
    assert table[0].endswith("| ⇄ two-way |")
    marks = [line.rsplit("|", 2)[1].strip() for line in table[2:]]
    assert marks == ["⇄ 2d, q 0.0040", "", "", "⇄ 3d, q 0.0500", "⇄ 1d, q 0.0010"]
    loose = metadata.lead_lag(pairs, symbols, StageStats(), max_q_value=1.0)
    assert (loose["significant_pairs"].value, loose["two_way_pairs"].value) == (5, 4)


def test_run_summary_names_the_significant_and_two_way_pairs(tmp_path: Path) -> None:
    """The demo's summary line: '<n> lead-lag pairs, <s> significant at q ≤ <max_q_value>,
    <w> two-way', from the lead_lag_pairs materialization's metadata; '?' for what the run did
    not record."""
    summary = SnapshotRunSummary("2026-11-27", "run", True, tmp_path, tmp_path)
    summary.metadata["lead_lag_pairs"] = {
        "n_pairs": 48606,
        "significant_pairs": 15,
        "two_way_pairs": 3,
        "max_q_value": 0.05,
    }
    assert "48606 lead-lag pairs, 15 significant at q ≤ 0.05, 3 two-way" in str(summary)
    summary.metadata["lead_lag_pairs"] = {"n_pairs": 12}
    assert "12 lead-lag pairs, ? significant at q ≤ ?, ? two-way" in str(summary)
