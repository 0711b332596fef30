"""The lead_lag_pairs asset's metadata: how many pairs are significant at q <= 0.05 and
q <= 0.01 (SPEC §6 "Significance"), as integers the UI plots across partitions, beside the
quant metrics; and the run summary the demo prints, which reads them back."""

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
    assert keys[:3] == ["n_pairs", "significant_pairs_q05", "significant_pairs_q01"]
    assert metadata.significant_pairs(_pairs(q)) == {
        "significant_pairs_q05": 6,
        "significant_pairs_q01": 3,
    }


def test_no_pairs_none_significant() -> None:
    shown = metadata.lead_lag(np.zeros(0, LEAD_LAG_DTYPE), [], StageStats())
    assert shown["significant_pairs_q05"].value == shown["significant_pairs_q01"].value == 0


def test_run_summary_names_the_significant_pairs(tmp_path: Path) -> None:
    """The demo's summary line: '<n> lead-lag pairs, <k> significant at q ≤ 0.05', from the
    lead_lag_pairs materialization's metadata; '?' when the run recorded none."""
    summary = SnapshotRunSummary("2026-11-27", "run", True, tmp_path, tmp_path)
    summary.metadata["lead_lag_pairs"] = {"n_pairs": 48606, "significant_pairs_q05": 15}
    assert "48606 lead-lag pairs, 15 significant at q ≤ 0.05" in str(summary)
    summary.metadata["lead_lag_pairs"] = {"n_pairs": 12}
    assert "12 lead-lag pairs, ? significant at q ≤ 0.05" in str(summary)
