"""The lead-lag scan in stripes of leaders, for a runner that maps them over other processes.

:func:`lead_lag_stripe` runs the sweep and selection of :mod:`~corr_pipeline.compute.lead_lag.scan`
on its leaders (counting their p-values in the same sweep when there is no q-value condition,
as the threaded scan does) and returns their final per-leader top-k pairs, its per-lagger top-k
lower bounds and its column candidates (pairs whose upper bound reaches both its own per-lagger
threshold and the :class:`LaggerFloor` of the stripes finished before it), not evaluated;
:func:`merge_lead_lag_stripes` takes the k-th largest lower bound over every stripe, as the
threaded scan's threshold, and evaluates the candidates that reach it in this process, as the
threaded scan evaluates its pool (its pairs less those below the floors): no more exact
evaluations than the threaded scan's, whatever the stripes and their timing. The per-lagger
merge is exact because the top-k of a union of disjoint candidate sets under a total order
((improvement desc, leader asc)) is the top-k of the union of their top-k's.

With a q-value condition the counts come first: :func:`significance_stripe` sweeps its leaders
for their p-values and each leader's smallest possible bin; then the lead-lag stripes run over
the leaders that can have a significant pair only, as the threaded scan's second sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from corr_pipeline.compute.lead_lag.p_values import N_BINS
from corr_pipeline.compute.lead_lag.scan import (
    LEAD_LAG_DTYPE,
    MAX_BLOCK_ROWS,
    ColumnPool,
    Evaluation,
    check_lead_lag_args,
    make_evaluation,
    max_pool,
    pair_records,
    scan_block,
    union_sorted,
)
from corr_pipeline.compute.lead_lag.significance import annotate, candidate_bin_limit
from corr_pipeline.compute.lead_lag.sweep import (
    PValueCounts,
    Sweep,
    SweepInputs,
    block_bounds,
    sweep_inputs,
)
from corr_pipeline.compute.parallel.runners import (
    DEFAULT_STRIPE_ROWS,
    InlineExecutor,
    MappedFile,
    StripeContext,
    StripeRunner,
    stripe_context,
    stripes_of,
)
from corr_pipeline.compute.standardize import standardize
from corr_pipeline.compute.tiling import GEMM_TILE, Progress, row_blocks
from corr_pipeline.compute.workers import thread_buffer, worker_pool

__all__ = [
    "POOL_DTYPE",
    "LaggerFloor",
    "LeadLagStripe",
    "StripesTakenIn",
    "lead_lag_evaluation",
    "lead_lag_stripe",
    "merge_lead_lag_stripes",
    "significance_stripe",
    "striped_lead_lag",
]

SIGNIFICANCE_STRIPES = 8
"""The count of p-values runs in at most this many stripes: each returns its histogram (the
bins its pairs fill, a few MB), so fewer, larger stripes ship less."""


POOL_DTYPE = np.dtype(
    [("leader", np.int32), ("lagger", np.int32), ("upper", np.float32), ("sync", np.float32)]
)
"""A pooled column candidate: its upper improvement bound and ``corr`` there (NaN without it)."""


class LeadLagStripe(NamedTuple):
    """One stripe's share of the selection (see :func:`merge_lead_lag_stripes`)."""

    row_pairs: np.ndarray  # its leaders' k_laggers best (final)
    pool: np.ndarray  # POOL_DTYPE: its column candidates, not evaluated
    column_pairs: np.ndarray  # per lagger, the exact k_leaders best of the candidates the
    # stripe evaluated itself (only when its pool outgrew the cap; usually empty)
    lower: np.ndarray  # N x k_leaders, ascending: per lagger, its leaders' largest lower bounds
    counts: PValueCounts | None = None  # its leaders' p-values, when it counted them


class StripeCount(NamedTuple):
    """A :func:`significance_stripe`'s result: its leaders' p-value counts and, per leader, the
    smallest bin any of its pairs' p-values can be in."""

    counts: PValueCounts
    activity: np.ndarray


class LaggerFloor:
    """Per lagger, a floor under its final ``k``-th best improvement from the stripes taken in
    (a :class:`StripeFeedback` for :func:`lead_lag_stripe`):

        floor[j] = max(k-th largest lower bound of (i, j), k-th largest exact improvement of
                       (i, j) known), over the leaders i of those stripes,

    the exact improvements known being those of the stripes' row selections and evaluated
    column pairs, each pair once. Stripes have disjoint leaders, so each k-th is over k
    distinct pairs, and a k-th largest over some of the pairs never exceeds the k-th largest
    over all of them: a pair whose upper bound is strictly below the floor is in no final
    top-k (k pairs are strictly before it), whichever stripes were taken in.
    """

    def __init__(self, n_cols: int, k: int) -> None:
        self.lower = np.full((n_cols, k), -np.inf, dtype=np.float32)
        self.exact = np.full((n_cols, k), -np.inf, dtype=np.float32)

    def current(self) -> np.ndarray:
        return np.maximum(self.lower[:, 0], self.exact[:, 0])

    def update(self, part: LeadLagStripe) -> LeadLagStripe:
        k = self.lower.shape[1]
        both = np.concatenate([self.lower, part.lower], axis=1)
        self.lower = np.sort(both, axis=1)[:, -k:]
        known = np.concatenate([part.row_pairs, part.column_pairs])
        _, first = np.unique(
            known["leader"].astype(np.int64) * self.lower.shape[0] + known["lagger"],
            return_index=True,
        )
        known = known[first]  # a pair both in a row's and in a column's selection counts once
        if known.size == 0:
            return part
        laggers, inverse, counts = np.unique(
            known["lagger"], return_inverse=True, return_counts=True
        )
        table = np.full((laggers.size, k + int(counts.max())), -np.inf, dtype=np.float32)
        table[:, :k] = self.exact[laggers]
        order = np.argsort(inverse, kind="stable")
        rank = np.arange(order.size) - np.repeat(np.cumsum(counts) - counts, counts)
        table[inverse[order], k + rank] = known["improvement"][order]
        self.exact[laggers] = np.sort(table, axis=1)[:, -k:]
        return part


class StripesTakenIn(LaggerFloor):
    """The :class:`LaggerFloor` of the stripes taken in, and the sum of their p-value counts
    (one ``int64`` per bin, 69 MB): each stripe's counts (a megabyte or more) are added as it
    arrives and dropped from what the map keeps, so the run holds one histogram, not every
    stripe's."""

    def __init__(self, n_cols: int, k: int) -> None:
        super().__init__(n_cols, k)
        self.histogram: np.ndarray | None = None

    def update(self, part: LeadLagStripe) -> LeadLagStripe:
        part = super().update(part)
        if part.counts is None:
            return part
        if self.histogram is None:
            self.histogram = np.zeros(N_BINS, dtype=np.int64)
        self.histogram[part.counts.bins] += part.counts.counts  # a stripe's bins are distinct
        return part._replace(counts=None)

    def counts(self) -> PValueCounts:
        """The p-value counts of every stripe taken in."""
        if self.histogram is None:
            return PValueCounts.merge([])
        bins = np.flatnonzero(self.histogram)
        return PValueCounts(bins.astype(np.int32), self.histogram[bins])


def _inputs(context: StripeContext, max_lag: int, min_overlap: int) -> SweepInputs:
    """The sweep's inputs of the call's window (built once per process and call)."""
    key = ("lead-lag sweep", max_lag, min_overlap)
    found = context.derived.get(key)
    if found is None:
        found = sweep_inputs(context.window, max_lag, min_overlap)
        context.derived[key] = found
    return found


def significance_stripe(
    R: np.ndarray, stripe: tuple[int, int], token: str, max_lag: int, min_overlap: int
) -> StripeCount:
    """The histogram of the p-values of the pairs whose leader is in ``stripe`` and each such
    leader's smallest possible bin (``sweep.Sweep.activity``)."""
    context = stripe_context(token, R)
    sweep = Sweep(_inputs(context, max_lag, min_overlap))
    inline = InlineExecutor()
    sweep.run(np.arange(*stripe), inline, activity=True)
    counts = sweep.counts(inline)
    return StripeCount(counts, sweep.activity[stripe[0] : stripe[1]].copy())


def lead_lag_stripe(
    R: np.ndarray,
    stripe: tuple[int, int],
    token: str,
    active: np.ndarray | None,
    corr_file: MappedFile | None,
    max_lag: int,
    k_rows: int,
    k_cols: int,
    min_overlap: int,
    min_improvement: float,
    bin_limit: int,
    block_rows: int,
    count: bool,
    floor: np.ndarray | None = None,
) -> LeadLagStripe:
    """The lead-lag scan of the leaders ``stripe`` (of ``active``, when given: the leaders that
    can have a significant pair), block by block as the threaded scan: its rows' final top-k;
    its column candidates, the pairs whose upper bound reaches their lagger's threshold (the
    k-th largest lower bound over the stripe's leaders, and ``floor``, a :class:`LaggerFloor`
    of other stripes), pooled but not evaluated; its table of lower bounds. The pools are
    evaluated after the last stripe, against the lower bounds of every leader, as the threaded
    scan evaluates its pool (:func:`merge_lead_lag_stripes`); a pool that outgrows the threaded
    scan's cap is evaluated here, as there. With ``count``, the sweep counts the leaders'
    p-values too: the counts come with the stripe."""
    context = stripe_context(token, R)
    corr = None if corr_file is None else corr_file.open("r")
    n_cols = R.shape[1]
    sweep = Sweep(_inputs(context, max_lag, min_overlap))
    evaluation = make_evaluation(
        context.window, max_lag, corr is None, min_overlap, min_improvement, bin_limit, sweep.data
    )
    inline = InlineExecutor()
    leaders = np.arange(*stripe) if active is None else active[stripe[0] : stripe[1]]
    columns = ColumnPool(n_cols, k_cols, max_pool=max_pool(n_cols, k_cols), floor=floor)
    row_pairs: list[np.ndarray] = [np.empty(0, LEAD_LAG_DTYPE)]
    for start, stop in row_blocks(leaders.size, 1, block_rows=block_rows):
        block = leaders[start:stop]
        bounds = block_bounds(
            sweep,
            block,
            corr,
            min_improvement,
            bin_limit,
            inline,
            count=count,
            empty=thread_buffer,  # the block's b x N arrays, reused from block to block
        )
        row_pairs.append(
            scan_block(block, bounds, corr is not None, evaluation, k_rows, inline, columns)
        )
    column_pairs = pair_records(columns.top, owner_is_leader=False)
    if floor is not None:  # below the floor: in no final top-k (see LaggerFloor)
        column_pairs = column_pairs[column_pairs["improvement"] >= floor[column_pairs["lagger"]]]
    pooled_leaders, laggers, upper, syncs = columns.pooled()
    pool = np.empty(pooled_leaders.size, POOL_DTYPE)
    pool["leader"], pool["lagger"], pool["upper"], pool["sync"] = (
        pooled_leaders,
        laggers,
        upper,
        syncs,
    )
    return LeadLagStripe(
        np.concatenate(row_pairs),
        pool,
        column_pairs,
        np.sort(columns.lower, axis=1),
        sweep.counts(inline) if count else None,
    )


def lead_lag_evaluation(
    R: np.ndarray,
    max_lag: int,
    with_sync: bool,
    min_overlap: int,
    min_improvement: float,
    bin_limit: int = N_BINS,
) -> Evaluation:
    """The evaluation :func:`merge_lead_lag_stripes` evaluates pooled candidates with (``R``
    standardised on this thread, as in a worker: the same values)."""
    return make_evaluation(
        standardize(R, layout="lead-lag"),
        max_lag,
        with_sync,
        min_overlap,
        min_improvement,
        bin_limit,
    )


def _select_pooled(
    parts: Sequence[LeadLagStripe], evaluation: Evaluation, floor: np.ndarray
) -> np.ndarray:
    """Per lagger, the exact top-k of the stripes' pooled candidates whose bound reaches
    ``floor`` (the :class:`LaggerFloor` of every stripe, so at least the threaded scan's
    threshold), evaluated in this process on threads as the threaded scan evaluates its pool:
    the same kernel, in the same threshold order, on its pairs less those below the floor (so
    no more evaluations than the threaded scan's)."""
    n_cols, k_cols = parts[0].lower.shape
    columns = ColumnPool(n_cols, k_cols, max_pool=max_pool(n_cols, k_cols), floor=floor)
    for part in parts:
        pool = part.pool
        columns.take(pool["leader"], pool["lagger"], pool["upper"], pool["sync"])
    if not any(part.pool.size for part in parts):
        return np.empty(0, LEAD_LAG_DTYPE)
    with worker_pool() as threads:
        return columns.select(evaluation, threads)


def merge_lead_lag_stripes(
    parts: Sequence[LeadLagStripe], evaluation: Evaluation, k_cols: int
) -> np.ndarray:
    """The lead-lag result from the stripes' shares (``evaluation``: the call's, on ``R``
    standardised in this process).

    Per lagger, the final ``k_cols`` leaders are the first ``k_cols``, in (improvement desc,
    leader asc) order, the selection rule of the threaded scan, of the stripes' evaluated
    column pairs and of the best ``k_cols`` of their pooled candidates
    (:func:`_select_pooled`), side by side: every value is the pair's exact value whoever
    computes it, and a pair of the final top-k is in one of them (a stripe leaves out only
    pairs below a :class:`LaggerFloor` or below k exact values of its own, the pools' selection
    only pairs below its floor or below k exact values), so the best ``k_cols`` of the union
    are the best ``k_cols`` overall; pairs strictly below the floor of all the stripes are
    dropped before the sort. The rows' selections are final as they are; the union is sorted
    and deduplicated as the threaded scan does.
    """
    if not parts:
        return np.empty(0, LEAD_LAG_DTYPE)
    pairs = [p.row_pairs for p in parts]
    if k_cols > 0:
        everyone = LaggerFloor(*parts[0].lower.shape)
        for part in parts:
            everyone.update(part)
        floor = everyone.current()
        pooled = _select_pooled(parts, evaluation, floor)
        column = np.concatenate([*(p.column_pairs for p in parts), pooled])
        column = column[column["improvement"] >= floor[column["lagger"]]]
        order = np.lexsort(
            (column["leader"], -column["improvement"].astype(np.float64), column["lagger"])
        )
        column = column[order]
        laggers = column["lagger"]
        rank = np.arange(column.size) - np.searchsorted(laggers, laggers, side="left")
        pairs.append(column[rank < k_cols])
    return union_sorted(np.concatenate(pairs))


def striped_lead_lag(
    R: np.ndarray,
    runner: StripeRunner,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
    max_q_value: float = 1.0,
    corr: np.ndarray | None = None,
    block_rows: int = MAX_BLOCK_ROWS,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
    progress: Progress | None = None,
) -> np.ndarray:
    """:func:`~corr_pipeline.compute.lead_lag.pairs.find_lead_lag_pairs` on ``runner``: one
    :func:`lead_lag_stripe` per stripe of leaders (``corr``, when given, a file-backed memory
    map), each given the :class:`LaggerFloor` of the stripes finished before it was submitted,
    then the stripes' column candidates evaluated in this process on threads
    (:func:`merge_lead_lag_stripes`, on ``R`` standardised here while the stripes run) and the
    pairs' p- and q-values; exactly its result. Without a q-value condition the stripes count
    their leaders' p-values in the same sweep; with one, :func:`significance_stripe` counts
    them first (at most :data:`SIGNIFICANCE_STRIPES`) and only the leaders that can have a
    significant pair are scanned."""
    check_lead_lag_args(
        R, max_lag, k_leaders, k_laggers, min_overlap, min_improvement, corr, max_q_value
    )
    n_cols = R.shape[1]
    k_rows = min(k_laggers, max(n_cols - 1, 0))
    k_cols = min(k_leaders, max(n_cols - 1, 0))
    corr_file = None if corr is None else MappedFile.of(corr)
    one_pass = max_q_value >= 1.0
    counts = None
    bin_limit = N_BINS
    active = None
    stripes = stripes_of(n_cols, stripe_rows)
    if not one_pass:
        tiles = -(-n_cols // GEMM_TILE)
        counted_rows = max(1, -(-tiles // SIGNIFICANCE_STRIPES)) * GEMM_TILE
        counted = runner.map(
            significance_stripe, R, stripes_of(n_cols, counted_rows), max_lag, min_overlap
        )
        counts = PValueCounts.merge([part.counts for part in counted])
        bin_limit = candidate_bin_limit(counts, max_q_value, max_lag)
        activity = np.concatenate([part.activity for part in counted])
        active = np.flatnonzero(activity <= bin_limit)
        stripes = stripes_of(active.size, stripe_rows)
    evaluation_args = (max_lag, corr is None, min_overlap, float(min_improvement), bin_limit)
    taken_in = StripesTakenIn(n_cols, max(k_cols, 1))
    with ThreadPoolExecutor(1, thread_name_prefix="lead-lag-evaluation") as background:
        # the window the pools are evaluated on, built here while the stripes run
        pending = background.submit(lead_lag_evaluation, R, *evaluation_args)
        parts = runner.map(
            lead_lag_stripe,
            R,
            stripes,
            active,
            corr_file,
            max_lag,
            k_rows,
            k_cols,
            min_overlap,
            float(min_improvement),
            bin_limit,
            int(block_rows),
            one_pass,
            progress=progress,
            feedback=taken_in,
        )
        evaluation = pending.result()
        pairs = merge_lead_lag_stripes(parts, evaluation, k_cols)
    if counts is None:
        counts = taken_in.counts()
    with worker_pool() as threads:
        return annotate(pairs, evaluation.data, counts, max_lag, min_overlap, threads)
