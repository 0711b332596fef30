"""Synthetic data, pure numpy (no database, no paths, no Dagster): the bottom layer with compute.

generate_universe   a daily close-price panel with known lead-lag pairs and realistic defects
                    (:mod:`corr_pipeline.synth.universe`; SPEC §1, §2, §6)
ragged_returns      a ragged float32 returns matrix for the compute benchmarks
                    (:mod:`corr_pipeline.synth.returns`; SPEC §2)
"""

from corr_pipeline.synth.returns import ragged_returns
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
    "REALISTIC_TICKERS",
    "TRUTH_DTYPE",
    "SyntheticUniverse",
    "generate_universe",
    "make_symbols",
    "ragged_returns",
    "weekday_dates",
]
