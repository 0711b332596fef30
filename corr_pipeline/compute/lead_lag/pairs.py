"""The lead-lag pairs of SPEC §6: the entry point, on threads or on a runner's stripes of
leaders; the sweep is :mod:`~corr_pipeline.compute.lead_lag.sweep`, the selection
:mod:`~corr_pipeline.compute.lead_lag.scan`."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.scan import (
    LEAD_LAG_DTYPE,
    MAX_BLOCK_ROWS,
    ColumnPool,
    block_row_bytes,
    check_lead_lag_args,
    make_evaluation,
    max_pool,
    scan_block,
    union_sorted,
)
from corr_pipeline.compute.lead_lag.significance import annotate, candidate_bin_limit
from corr_pipeline.compute.lead_lag.striped import striped_lead_lag
from corr_pipeline.compute.lead_lag.sweep import Sweep, block_bounds, sweep_inputs
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
    """Lead-lag pairs of the columns of ``R`` per SPEC §6.

    Parameters
    ----------
    R : float32 (T, N) series, NaN where missing: the returns, or their market residuals
        (:func:`~corr_pipeline.compute.lead_lag.residuals.market_residuals`).
    max_lag : lags 1 .. max_lag are scanned (1 <= max_lag < T).
    k_leaders, k_laggers : per symbol, how many best leaders of it / laggers of it to keep (>= 0).
    min_overlap : minimum common finite rows for any correlation (2 <= min_overlap <= T).
    min_improvement : a pair is a candidate iff its improvement is strictly above this.
    max_q_value : and iff its q-value (SPEC §6 "Significance") is at most this; 1: no condition.
    corr : the synchronous correlation of ``R``'s columns (N × N float32, e.g. a read-only
        memory map); computed for the pairs that need it when not given.
    working_memory_mb, block_rows : block sizing; the result does not depend on them.
    progress : ``progress(done, total)`` after each work item of the sweep that counts the
        p-values when it runs alone (``max_q_value`` < 1), then each block of the scan (on a
        runner: each stripe).
    runner : None scans on this process's threads; a
        :class:`~corr_pipeline.compute.parallel.runners.StripeRunner` scans stripes of leaders
        (:func:`~corr_pipeline.compute.lead_lag.striped.striped_lead_lag`; ``corr``, when
        given, a file-backed memory map). The same pairs either way.

    Returns a structured array (:data:`LEAD_LAG_DTYPE`): ``leader, lagger, lag, lagged_corr,
    sync_corr, improvement, overlap, p_value, q_value`` and the reverse direction's
    ``reverse_lag, reverse_lagged_corr, reverse_q_value``, leader/lagger being column indices
    of ``R``, sorted by improvement desc, then leader, then lagger.

    How: one sweep (:mod:`~corr_pipeline.compute.lead_lag.sweep`) over every pair's float32
    products counts its p-value for the q-values and, block by block, bounds its improvement
    for the selection (:mod:`~corr_pipeline.compute.lead_lag.scan`). With ``max_q_value`` < 1
    the candidacy needs every count first: the sweep counts alone, keeping each leader's
    smallest possible bin, and only the leaders that can have a significant pair are swept
    again for the selection.

    Examples
    --------
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> pairs = find_lead_lag_pairs(
    ...     R, max_lag=2, k_leaders=1, k_laggers=1, min_overlap=60, max_q_value=0.05
    ... )
    >>> [(int(p["leader"]), int(p["lagger"]), int(p["lag"])) for p in pairs]  # 2 leads 3 by a day
    [(2, 3, 1)]
    >>> round(float(pairs["lagged_corr"][0]), 2), bool(pairs["q_value"][0] < 1e-6)
    (0.72, True)
    """
    check_lead_lag_args(
        R, max_lag, k_leaders, k_laggers, min_overlap, min_improvement, corr, max_q_value
    )
    n_cols = R.shape[1]
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
    blocks = row_blocks(n_cols, row_bytes, working_memory_mb, block_rows=block_rows)
    with worker_pool() as pool:
        window = standardize(R, pool, layout="lead-lag")
        sweep = Sweep(sweep_inputs(window, max_lag, min_overlap))
        scan = _Scan(sweep, corr, min_improvement, k_rows, k_cols, pool)
        if max_q_value >= 1.0:
            for done, (start, stop) in enumerate(blocks, start=1):
                scan.block(np.arange(start, stop), N_BINS, count=True)
                if progress is not None:
                    progress(done, len(blocks))
            counts = sweep.counts(pool)
            bin_limit = N_BINS
        else:
            items = [0]

            def counted(done: int, total: int) -> None:
                items[0] = total
                if progress is not None:  # the scan's blocks: as many as for every leader, at most
                    progress(done, total + len(blocks))

            sweep.run(np.arange(n_cols), pool, activity=True, progress=counted)
            counts = sweep.counts(pool)
            bin_limit = candidate_bin_limit(counts, max_q_value, max_lag)
            active = np.flatnonzero(sweep.activity <= bin_limit)
            active_blocks = row_blocks(active.size, row_bytes, block_rows=block_rows)
            for done, (start, stop) in enumerate(active_blocks, start=1):
                scan.block(active[start:stop], bin_limit, count=False)
                if progress is not None:
                    progress(items[0] + done, items[0] + len(active_blocks))
        pairs = union_sorted(scan.result(bin_limit))
        return annotate(pairs, sweep.data, counts, max_lag, min_overlap, pool)


class _Scan:
    """The selection of one call (:mod:`~corr_pipeline.compute.lead_lag.scan`) over blocks of
    leaders bounded by the sweep."""

    def __init__(
        self,
        sweep: Sweep,
        corr: np.ndarray | None,
        min_improvement: float,
        k_rows: int,
        k_cols: int,
        pool: Executor,
    ) -> None:
        self.sweep = sweep
        self.corr = corr
        self.min_improvement = min_improvement
        self.k_rows = k_rows
        self.columns = ColumnPool(
            sweep.window.n_cols, k_cols, max_pool(sweep.window.n_cols, k_cols)
        )
        self.pool = pool
        self.rows: list[np.ndarray] = []

    def evaluation(self, bin_limit: int):
        sweep = self.sweep
        return make_evaluation(
            sweep.window,
            sweep.max_lag,
            self.corr is None,
            sweep.min_overlap,
            self.min_improvement,
            bin_limit,
            sweep.data,
        )

    def block(self, leaders: np.ndarray, bin_limit: int, *, count: bool) -> None:
        """Sweep the block (``count``: counting its p-values too) and select from it."""
        if self.k_rows == 0 and self.columns.k == 0:
            if count:
                self.sweep.run(leaders, self.pool)
            return
        bounds = block_bounds(
            self.sweep, leaders, self.corr, self.min_improvement, bin_limit, self.pool, count=count
        )
        self.rows.append(
            scan_block(
                leaders,
                bounds,
                self.corr is not None,
                self.evaluation(bin_limit),
                self.k_rows,
                self.pool,
                self.columns,
            )
        )

    def result(self, bin_limit: int) -> np.ndarray:
        """The rows' selections and the columns' (the pool evaluated now), side by side."""
        found = list(self.rows)
        if self.columns.k > 0:
            found.append(self.columns.select(self.evaluation(bin_limit), self.pool))
        return np.concatenate(found) if found else np.empty(0, LEAD_LAG_DTYPE)
