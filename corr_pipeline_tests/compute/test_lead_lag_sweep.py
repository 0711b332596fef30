"""The lead-lag sweep's proved bounds (``compute/lead_lag/sweep.py``): the improvement bounds
enclose every exact value, and every p-value it counts is within the proved factor of the
float64 brute force's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.special import erfc

from corr_pipeline.compute import pairwise_correlation
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.compute.lead_lag_universes import SPECIAL_UNIVERSES
from corr_pipeline_tests.compute.universes import Universe


@pytest.mark.parametrize("name", sorted(SPECIAL_UNIVERSES))
def test_sweep_bounds_enclose_exact_values(name: str) -> None:
    """For every pair: lower bound <= exact improvement <= upper bound (SPEC §6 exactness of the
    selection), with the synchronous correlation computed (lag 0 among the products) and given,
    with and without a q-value condition, in blocks that cut the product tiles; never wrong on
    whether a pair is a candidate, and with the condition, never a lower bound for a pair that
    fails it. The counts taken on the way equal the count alone's."""
    from corr_pipeline.compute.lead_lag import kernels as lead_lag_kernels
    from corr_pipeline.compute.lead_lag.p_values import N_BINS
    from corr_pipeline.compute.lead_lag.scan import make_evaluation
    from corr_pipeline.compute.lead_lag.significance import count_p_values
    from corr_pipeline.compute.lead_lag.sweep import Sweep, block_bounds, sweep_inputs
    from corr_pipeline.compute.standardize import standardize
    from corr_pipeline.compute.workers import worker_pool

    universe = SPECIAL_UNIVERSES[name]()
    R, m, N = universe.R, universe.min_overlap, universe.N
    corr = pairwise_correlation(R, min_overlap=m).corr
    for given_corr, min_improvement, bin_limit in (
        (None, 0.0, N_BINS),
        (corr, 0.05, N_BINS),
        (None, 0.0, N_BINS - 300_000),  # p-values below about 0.2
        (corr, 0.0, N_BINS - 800_000),  # below about 1e-3
    ):
        with worker_pool() as pool:
            window = standardize(R, pool, layout="lead-lag")
            inputs = sweep_inputs(window, 5, m)
            sweep = Sweep(inputs)
            evaluation = make_evaluation(
                window, 5, given_corr is None, m, min_improvement, bin_limit, inputs.data
            )
            blocks = [
                block_bounds(
                    sweep,
                    np.arange(a, min(a + 50, N)),
                    given_corr,
                    min_improvement,
                    bin_limit,
                    pool,
                    count=True,
                )
                for a in range(0, N, 50)
            ]
            counts = sweep.counts(pool)
            alone = count_p_values(window, 5, m, pool)
        np.testing.assert_array_equal(counts.bins, alone.bins)
        np.testing.assert_array_equal(counts.counts, alone.counts)
        upper = np.concatenate([b[0] for b in blocks])
        lower = np.concatenate([b[1] for b in blocks])
        candidates = 0
        for i in range(N):
            for j in range(N):
                sync = np.float32(np.nan) if given_corr is None else corr[i, j]
                exact = lead_lag_kernels.pair_values(
                    i, j, sync, evaluation.params, evaluation.data
                )[0]
                if i == j:
                    assert upper[i, j] == -np.inf and lower[i, j] == -np.inf
                    continue
                assert lower[i, j] <= exact <= upper[i, j], (name, i, j, exact, upper[i, j])
                candidates += exact > -np.inf
        assert candidates > (N if bin_limit == N_BINS else 0), "too few candidates to test"


def _pairs_exact_p(R: np.ndarray, max_lag: int, min_overlap: int) -> np.ndarray:
    """Every ordered pair's lag p-value at its best lag (NaN without one), from the float64
    brute force of the reference (the robust statistic of SPEC §6)."""
    reference = ref.reference_lead_lag(
        R, max_lag=max_lag, k_leaders=0, k_laggers=0, min_overlap=min_overlap
    )
    robust = ref.reference_robust_t(R, max_lag)
    best = np.take_along_axis(robust, np.maximum(reference.best_lag - 1, 0)[None], 0)[0]
    p = erfc(np.abs(best) / np.sqrt(2.0))
    p[reference.best_lag == 0] = np.nan
    np.fill_diagonal(p, np.nan)
    return p


@pytest.mark.parametrize("name", ["mixed", "constant_segments", "heavy_tails_long"])
@pytest.mark.parametrize("chunk_rows", [128, 16])
def test_every_counted_p_value_is_within_the_proved_factor(
    monkeypatch: pytest.MonkeyPatch, name: str, chunk_rows: int
) -> None:
    """The sweep's bound (``sweep`` module docstring): each pair it counts (its best lag sure
    and its statistic's error bounded) is counted at a p-value within a factor
    ``1 + EPSILON`` of the float64 brute force's, plus the width of a bin; the others are
    deferred and counted exactly. Products off by more than the bound covers are caught."""
    from corr_pipeline.compute.lead_lag import sweep as sweep_module
    from corr_pipeline.compute.lead_lag.p_values import bin_upper_p
    from corr_pipeline.compute.standardize import standardize
    from corr_pipeline.compute.workers import worker_pool

    monkeypatch.setattr(sweep_module, "K_CHUNK", chunk_rows)
    if name == "heavy_tails_long":  # long window, heavy tails, strong lags: large products
        rng = np.random.default_rng(79)
        T, N = 1500, 60
        R = rng.standard_t(3, (T, N))
        for j in range(0, N, 2):
            R[1:, j + 1] += 0.8 * R[:-1, j]
        universe = Universe(name, R.astype(np.float32), 100, [f"c{j}" for j in range(N)])
    else:
        universe = SPECIAL_UNIVERSES[name]()
    R, m, N = universe.R, universe.min_overlap, universe.N
    expected = _pairs_exact_p(R, 5, m)

    def recorded(inputs) -> np.ndarray:
        record = np.full((N, N), -2, dtype=np.int64)
        with worker_pool() as pool:
            sweep = sweep_module.Sweep(inputs)
            sweep.run(np.arange(N), pool, record=record)
        return record

    with worker_pool() as pool:
        inputs = sweep_module.sweep_inputs(standardize(R, pool, layout="lead-lag"), 5, m)
    record = recorded(inputs)
    counted = record >= 0
    assert counted.sum() > N * (N - 1) // 2, "most pairs are counted from the products"
    assert np.all(np.isnan(expected[record == -2])), "every pair with a best lag is swept"
    factor = (1.0 + sweep_module.EPSILON) * (1.0 + 2.0**-16)
    got = np.array([bin_upper_p(b) for b in record[counted]])
    want = expected[counted]
    ratio = np.maximum(got / want, want / got)
    assert np.all(ratio <= factor), (name, float(ratio.max()))

    # Products off by more than the bound covers (the squares' sums 0.4 % high) are caught.
    off = recorded(dataclasses.replace(inputs, squares_t=inputs.squares_t * np.float32(1.002)))
    if chunk_rows == 128:
        got = np.array([bin_upper_p(b) for b in off[off >= 0]])
        want = expected[off >= 0]
        assert np.max(np.maximum(got / want, want / got)) > factor, "the check must be able to fail"
