"""Significant and two-way lead-lag pairs (corr_pipeline.snapshot.direction, SPEC §6
"Significance", "Direction"): the one rule the metadata, the markdown preview and the network
picture share."""

from __future__ import annotations

import numpy as np
import pytest

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.snapshot import direction


def _pairs() -> np.ndarray:
    """Six pairs: q-values around 0.05 and reverse directions of every kind."""
    pairs = np.zeros(6, LEAD_LAG_DTYPE)
    pairs["q_value"] = [1e-9, 0.05, np.nextafter(0.05, 1), 0.5, np.nan, 1.0]
    pairs["reverse_lag"] = [2, 1, 0, 3, 1, 0]
    pairs["reverse_q_value"] = [0.01, 0.05, np.nan, np.nextafter(0.05, 1), np.nan, 0.0]
    return pairs


def test_significant_and_two_way_at_a_threshold_bound_included():
    pairs = _pairs()
    assert direction.is_significant(pairs["q_value"], 0.05).tolist() == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    # the last pair is zero-filled (np.zeros): reverse_lag 0 means no reverse, whatever its q
    assert direction.is_two_way(pairs["reverse_lag"], pairs["reverse_q_value"], 0.05).tolist() == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert direction.count_significant(pairs, 0.05) == 2
    assert direction.count_two_way(pairs, 0.05) == 2
    assert direction.count_significant(pairs, 1.0) == 5  # NaN never
    assert direction.count_two_way(pairs, 1.0) == 3  # a reverse best lag with a q-value
    assert direction.count_two_way(np.zeros(0, LEAD_LAG_DTYPE), 0.05) == 0


def test_scalars_and_none():
    """Rows read from the database hold None where the reverse has no best lag."""
    assert bool(direction.is_two_way(2, 0.01, 0.05))
    assert not bool(direction.is_two_way(None, None, 0.05))
    assert not bool(direction.is_two_way(2, None, 1.0))
    assert not bool(direction.is_significant(None, 1.0))
    assert direction.two_way_text(2, 0.0123, 0.05) == "⇄ 2d, q 0.0123"
    assert direction.two_way_text(1, 3.2e-7, 0.05) == "⇄ 1d, q 3.2e-07"
    assert direction.two_way_text(1, 0.3, 0.05) == ""
    assert direction.two_way_text(0, np.nan, 0.05) == ""


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"max_q_value": 0.05}, 0.05),
        ({"max_q_value": "0.01"}, 0.01),
        ({"max_q_value": 1}, 1.0),
        ({}, 1.0),  # a snapshot published before the parameter existed
        (None, 1.0),
        ({"max_q_value": None}, 1.0),
        ({"max_q_value": 0}, 1.0),
        ({"max_q_value": 2.5}, 1.0),
        ({"max_q_value": "x"}, 1.0),
        ({"max_q_value": float("nan")}, 1.0),
    ],
)
def test_a_snapshots_max_q_value(params, expected):
    assert direction.snapshot_max_q_value(params) == expected
