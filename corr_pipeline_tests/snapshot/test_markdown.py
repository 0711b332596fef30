"""The markdown previews: symbols are escaped so they show verbatim and cannot break a table."""

from __future__ import annotations

import numpy as np

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.snapshot import markdown


def test_lead_lag_markdown_table_escapes_symbols():
    symbols = ["A|B", "*C*", "D"]
    pairs = np.zeros(1, dtype=LEAD_LAG_DTYPE)
    pairs[0] = (0, 1, 2, 0.5, np.nan, 0.45, 100, 1e-5, 1e-3, 0, np.nan, np.nan)
    table = markdown.strongest_pairs(pairs, symbols)
    lines = table.splitlines()
    assert lines[0].startswith("| leader | lagger | lag |")
    assert lines[2] == "| A\\|B | \\*C\\* | 2 | +0.5000 | NaN | 0.4500 | 100 | 0.0010 |  |"


def test_lead_lag_markdown_marks_the_two_way_pairs():
    """The last column, ``⇄ two-way``, shows the reverse pair's lag and q-value where that
    q-value is at most the snapshot's max_q_value (the bound included), and nothing for a
    one-way pair (reverse not significant, or no reverse best lag)."""
    pairs = np.zeros(4, dtype=LEAD_LAG_DTYPE)
    pairs[0] = (0, 1, 1, 0.5, 0.1, 0.4, 100, 1e-7, 1e-6, 2, -0.3, 0.004)
    pairs[1] = (1, 2, 1, 0.4, 0.1, 0.3, 100, 1e-7, 1e-6, 1, 0.2, 0.3)
    pairs[2] = (2, 0, 1, 0.3, 0.1, 0.2, 100, 1e-7, 1e-6, 0, np.nan, np.nan)
    pairs[3] = (1, 0, 3, 0.2, 0.1, 0.1, 100, 1e-7, 1e-6, 1, 0.5, 0.05)
    lines = markdown.strongest_pairs(pairs, ["A", "B", "C"], max_q_value=0.05).splitlines()
    assert lines[0].endswith("| q value | ⇄ two-way |")
    assert lines[1].endswith("|---:|---|")
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == [
        "⇄ 2d, q 0.0040",
        "",
        "",
        "⇄ 1d, q 0.0500",
    ]
    # at the default 1, every pair with a reverse best lag is two-way
    lines = markdown.strongest_pairs(pairs, ["A", "B", "C"]).splitlines()
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == [
        "⇄ 2d, q 0.0040",
        "⇄ 1d, q 0.3000",
        "",
        "⇄ 1d, q 0.0500",
    ]


def test_dropped_symbols_and_clusters_escape_names_and_say_when_empty():
    table = markdown.dropped_symbols([("A|B\nC", "zero variance")])
    assert table.splitlines()[2] == "| A\\|B C | zero variance |"
    assert markdown.dropped_symbols([]) == "_no symbol dropped_"
    labels = np.array([0, 0, 1], dtype=np.int32)
    assert "| 0 | 2 | \\*X, Y |" in markdown.largest_clusters(labels, ["*X", "Y", "Z"])
    assert markdown.strongest_pairs(np.zeros(0, dtype=LEAD_LAG_DTYPE), []) == "_no lead-lag pairs_"
