"""The products in stripes on a Dask LocalCluster (2 worker processes, over TLS as the pipeline
reaches Dask) against the threads.

Bit-identical (``np.array_equal`` with NaN positions, and the overlap) to
:func:`pairwise_correlation`, :func:`top_k_neighbors` and :func:`find_lead_lag_pairs`, for 1 and
2 workers and stripe sizes aligned and not aligned with the tile grid; a worker that dies in a
stripe (after scribbling over its rows) is replaced, its stripe re-run, and the result is still
identical. N > PRODUCT_COLUMNS so a stripe's tiles have several column chunks to mirror; no
file but the outputs is left next to them.
"""

# ruff: noqa: E402 (the package is imported after the skip when distributed is missing)

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

distributed = pytest.importorskip("distributed")

from corr_pipeline.compute import find_lead_lag_pairs, pairwise_correlation, top_k_neighbors
from corr_pipeline.compute.correlation.striped import (
    correlation_stripe,
    mirror_stripe,
    striped_correlation,
)
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.scan import MAX_BLOCK_ROWS
from corr_pipeline.compute.lead_lag.significance import count_p_values
from corr_pipeline.compute.lead_lag.striped import (
    POOL_DTYPE,
    LaggerFloor,
    LeadLagStripe,
    StripesTakenIn,
    lead_lag_evaluation,
    lead_lag_stripe,
    merge_lead_lag_stripes,
    striped_lead_lag,
)
from corr_pipeline.compute.lead_lag.sweep import PValueCounts
from corr_pipeline.compute.neighbors.striped import striped_neighbors
from corr_pipeline.compute.parallel.dask_runner import DaskRunner
from corr_pipeline.compute.parallel.runners import (
    InlineExecutor,
    InProcessRunner,
    MappedFile,
    stripes_of,
)
from corr_pipeline.compute.standardize import standardize
from corr_pipeline.compute.tiling import PRODUCT_COLUMNS, overlap_dtype
from corr_pipeline.snapshot.scheduler_certs import make_certificates
from corr_pipeline_tests.compute.universes import adversarial_universe, realistic_universe
from corr_pipeline_tests.fixtures.dask_tls import tls_local_cluster

UNIVERSE = adversarial_universe(21, 120, PRODUCT_COLUMNS + 180, 30)
LEAD_LAG = realistic_universe(22, 90, 700, 40, injected=[(3, 500, 2), (650, 10, 4)])


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("dask") / "tls")


def _cluster(certificates, n_workers: int):
    with tls_local_cluster(certificates, n_workers) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        with distributed.Client(cluster, set_as_default=False) as client:
            yield DaskRunner(client)


@pytest.fixture(scope="module")
def two_workers(certificates):
    yield from _cluster(certificates, 2)


@pytest.fixture(scope="module")
def one_worker(certificates):
    yield from _cluster(certificates, 1)


@pytest.fixture(scope="module")
def threaded():
    R = UNIVERSE.R
    return pairwise_correlation(R, min_overlap=UNIVERSE.min_overlap)


def _outputs(tmp_path: Path, n: int, T: int) -> tuple[np.memmap, np.memmap]:
    shape = (n, n)
    corr = np.lib.format.open_memmap(tmp_path / "corr.npy", "w+", np.float32, shape)
    overlap = np.lib.format.open_memmap(tmp_path / "overlap.npy", "w+", overlap_dtype(T), shape)
    return corr, overlap


def _assert_same(result, corr: np.ndarray, overlap: np.ndarray) -> None:
    assert np.array_equal(corr, result.corr, equal_nan=True)
    assert np.array_equal(np.isnan(corr), np.isnan(result.corr))
    assert corr.tobytes() == result.corr.tobytes()
    assert np.array_equal(overlap, result.overlap)


@pytest.mark.parametrize("workers", ["one_worker", "two_workers"])
@pytest.mark.parametrize("stripe_rows", [128, 200, 384, 4096])
def test_correlation_stripes_are_the_threads_bit_for_bit(
    request, workers, stripe_rows, threaded, tmp_path
):
    runner = request.getfixturevalue(workers)
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    corr[:] = -7.0  # every byte must be written by the stripes
    overlap[:] = -1
    seen: list[tuple[int, int]] = []
    striped_correlation(
        UNIVERSE.R,
        runner,
        min_overlap=UNIVERSE.min_overlap,
        out_corr=corr,
        out_overlap=overlap,
        stripe_rows=stripe_rows,
        progress=lambda done, total: seen.append((done, total)),
    )
    _assert_same(threaded, corr, overlap)
    stripes = -(-UNIVERSE.N // stripe_rows)
    total = 2 * stripes - 1  # both passes; the first stripe has nothing left of the diagonal
    assert seen == [(i, total) for i in range(1, total + 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corr.npy", "overlap.npy"]


def test_correlation_stripes_in_process(threaded, tmp_path):
    """The two passes in this process over files full of other values: exactly the byte ranges
    the threads write (every byte overwritten, none spilled)."""
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    corr[:] = -7.0
    overlap[:] = -1
    with threadpool_limits(limits=1, user_api="blas"):  # restores what a stripe sets for good
        striped_correlation(
            UNIVERSE.R,
            InProcessRunner(),
            min_overlap=UNIVERSE.min_overlap,
            out_corr=corr,
            out_overlap=overlap,
            stripe_rows=128,
        )
    _assert_same(threaded, corr, overlap)


def _die_once(fn, victim_fn, flag: str, victim: tuple[int, int], R, stripe, token, *args):
    """Run ``fn``; the first time ``victim_fn`` runs ``victim``, kill the worker process before
    it returns, after writing garbage over every byte the stripe writes (a correlation stripe:
    its rows from the diagonal on; a mirror stripe: its rows left of it), so the result must
    come from a retry."""
    if fn is not victim_fn or tuple(stripe) != tuple(victim) or os.path.exists(flag):
        return fn(R, stripe, token, *args)
    Path(flag).touch()
    fn(R, stripe, token, *args)
    start, stop = stripe
    for file in args if fn in (correlation_stripe, mirror_stripe) else ():
        if isinstance(file, MappedFile):
            matrix = file.open("r+")
            if fn is correlation_stripe:
                matrix[start:stop, start:] = -3
            else:
                matrix[start:stop, :start] = -3
            matrix.flush()
    os._exit(1)


class _KillingRunner(DaskRunner):
    def __init__(self, runner: DaskRunner, victim_fn, flag: Path, victim: tuple[int, int]):
        super().__init__(runner.client)
        self.victim_fn, self.flag, self.victim = victim_fn, str(flag), victim

    def map(self, fn, shared, stripes, *args: Any, progress=None, feedback=None):
        doomed = functools.partial(_die_once, fn, self.victim_fn, self.flag, self.victim)
        functools.update_wrapper(doomed, fn)
        return super().map(doomed, shared, stripes, *args, progress=progress, feedback=feedback)


@pytest.mark.parametrize("victim_fn", [correlation_stripe, mirror_stripe])
def test_a_worker_killed_mid_stripe_is_retried_and_the_result_is_identical(
    two_workers, threaded, tmp_path, victim_fn
):
    flag = tmp_path / "killed"
    runner = _KillingRunner(two_workers, victim_fn, flag, (256, 512))
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    striped_correlation(
        UNIVERSE.R,
        runner,
        min_overlap=UNIVERSE.min_overlap,
        out_corr=corr,
        out_overlap=overlap,
        stripe_rows=256,
    )
    assert flag.exists()  # the victim did run, and its worker died
    _assert_same(threaded, corr, overlap)
    two_workers.client.wait_for_workers(2, timeout=60)


@pytest.mark.parametrize("stripe_rows", [128, 300])
def test_neighbors_stripes_are_the_threads(two_workers, threaded, tmp_path, stripe_rows):
    corr, overlap = _outputs(tmp_path, UNIVERSE.N, UNIVERSE.T)
    corr[:], overlap[:] = threaded.corr, threaded.overlap
    expected = top_k_neighbors(threaded.corr, k=7, overlap=threaded.overlap)
    found = striped_neighbors(
        corr, two_workers, k=7, overlap=overlap, working_memory_mb=1, stripe_rows=stripe_rows
    )
    for name in ("index", "corr", "overlap"):
        assert getattr(found, name).tobytes() == getattr(expected, name).tobytes(), name


@pytest.fixture(scope="module")
def lead_lag_inputs(tmp_path_factory):
    result = pairwise_correlation(LEAD_LAG.R, min_overlap=LEAD_LAG.min_overlap)
    path = tmp_path_factory.mktemp("lead_lag") / "corr.npy"
    corr = np.lib.format.open_memmap(path, "w+", np.float32, result.corr.shape)
    corr[:] = result.corr
    return corr


def _lead_lag(R, corr, runner=None, **kwargs):
    common = dict(max_lag=4, k_leaders=3, k_laggers=2, min_overlap=LEAD_LAG.min_overlap)
    if runner is None:
        return find_lead_lag_pairs(R, corr=corr, **common, **kwargs)
    return striped_lead_lag(R, runner, corr=corr, **common, **kwargs)


@pytest.mark.parametrize("with_corr", [True, False])
@pytest.mark.parametrize("stripe_rows", [128, 250])
def test_lead_lag_stripes_are_the_threads(two_workers, lead_lag_inputs, with_corr, stripe_rows):
    corr = lead_lag_inputs if with_corr else None
    expected = _lead_lag(LEAD_LAG.R, corr)
    found = _lead_lag(LEAD_LAG.R, corr, two_workers, stripe_rows=stripe_rows)
    assert expected.size > 0
    assert found.tobytes() == expected.tobytes()
    for leader, lagger, lag in LEAD_LAG.injected:
        hit = found[(found["leader"] == leader) & (found["lagger"] == lagger)]
        assert hit.size == 1 and hit["lag"][0] == lag


@pytest.mark.parametrize("series", ["returns", "residuals"])
def test_significant_lead_lag_stripes_are_the_threads(two_workers, tmp_path, series):
    """With ``max_q_value`` the stripes count the p-values first, then sweep the leaders that
    can have a significant pair with the same limit: the threaded scan's pairs, p- and
    q-values, byte for byte (a window long enough for the robust test to find the lags), on
    the returns with their ``corr`` and on their market residuals (lag 0 from the sweep)."""
    from corr_pipeline.compute import market_modes, market_residuals

    universe = realistic_universe(22, 250, 700, 40, injected=[(3, 500, 2), (650, 10, 4)])
    R = universe.R
    result = pairwise_correlation(R, min_overlap=universe.min_overlap)
    corr = np.lib.format.open_memmap(tmp_path / "corr.npy", "w+", np.float32, result.corr.shape)
    corr[:] = result.corr
    if series == "residuals":
        R, corr = market_residuals(R, market_modes(result.corr, 1).vectors), None
    common = dict(max_lag=4, k_leaders=3, k_laggers=2, min_overlap=universe.min_overlap)
    expected = find_lead_lag_pairs(R, corr=corr, max_q_value=0.5, **common)
    found = striped_lead_lag(R, two_workers, corr=corr, max_q_value=0.5, **common)
    everything = find_lead_lag_pairs(R, corr=corr, **common)
    assert 0 < expected.size < everything.size
    assert found.tobytes() == expected.tobytes()


def test_lead_lag_ties_across_stripes_go_to_the_smaller_leader(two_workers):
    """Copies of one leader in different stripes tie exactly for every lagger: the merge of
    the stripes' per-lagger tables must keep the smaller leaders, as the threaded scan does."""
    rng = np.random.default_rng(5)
    T, n = 120, 300
    R = rng.standard_normal((T, n)).astype(np.float32)
    R[1:, 7] = R[:-1, 3]  # 3 leads 7 by one day
    for copy in (150, 260, 40):  # the same leader in other stripes (stripe_rows = 100)
        R[:, copy] = R[:, 3]
    R[:5, 200] = np.nan
    common = dict(max_lag=3, k_leaders=2, k_laggers=2, min_overlap=30)
    expected = find_lead_lag_pairs(R, **common)
    found = striped_lead_lag(R, two_workers, stripe_rows=100, **common)
    assert found.tobytes() == expected.tobytes()
    # 7's own k_leaders = 2 are the two smallest copies; 150 and 260 appear only through their
    # own rows' selections (7 is their best lagger)
    assert {3, 40, 150, 260} <= set(found[found["lagger"] == 7]["leader"].tolist())


def _records(*rows: tuple[int, int, float]) -> np.ndarray:
    out = np.zeros(len(rows), dtype=LEAD_LAG_DTYPE)
    for i, (leader, lagger, improvement) in enumerate(rows):
        out[i]["leader"], out[i]["lagger"], out[i]["improvement"] = leader, lagger, improvement
    return out


def test_the_lagger_floor_is_the_kth_of_the_finished_stripes_values():
    """Per lagger: the larger of the k-th largest lower bound and the k-th largest exact value
    known (rows' and columns' selections, each pair once) over the stripes taken in so far
    (-inf until k of either are known)."""
    floor = LaggerFloor(3, 2)
    assert np.all(floor.current() == -np.inf)
    pool = np.empty(0, dtype=POOL_DTYPE)
    inf = -np.inf
    first = LeadLagStripe(
        row_pairs=_records((0, 0, 0.3), (1, 0, 0.6)),
        pool=pool,
        # the same pair in a row's and a column's selection counts once
        column_pairs=_records((1, 0, 0.6)),
        lower=np.array([[0.1, 0.5], [inf, 0.2], [inf, inf]], np.float32),
    )
    second = LeadLagStripe(
        row_pairs=_records((5, 0, 0.1), (5, 2, 0.9)),
        pool=pool,
        column_pairs=_records(),
        lower=np.array([[0.2, 0.4], [inf, 0.7], [inf, inf]], np.float32),
    )
    floor.update(first)
    # lagger 0: lower bounds 0.5, 0.1 (2nd: 0.1); exact 0.6, 0.3, not 0.6 twice
    assert floor.current().tolist() == pytest.approx([0.3, -np.inf, -np.inf])
    floor.update(second)
    # lagger 0: lower bounds 0.5, 0.4 (2nd: 0.4), exact 0.6, 0.3 (2nd: 0.3); lagger 1: 0.7, 0.2
    assert floor.current().tolist() == pytest.approx([0.4, 0.2, -np.inf])


def test_the_stripes_counts_are_summed_as_they_arrive_and_not_kept():
    """:class:`StripesTakenIn` adds each stripe's p-value counts to one histogram and hands the
    map back the stripe without them; the floor is the :class:`LaggerFloor`'s."""
    taken_in, floor = StripesTakenIn(3, 1), LaggerFloor(3, 1)
    pool = np.empty(0, dtype=POOL_DTYPE)
    lower = np.full((3, 1), -np.inf, np.float32)
    counted = [
        PValueCounts(np.array([4, 9, 300], np.int32), np.array([2, 1, 7], np.int64)),
        PValueCounts(np.array([9, 301], np.int32), np.array([256, 1], np.int64)),
    ]
    for i, counts in enumerate(counted):
        part = LeadLagStripe(_records((i, 1, 0.5)), pool, _records(), lower, counts)
        kept = taken_in.update(part)
        floor.update(part)
        assert kept.counts is None
        assert kept.row_pairs is part.row_pairs
        assert np.array_equal(taken_in.current(), floor.current())
    total = taken_in.counts()
    assert total.bins.tolist() == [4, 9, 300, 301]
    assert total.counts.tolist() == [2, 257, 7, 1]
    assert StripesTakenIn(3, 1).counts().m == 0


class _FixedFloor:
    def __init__(self, floor: np.ndarray | None) -> None:
        self.floor = floor

    def current(self) -> np.ndarray | None:
        return self.floor

    def update(self, result):
        return result


@pytest.mark.parametrize("count", [False, True], ids=["bounds", "bounds-and-counts"])
def test_lead_lag_stripes_stay_exact_under_the_tightest_floor(two_workers, lead_lag_inputs, count):
    """Every stripe given, per lagger, its final k-th best improvement over all leaders (the
    largest floor a :class:`LaggerFloor` can ever reach, ties at the k-th included): the
    stripes' tables shrink and the merge is still the threaded result, whether the stripes'
    sweeps count too or not; their counts are the whole window's."""
    R, k_leaders, k_laggers = LEAD_LAG.R, 3, 2
    columns_only = find_lead_lag_pairs(
        R,
        corr=lead_lag_inputs,
        max_lag=4,
        k_leaders=k_leaders,
        k_laggers=0,
        min_overlap=LEAD_LAG.min_overlap,
    )
    floor = np.full(R.shape[1], -np.inf, np.float32)
    for lagger in np.unique(columns_only["lagger"]):
        best = columns_only["improvement"][columns_only["lagger"] == lagger]
        if best.size == k_leaders:
            floor[lagger] = best.min()
    assert np.isfinite(floor).sum() > R.shape[1] // 2
    args = (MappedFile.of(lead_lag_inputs), 4, k_laggers, k_leaders, LEAD_LAG.min_overlap)
    args += (0.0, N_BINS, MAX_BLOCK_ROWS, count)
    stripes = stripes_of(R.shape[1], 128)
    free, floored = (
        two_workers.map(lead_lag_stripe, R, stripes, None, *args, feedback=_FixedFloor(given))
        for given in (None, floor)
    )
    expected = _lead_lag(R, lead_lag_inputs)
    for name in ("p_value", "q_value", "reverse_lagged_corr", "reverse_q_value"):
        expected[name] = np.nan  # the merge leaves them to the caller
    expected["reverse_lag"] = 0
    evaluation = lead_lag_evaluation(R, 4, False, LEAD_LAG.min_overlap, 0.0)
    for parts in (free, floored):
        merged = merge_lead_lag_stripes(parts, evaluation, k_leaders)
        assert merged.tobytes() == expected.tobytes()
    pooled = [sum(p.pool.size for p in parts) for parts in (free, floored)]
    assert pooled[1] < pooled[0]
    for parts in (free, floored):
        if not count:
            assert all(p.counts is None for p in parts)
            continue
        found = PValueCounts.merge([p.counts for p in parts])
        whole = count_p_values(standardize(R), 4, LEAD_LAG.min_overlap, InlineExecutor())
        assert 0 < found.m <= R.shape[1] * (R.shape[1] - 1)
        assert np.array_equal(found.bins, whole.bins)
        assert np.array_equal(found.counts, whole.counts)


@pytest.mark.parametrize("with_corr", [True, False])
def test_lead_lag_stripes_that_evaluate_their_own_pools_are_exact(
    monkeypatch, lead_lag_inputs, with_corr
):
    """A stripe whose pool outgrows the cap evaluates it itself (here after every block): its
    evaluated column pairs, the later stripes' pools and the rows then meet in the merge, and
    the result is still the threaded scan's."""
    from corr_pipeline.compute.lead_lag import striped

    corr = lead_lag_inputs if with_corr else None
    expected = _lead_lag(LEAD_LAG.R, corr)
    evaluated: list[int] = []
    stripe_fn = lead_lag_stripe

    def counted(*args):
        part = stripe_fn(*args)
        evaluated.append(part.column_pairs.size)
        return part

    monkeypatch.setattr(striped, "max_pool", lambda n_cols, k: 200)
    monkeypatch.setattr(striped, "lead_lag_stripe", counted)
    found = _lead_lag(LEAD_LAG.R, corr, InProcessRunner(), stripe_rows=128, block_rows=64)
    assert found.tobytes() == expected.tobytes()
    assert sum(evaluated) > 0  # some stripes did evaluate their own pools


def test_lead_lag_with_a_killed_worker_is_identical(two_workers, lead_lag_inputs, tmp_path):
    expected = _lead_lag(LEAD_LAG.R, lead_lag_inputs)
    runner = _KillingRunner(two_workers, lead_lag_stripe, tmp_path / "killed", (128, 256))
    found = _lead_lag(LEAD_LAG.R, lead_lag_inputs, runner, stripe_rows=128)
    assert (tmp_path / "killed").exists()
    assert found.tobytes() == expected.tobytes()
    two_workers.client.wait_for_workers(2, timeout=60)


def test_striped_products_need_file_backed_outputs(two_workers):
    R = LEAD_LAG.R
    n = R.shape[1]
    with pytest.raises(ValueError, match="file-backed"):
        striped_correlation(
            R,
            two_workers,
            min_overlap=LEAD_LAG.min_overlap,
            out_corr=np.empty((n, n), np.float32),
            out_overlap=np.empty((n, n), overlap_dtype(R.shape[0])),
        )
