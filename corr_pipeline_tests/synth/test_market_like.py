"""The sectors :func:`corr_pipeline.synth.market_like_returns` reports: the ``s(j)`` its returns
were drawn with (within a sector the returns share a factor), ``-1`` for the injected pairs."""

from __future__ import annotations

import numpy as np

from corr_pipeline.synth import market_like_returns


def test_sectors_are_those_of_the_returns() -> None:
    draw = market_like_returns(2000, 60, seed=8, n_sectors=3, n_pairs=2, ragged_share=0.0)
    in_pair = np.zeros(60, dtype=bool)
    in_pair[draw.truth["leader"]] = in_pair[draw.truth["lagger"]] = True
    assert draw.sector.dtype == np.int64 and draw.sector.shape == (60,)
    assert np.all(draw.sector[in_pair] == -1)
    assert set(draw.sector[~in_pair].tolist()) == {0, 1, 2}
    # less the market factor, the returns correlate within a sector and not across
    returns = draw.returns.astype(np.float64)
    beta = returns.T @ draw.market / (draw.market @ draw.market)
    residual = returns - np.outer(draw.market, beta)
    corr = np.corrcoef(residual.T)
    keep = np.flatnonzero(~in_pair)
    same = draw.sector[keep][:, None] == draw.sector[keep][None, :]
    off = ~np.eye(keep.size, dtype=bool)
    block = corr[np.ix_(keep, keep)]
    assert block[same & off].mean() > 0.1
    assert abs(block[~same].mean()) < 0.05


def test_without_sectors_every_symbol_is_in_sector_0() -> None:
    draw = market_like_returns(100, 10, seed=1)
    np.testing.assert_array_equal(draw.sector, np.zeros(10, dtype=np.int64))
