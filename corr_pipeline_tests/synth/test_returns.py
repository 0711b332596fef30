"""ragged_returns: the documented shape, dtype, determinism and missing-data pattern."""

from __future__ import annotations

import numpy as np

from corr_pipeline.synth import ragged_returns


def test_shape_dtype_and_same_seed_same_bits() -> None:
    R = ragged_returns(120, 300, seed=4)
    assert R.shape == (120, 300) and R.dtype == np.float32
    assert np.array_equal(R.view(np.uint32), ragged_returns(120, 300, seed=4).view(np.uint32))
    assert not np.array_equal(R, ragged_returns(120, 300, seed=5), equal_nan=True)


def test_ragged_columns_and_scattered_gaps() -> None:
    n_rows, n_cols = 200, 2000
    R = ragged_returns(n_rows, n_cols, seed=1, ragged_share=0.2, gap_share=0.01)
    missing = np.isnan(R)
    # a listed-late column misses its first rows, a delisted-early one its last rows
    late = missing[: n_rows // 10].all(axis=0)
    early = missing[-(n_rows // 10) :].all(axis=0)
    assert 0.15 < (late | early).mean() < 0.25
    assert not (late & early).any()
    ragged = late | early
    assert 0.005 < missing[:, ~ragged].mean() < 0.015  # gaps only
    # at most 60 % of a ragged column's window is cut, plus the scattered gaps
    assert (missing[:, ragged].mean(axis=0) < 0.65).all()
    assert np.isfinite(R[~missing]).all()


def test_no_missing_data_when_shares_are_zero() -> None:
    R = ragged_returns(50, 40, seed=0, ragged_share=0.0, gap_share=0.0)
    assert np.isfinite(R).all()
    corr = np.corrcoef(R.T)
    assert corr[~np.eye(40, dtype=bool)].mean() > 0.05  # the market factor
