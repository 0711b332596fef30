"""The rounding and dtype rules of everything a reader sees (snapshot/display.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.snapshot import display


def test_correlations_keep_four_decimals() -> None:
    assert display.corr(0.19160979491621294) == 0.1916
    assert repr(display.corr(0.189158)) == "0.1892"
    assert display.corr(-0.99995) == -1.0 and display.corr(np.float32(0.72404)) == 0.724
    assert repr(display.corr(-0.00001)) == "0.0"  # no -0.0
    assert display.corr_text(0.72404) == "+0.7240" and display.corr_text(-0.05) == "-0.0500"
    assert display.corr_text(0.45, signed=False) == "0.4500"
    assert display.corr_text(float("nan")) == "NaN"


def test_shares_keep_four_significant_digits() -> None:
    assert display.share(0.987654321) == 0.9877
    assert display.share(0.000123456) == 0.0001235  # a small share keeps its digits
    assert display.share(1.0) == 1.0 and display.share(0) == 0.0
    assert display.share(2 / 3) == 0.6667


def test_seconds_memory_and_mean_counts() -> None:
    assert display.seconds(12.3456) == 12.35 and display.seconds(0.004) == 0.0
    assert display.mib(1234.5678) == 1234.6 and display.mib(np.float64(0.04)) == 0.0
    assert display.mean_count(251.96) == 252.0


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        (display.corr, lambda v: 0.5e-4),
        (display.share, lambda v: 0.5e-3 * abs(v)),  # 4 significant digits: relative
        (display.seconds, lambda v: 0.5e-2),
        (display.mib, lambda v: 0.05),
        (display.mean_count, lambda v: 0.05),
    ],
)
def test_rules_give_plain_floats_nan_when_not_finite_and_are_idempotent(rule, error) -> None:
    for bad in (float("nan"), float("inf"), -np.inf):
        assert math.isnan(rule(bad))
    rng = np.random.default_rng(0)
    for value in rng.uniform(-1, 1, 200).tolist() + rng.uniform(0, 5000, 200).tolist():
        once = rule(np.float64(value))
        assert type(once) is float
        assert rule(once) == once  # what the UI shows, rounded again, is unchanged
        assert abs(once - value) <= error(value) * (1 + 1e-9)  # off by half a unit at most


def test_dtypes_read_as_a_reader_names_them() -> None:
    assert display.dtype_text(np.float32) == "float32"
    assert display.dtype_text(np.dtype("<i2")) == "int16"
    assert display.dtype_text(np.dtype(">f8")) == "float64"
    assert display.dtype_text(np.bool_) == "bool"
    assert display.dtype_text("<U12") == "str[12]" and display.dtype_text("S8") == "bytes[8]"
    assert display.dtype_text("datetime64[D]") == "datetime64[D]"
    assert display.dtype_text(np.dtype(("<f4", (3,)))) == "float32[3]"
    nested = np.dtype([("symbol", "<U12"), ("lag", "i1"), ("at", [("x", "<f4"), ("y", "<f4")])])
    assert display.dtype_text(nested) == "symbol: str[12], lag: int8, at: {x: float32, y: float32}"
    text = display.dtype_text(LEAD_LAG_DTYPE)
    assert text.startswith("leader: ") and "improvement: float" in text
    assert "<" not in text and "(" not in text
