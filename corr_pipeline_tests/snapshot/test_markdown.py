"""The markdown previews: symbols are escaped so they show verbatim and cannot break a table."""

from __future__ import annotations

import numpy as np

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.snapshot import markdown


def test_lead_lag_markdown_table_escapes_symbols():
    symbols = ["A|B", "*C*", "D"]
    pairs = np.zeros(1, dtype=LEAD_LAG_DTYPE)
    pairs[0] = (0, 1, 2, 0.5, np.nan, 0.45, 100, 1e-5, 1e-3)
    table = markdown.strongest_pairs(pairs, symbols)
    lines = table.splitlines()
    assert lines[0].startswith("| leader | lagger | lag |")
    assert lines[2] == "| A\\|B | \\*C\\* | 2 | +0.5000 | NaN | 0.4500 | 100 | 0.0010 |"


def test_dropped_symbols_and_clusters_escape_names_and_say_when_empty():
    table = markdown.dropped_symbols([("A|B\nC", "zero variance")])
    assert table.splitlines()[2] == "| A\\|B C | zero variance |"
    assert markdown.dropped_symbols([]) == "_no symbol dropped_"
    labels = np.array([0, 0, 1], dtype=np.int32)
    assert "| 0 | 2 | \\*X, Y |" in markdown.largest_clusters(labels, ["*X", "Y", "Z"])
    assert markdown.strongest_pairs(np.zeros(0, dtype=LEAD_LAG_DTYPE), []) == "_no lead-lag pairs_"
