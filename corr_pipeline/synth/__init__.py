"""Synthetic data, pure numpy (no database, no paths, no Dagster): the bottom layer with compute.

generate_universe   a daily close-price panel with known lead-lag pairs and realistic defects
                    (:mod:`corr_pipeline.synth.universe`; SPEC §1, §2, §6)
ragged_returns      a ragged float32 returns matrix for the compute benchmarks
                    (:mod:`corr_pipeline.synth.returns`; SPEC §2)
example_returns     the four symbols of the compute functions' docstring examples
market_like_returns returns with a reversing market, common GARCH volatility, fat tails,
                    optional sectors (reported per symbol) and lead-lag pairs, for the
                    lead-lag calibration and the clusters' cuts
                    (:mod:`corr_pipeline.synth.market_like`; SPEC §6)
"""

from corr_pipeline.synth.market_like import MarketLikeReturns, market_like_returns
from corr_pipeline.synth.returns import example_returns, ragged_returns
from corr_pipeline.synth.universe import (
    BAD_PRINT_DTYPE,
    BAD_PRINT_KINDS,
    DEFAULT_END_DATE,
    HALT_DTYPE,
    MAX_LAG,
    REALISTIC_TICKERS,
    TRUTH_DTYPE,
    SyntheticUniverse,
    generate_universe,
    make_symbols,
    weekday_dates,
)

__all__ = [
    "BAD_PRINT_DTYPE",
    "BAD_PRINT_KINDS",
    "DEFAULT_END_DATE",
    "HALT_DTYPE",
    "MAX_LAG",
    "MarketLikeReturns",
    "REALISTIC_TICKERS",
    "TRUTH_DTYPE",
    "SyntheticUniverse",
    "example_returns",
    "generate_universe",
    "make_symbols",
    "market_like_returns",
    "ragged_returns",
    "weekday_dates",
]
