"""The lead-lag pairs of SPEC §6: the entry point, on threads or on a runner's stripes of
leaders; the screened scan itself is :mod:`~corr_pipeline.compute.lead_lag.scan`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from corr_pipeline.compute.lead_lag.exact_pass import ExactPass, count_items, counts_with_bounds
from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.scan import (
    LEAD_LAG_DTYPE,
    MAX_BLOCK_ROWS,
    ColumnPool,
    block_row_bytes,
    check_lead_lag_args,
    make_screen,
    max_pool,
    scan_block,
    union_sorted,
)
from corr_pipeline.compute.lead_lag.significance import annotate, candidate_bin_limit
from corr_pipeline.compute.lead_lag.striped import striped_lead_lag
from corr_pipeline.compute.standardize import standardize
from corr_pipeline.compute.tiling import (
    DEFAULT_WORKING_MEMORY_MB,
    Progress,
    block_rows_for,
    row_blocks,
)
from corr_pipeline.compute.workers import worker_pool

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.runners import StripeRunner

__all__ = ["find_lead_lag_pairs"]


def find_lead_lag_pairs(
    R: np.ndarray,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
    max_q_value: float = 1.0,
    corr: np.ndarray | None = None,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    block_rows: int | None = None,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
) -> np.ndarray:
    """Lead-lag pairs of the columns of ``R`` per SPEC §6 (the screened scan of
    :mod:`~corr_pipeline.compute.lead_lag.scan`).

    Parameters
    ----------
    R : float32 (T, N) returns, NaN where missing.
    max_lag : lags 1 .. max_lag are scanned (1 <= max_lag < T).
    k_leaders, k_laggers : per symbol, how many best leaders of it / laggers of it to keep (>= 0).
    min_overlap : minimum common finite rows for any correlation (2 <= min_overlap <= T).
    min_improvement : a pair is a candidate iff its improvement is strictly above this.
    max_q_value : and iff its q-value (SPEC §6 "Significance") is at most this; 1: no condition.
    corr : the synchronous correlation (N × N float32, e.g. a read-only memory map);
        computed for the pairs that need it when not given.
    working_memory_mb, block_rows : block sizing; the result does not depend on them.
    progress : ``progress(done, total)`` after each work item of the p-values' count, then each
        block of the scan (on a runner: each stripe of the scan).
    runner : None scans on this process's threads; a
        :class:`~corr_pipeline.compute.parallel.runners.StripeRunner` scans stripes of leaders
        (:func:`~corr_pipeline.compute.lead_lag.striped.striped_lead_lag`; ``corr``, when
        given, a file-backed memory map). The same pairs either way.

    Returns a structured array with fields ``leader, lagger, lag, lagged_corr,
    sync_corr, improvement, overlap, p_value, q_value`` (:data:`LEAD_LAG_DTYPE`),
    leader/lagger being column indices of ``R``, sorted by improvement desc, then leader, then
    lagger. The q-values come from the exact count of every pair's p-value
    (:mod:`~corr_pipeline.compute.lead_lag.exact_pass`). With ``corr`` given and no q-value
    condition that pass also bounds the scan's improvements, within a float32 unit or two,
    block by block: one pass over the products, and the scan evaluates little more than the
    pairs it keeps. Otherwise it runs whole first and the scan screens with its own float32
    bounds.
    """
    check_lead_lag_args(
        R, max_lag, k_leaders, k_laggers, min_overlap, min_improvement, corr, max_q_value
    )
    n_rows, n_cols = R.shape
    row_bytes = block_row_bytes(n_cols)
    if block_rows is None:
        block_rows = min(block_rows_for(row_bytes, working_memory_mb, n_cols), MAX_BLOCK_ROWS)
    if runner is not None:
        return striped_lead_lag(
            R,
            runner,
            max_lag=max_lag,
            k_leaders=k_leaders,
            k_laggers=k_laggers,
            min_overlap=min_overlap,
            min_improvement=min_improvement,
            max_q_value=max_q_value,
            corr=corr,
            block_rows=block_rows,
            progress=progress,
        )
    k_rows = min(k_laggers, max(n_cols - 1, 0))
    k_cols = min(k_leaders, max(n_cols - 1, 0))
    pool_state = ColumnPool(n_cols, k_cols, max_pool=max_pool(n_cols, k_cols))
    row_pairs: list[np.ndarray] = []

    blocks = row_blocks(n_cols, row_bytes, working_memory_mb, block_rows=block_rows)
    scanned = k_rows > 0 or k_cols > 0
    one_pass = counts_with_bounds(scanned, corr, max_q_value)
    with worker_pool() as pool:
        window = standardize(R, pool, layout="lead-lag")
        exact = ExactPass(window, max_lag, min_overlap)
        counted = 0 if one_pass else count_items(n_cols, n_cols)
        steps = counted + len(blocks)  # progress: the count's items, then the scan's blocks
        bounds = None
        if one_pass and corr is not None:
            bin_limit = N_BINS
            sync = corr

            def bounds(start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                return exact.bound_block(start, stop, sync, min_improvement, pool)

        else:
            exact.run(
                0,
                n_cols,
                pool,
                progress=None if progress is None else lambda done, _: progress(done, steps),
            )
            counts = exact.counts()
            bin_limit = candidate_bin_limit(counts, max_q_value, max_lag)
        screen = make_screen(
            window, max_lag, corr is None, min_overlap, min_improvement, bin_limit, exact.data
        )
        for done, (start, stop) in enumerate(blocks, start=1):
            if scanned:
                row_pairs.append(
                    scan_block(start, stop, corr, screen, k_rows, pool, pool_state, bounds=bounds)
                )
            if progress is not None:
                progress(counted + done, steps)
        if one_pass:
            counts = exact.counts()  # every pair counted: drops the threads' buffers
        if k_cols > 0:
            row_pairs.append(pool_state.select(screen, pool))

        pairs = union_sorted(
            np.concatenate(row_pairs) if row_pairs else np.empty(0, LEAD_LAG_DTYPE)
        )
        return annotate(pairs, screen.data, counts, max_lag, min_overlap, pool)
