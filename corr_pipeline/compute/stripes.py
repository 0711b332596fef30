"""The products in stripes of rows, for a runner that maps them over other processes (Dask).

A stripe is a range ``[start, stop)`` of rows of the output (leaders, for the lead-lag scan).
The stripe functions here run one stripe in whatever process the runner picks and are what a
task of a cluster runs:

- :func:`correlation_stripe` writes, *in place* into the caller's output files (the memory
  maps' files), rows ``[start, stop)`` of ``corr`` and ``overlap`` from the diagonal on;
  once all of them are done, :func:`mirror_stripe` writes the same rows left of the diagonal,
  the transpose of the column block above them. Together: the bytes the threaded
  :func:`~corr_pipeline.compute.correlation.pairwise_correlation` writes. Every byte of the
  outputs is written by one task, in long runs of contiguous values (one per row; written
  column-wise, the mirror would be one short write per row below the stripe,
  N² / (2 · stripe_rows) calls), and a task run twice (a retried one) writes the same bytes
  again.
- :func:`neighbors_stripe` returns the top-k rows ``[start, stop)`` (N_stripe x k, small),
  reading its rows of ``corr`` from the file.
- :func:`lead_lag_stripe` runs the screened scan of :mod:`~corr_pipeline.compute.lead_lag` on
  its leaders and returns their final per-leader top-k pairs, its per-lagger top-k lower
  bounds and its column candidates (pairs whose upper bound reaches both its own per-lagger
  threshold and the :class:`LaggerFloor` of the stripes finished before it), not evaluated;
  :func:`merge_lead_lag_stripes` takes the k-th largest lower bound over every stripe, as
  the threaded scan's threshold, and evaluates the candidates that reach it in this process,
  as the threaded scan evaluates its pool (its pairs less those below the floors): no more
  exact evaluations than the threaded scan's, whatever the stripes and their timing.

Bit-identical to the threads for any stripe size and any number of processes: every value
comes from the same product call on the fixed tile grid
(:mod:`~corr_pipeline.compute.tiling`), with BLAS on one thread in every process, whichever
stripe or process issues it, or from the same exact per-pair evaluation. The per-lagger merge
is exact because the top-k of a union of disjoint candidate sets under a total order
((improvement desc, leader asc)) is the top-k of the union of their top-k's.

Only ``R`` (T x N float32) goes to the processes (the runner ships it once per call); each
process standardises it once per call (``token``) and caches the window for the call's other
stripes (:func:`_context`). The output files must be reachable under the same path by every
process (the matrix store's root, a shared file system when the workers are on several hosts);
a stripe writes exactly its byte ranges with ``pwrite`` (never whole pages through a map, which
on a network file system would write back the neighbouring bytes another host wrote; on a
local one, ``pwrite`` into fresh files is also faster than maps).
"""

from __future__ import annotations

import mmap
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from corr_pipeline.compute import lead_lag as lead_lag_module
from corr_pipeline.compute.correlation import PairCorrelator, Progress
from corr_pipeline.compute.kernels import transpose_columns
from corr_pipeline.compute.neighbors import Neighbors, fill_top_k_rows
from corr_pipeline.compute.standardize import Standardized, make_side, standardize
from corr_pipeline.compute.tiling import GEMM_TILE, row_blocks
from corr_pipeline.compute.workers import thread_buffer, worker_pool

T = TypeVar("T")

DEFAULT_STRIPE_ROWS = 4 * GEMM_TILE
"""Rows per stripe (a multiple of the tile, so no product is issued twice); results do not
depend on it. 512 rows at N = 24,000 is 47 stripes: enough for the workers to balance the
triangle's uneven stripes, few enough that per-task overhead (~ms) is nothing."""

CORRELATION_STRIPE_ROWS = 16 * GEMM_TILE
"""Rows per correlation stripe: the second pass reads the column block above its rows back
from the file, ``stripe_rows`` values of each row above it, which 512-row stripes read in
runs too short to keep up with the threads. Its buffers are up to 2 x 2,048 x N x 6 bytes
per worker thread (~590 MB at N = 24,000, ~1.6 GB at 64,000)."""

_CACHED_CONTEXTS = 2
"""Contexts (standardised windows) a process keeps: the correlation and the lead-lag scan of
one snapshot may run at the same time on one cluster."""


class StripeFeedback(Protocol):
    """What a stripe learns from the stripes done before it (see :meth:`StripeRunner.map`)."""

    def current(self) -> Any:
        """The last argument of the next stripe submitted."""
        ...

    def update(self, result: Any) -> None:
        """Take in a finished stripe's result."""
        ...


class StripeRunner(Protocol):
    """Maps a stripe function over stripes, possibly in other processes.

    ``map(fn, shared, stripes, *args, progress=...)`` calls ``fn(shared, stripe, token, *args)``
    once per stripe (``token``: a string unique to this call, the same for all its stripes) and
    returns the results in the order of ``stripes``; ``progress(done, total)`` after each
    stripe, as they complete. ``shared`` (the returns, or None) is shipped once, not per stripe.
    With ``feedback``, stripes are submitted in order, no more at a time than the runner runs
    at once, as ``fn(shared, stripe, token, *args, feedback.current())``, and
    ``feedback.update(result)`` is called on each result as it completes (each stripe once,
    whatever was retried); the results must not depend on when that happens.
    """

    def map(
        self,
        fn: Callable[..., T],
        shared: np.ndarray | None,
        stripes: Sequence[tuple[int, int]],
        *args: Any,
        progress: Progress | None = None,
        feedback: StripeFeedback | None = None,
    ) -> list[T]: ...


class MappedFile(NamedTuple):
    """Where an array lives in a file, to memory-map it in another process."""

    path: str
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, array: np.ndarray) -> MappedFile:
        """The file behind ``array``, a C-contiguous ``np.memmap`` of a whole file region."""
        if not isinstance(array, np.memmap) or array.filename is None:
            raise ValueError("a striped product needs its matrices as file-backed np.memmap")
        if not array.flags.c_contiguous:
            raise ValueError("a striped product needs C-contiguous memory maps")
        return cls(str(array.filename), int(array.offset), array.dtype.str, tuple(array.shape))

    def open(self, mode: Literal["r", "r+"]) -> np.memmap:
        """The array, mapped (``mode`` ``"r"`` or ``"r+"``; writes go straight to the file)."""
        return np.memmap(
            self.path, dtype=np.dtype(self.dtype), mode=mode, offset=self.offset, shape=self.shape
        )

    def open_columns(self) -> np.ndarray:
        """The array, mapped read-only for reading a few columns of many rows: ``MADV_RANDOM``,
        so that a page fault reads (or maps) its own page only, not the 128 KB around it that
        the kernel's read-around would bring in for the next rows' columns, which lie one row
        (``4 N`` bytes) further on."""
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mapped, "madvise"):
            mapped.madvise(mmap.MADV_RANDOM)
        return np.ndarray(self.shape, np.dtype(self.dtype), buffer=mapped, offset=self.offset)


class InProcessRunner:
    """A :class:`StripeRunner` in the calling thread: the stripes one after the other, with a
    token per call (for warm-ups, tests and single-process comparisons)."""

    def map(
        self,
        fn: Callable[..., T],
        shared: np.ndarray | None,
        stripes: Sequence[tuple[int, int]],
        *args: Any,
        progress: Progress | None = None,
        feedback: StripeFeedback | None = None,
    ) -> list[T]:
        token = f"{fn.__name__}-{uuid.uuid4().hex}"
        results: list[T] = []
        for stripe in stripes:
            extra = () if feedback is None else (feedback.current(),)
            results.append(fn(shared, stripe, token, *args, *extra))
            if feedback is not None:
                feedback.update(results[-1])
            if progress is not None:
                progress(len(results), len(stripes))
        return results


def stripes_of(n_rows: int, stripe_rows: int = DEFAULT_STRIPE_ROWS) -> list[tuple[int, int]]:
    """``[start, stop)`` stripes of ``stripe_rows`` rows covering ``[0, n_rows)``."""
    return row_blocks(n_rows, 1, block_rows=stripe_rows)


# --------------------------------------------------------------------------------------------
# per-process context: the standardised window of one call, built once
# --------------------------------------------------------------------------------------------


class _Inline(Executor):
    """Runs a stripe's work items one after the other in the task's thread: the cluster's
    parallelism is its tasks (one per worker thread)."""

    def map(self, fn, *iterables, timeout=None, chunksize=1):  # type: ignore[no-untyped-def]
        return map(fn, *iterables)


@dataclass
class _Context:
    window: Standardized
    correlator: PairCorrelator | None = None
    screens: dict[tuple, Any] = field(default_factory=dict)  # lead-lag screens


_contexts: OrderedDict[str, _Context] = OrderedDict()
_contexts_lock = threading.Lock()


def _context(token: str, R: np.ndarray) -> _Context:
    """The standardised window of call ``token`` in this process (built on first use, kept for
    the call's other stripes; the oldest of more than :data:`_CACHED_CONTEXTS` is dropped).

    Sets this process's BLAS to one thread for good, as the threaded path does for its pool:
    a product's rounding must not depend on the threads BLAS uses.
    """
    with _contexts_lock:
        found = _contexts.get(token)
        if found is not None:
            _contexts.move_to_end(token)
            return found
        threadpool_limits(limits=1, user_api="blas")
        context = _Context(standardize(R))
        _contexts[token] = context
        while len(_contexts) > _CACHED_CONTEXTS:
            _contexts.popitem(last=False)
        return context


def _correlator(context: _Context) -> PairCorrelator:
    """The synchronous correlator of the call's window (whole window on both sides)."""
    if context.correlator is None:
        w = context.window
        side = make_side(w, 0, w.z.shape[0])
        context.correlator = PairCorrelator(w, side, side, _Inline())
    return context.correlator


# --------------------------------------------------------------------------------------------
# correlation (SPEC §3)
# --------------------------------------------------------------------------------------------


def correlation_stripe(
    R: np.ndarray,
    stripe: tuple[int, int],
    token: str,
    min_overlap: int,
    corr_file: MappedFile,
    overlap_file: MappedFile,
) -> None:
    """Rows ``[start, stop)`` of ``corr`` / ``overlap`` from column ``start`` on, written in
    place into the two files: every pair of the stripe's rows with a column at or right of
    them (the first of the two passes of :func:`striped_correlation`).

    By the same work items as the threaded path (one product per tile and column chunk), the
    strictly lower triangle of the diagonal block then copied from its upper one, as the
    threaded path mirrors it. Into the thread's reused buffers
    (:func:`~corr_pipeline.compute.workers.thread_buffer`: at most the first stripe's rows,
    ``stripe_rows x N x 6`` bytes at T >= 128, 295 MB at N = 24,000), then one ``pwrite`` per
    row.
    """
    context = _context(token, R)
    start, stop = stripe
    n = corr_file.shape[0]
    upper = [
        thread_buffer(f"upper-{i}", (stop - start, n - start), f.dtype)
        for i, f in enumerate((corr_file, overlap_file))
    ]
    _correlator(context).run(
        stripe,
        symmetric=True,
        min_overlap=min_overlap,
        out_origin=(start, start),
        out_corr=upper[0],
        out_overlap=upper[1],
    )
    below = np.tril_indices(stop - start, -1)
    for file, block in zip((corr_file, overlap_file), upper, strict=True):
        diagonal = block[:, : stop - start]
        diagonal[below] = diagonal.T[below]
        _write_rows(file, block, start, start)


def mirror_stripe(
    _shared: None,
    stripe: tuple[int, int],
    token: str,
    corr_file: MappedFile,
    overlap_file: MappedFile,
) -> None:
    """Rows ``[start, stop)`` of ``corr`` / ``overlap`` left of column ``start``: the transpose
    of the column block ``matrix[:start, start:stop]`` that the first pass wrote (the second
    pass of :func:`striped_correlation`, once every stripe of the first is done), read from a
    map of the file and written back as one contiguous run per row. A plain copy of values, so
    the matrices are exactly symmetric, as the threaded path's."""
    start, stop = stripe
    if start == 0:
        return
    for i, file in enumerate((corr_file, overlap_file)):
        above = file.open_columns()
        lower = thread_buffer(f"lower-{i}", (stop - start, start), np.dtype(file.dtype))
        transpose_columns(above[:start], start, lower)
        del above
        _write_rows(file, lower, start, 0)


def _write_rows(file: MappedFile, rows: np.ndarray, first_row: int, first_col: int) -> None:
    """``matrix[first_row + r, first_col : first_col + width] = rows[r]`` in ``file``, with
    ``os.pwrite`` of exactly those byte ranges; the caller's map of the file sees them at once."""
    if rows.size == 0:
        return
    n, itemsize = file.shape[1], rows.itemsize
    width = rows.shape[1] * itemsize
    flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
    fd = os.open(file.path, os.O_WRONLY)
    try:
        for r in range(rows.shape[0]):
            at = file.offset + ((first_row + r) * n + first_col) * itemsize
            _write_exactly(fd, flat[r * width : (r + 1) * width], at, file.path)
    finally:
        os.close(fd)


def _write_exactly(fd: int, data: memoryview, at: int, path: str) -> None:
    if os.pwrite(fd, data, at) != data.nbytes:
        raise OSError(f"short write into {path} at byte {at}")


def striped_correlation(
    R: np.ndarray,
    runner: StripeRunner,
    *,
    min_overlap: int,
    out_corr: np.ndarray,
    out_overlap: np.ndarray,
    stripe_rows: int = CORRELATION_STRIPE_ROWS,
    progress: Progress | None = None,
) -> None:
    """:func:`~corr_pipeline.compute.correlation.pairwise_correlation` into the file-backed
    ``out_corr`` / ``out_overlap`` on ``runner``, in two passes over the stripes: every
    :func:`correlation_stripe` (its rows from the diagonal on), then every :func:`mirror_stripe`
    (its rows left of the diagonal, the transpose of what the first pass wrote above it), so
    that every write is a long contiguous run of a row; bit-identical to the threaded function.
    ``progress(done, tasks)`` after each task of either pass."""
    from corr_pipeline.compute.correlation import check_correlation_args

    check_correlation_args(R, min_overlap, out_corr, out_overlap)
    stripes = stripes_of(R.shape[1], stripe_rows)
    below = [stripe for stripe in stripes if stripe[0] > 0]
    tasks = len(stripes) + len(below)
    files = (MappedFile.of(out_corr), MappedFile.of(out_overlap))

    def offset(first: int) -> Progress | None:
        if progress is None:
            return None
        return lambda done, _total: progress(first + done, tasks)

    runner.map(correlation_stripe, R, stripes, min_overlap, *files, progress=offset(0))
    runner.map(mirror_stripe, None, below, *files, progress=offset(len(stripes)))


# --------------------------------------------------------------------------------------------
# neighbors (SPEC §4)
# --------------------------------------------------------------------------------------------


def neighbors_stripe(
    _R: None,
    stripe: tuple[int, int],
    _token: str,
    k: int,
    corr_file: MappedFile,
    overlap_file: MappedFile | None,
    working_memory_mb: float,
) -> Neighbors:
    """The top-k rows ``stripe`` of the file's ``corr`` (and ``overlap`` at them)."""
    corr = corr_file.open("r")
    overlap = None if overlap_file is None else overlap_file.open("r")
    return fill_top_k_rows(corr, overlap, k, stripe, working_memory_mb)


def striped_neighbors(
    corr: np.ndarray,
    runner: StripeRunner,
    *,
    k: int,
    overlap: np.ndarray | None = None,
    working_memory_mb: float,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
    progress: Progress | None = None,
) -> Neighbors:
    """:func:`~corr_pipeline.compute.neighbors.top_k_neighbors` of the file-backed ``corr``,
    one :func:`neighbors_stripe` per stripe on ``runner``; identical to it."""
    from corr_pipeline.compute.neighbors import check_neighbors_args

    k = check_neighbors_args(corr, k, overlap, working_memory_mb)
    overlap_file = None if overlap is None else MappedFile.of(overlap)
    stripes = stripes_of(corr.shape[0], stripe_rows)
    parts = runner.map(
        neighbors_stripe,
        None,
        stripes,
        k,
        MappedFile.of(corr),
        overlap_file,
        working_memory_mb,
        progress=progress,
    )
    if not parts:
        return fill_top_k_rows(corr, overlap, k, (0, 0), working_memory_mb)
    return Neighbors(
        np.concatenate([p.index for p in parts]),
        np.concatenate([p.corr for p in parts]),
        None if overlap is None else np.concatenate([p.overlap for p in parts]),
    )


# --------------------------------------------------------------------------------------------
# lead-lag (SPEC §6): the dispatch only; the per-block scan is lead_lag's
# --------------------------------------------------------------------------------------------


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

    def update(self, part: LeadLagStripe) -> None:
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
            return
        laggers, inverse, counts = np.unique(
            known["lagger"], return_inverse=True, return_counts=True
        )
        table = np.full((laggers.size, k + int(counts.max())), -np.inf, dtype=np.float32)
        table[:, :k] = self.exact[laggers]
        order = np.argsort(inverse, kind="stable")
        rank = np.arange(order.size) - np.repeat(np.cumsum(counts) - counts, counts)
        table[inverse[order], k + rank] = known["improvement"][order]
        self.exact[laggers] = np.sort(table, axis=1)[:, -k:]


def _lead_lag_screen(
    context: _Context, max_lag: int, with_sync: bool, min_overlap: int, min_improvement: float
) -> Any:
    """The lead-lag screen of the call's window (built once per process and call)."""
    key = (max_lag, with_sync, min_overlap, min_improvement)
    found = context.screens.get(key)
    if found is None:
        found = lead_lag_module.make_screen(
            context.window, max_lag, with_sync, min_overlap, min_improvement
        )
        context.screens[key] = found
    return found


def lead_lag_stripe(
    R: np.ndarray,
    stripe: tuple[int, int],
    token: str,
    corr_file: MappedFile | None,
    max_lag: int,
    k_rows: int,
    k_cols: int,
    min_overlap: int,
    min_improvement: float,
    block_rows: int,
    floor: np.ndarray | None = None,
) -> LeadLagStripe:
    """The lead-lag scan of leaders ``stripe``, block by block as the threaded scan: its rows'
    final top-k; its column candidates, the pairs whose upper bound reaches their lagger's
    threshold (the k-th largest lower bound over the stripe's leaders, and ``floor``, a
    :class:`LaggerFloor` of other stripes), pooled but not evaluated; its table of lower
    bounds. The pools are evaluated after the last stripe, against the lower bounds of every
    leader, as the threaded scan evaluates its pool (:func:`merge_lead_lag_stripes`); a pool
    that outgrows the threaded scan's cap is evaluated here, as there."""
    context = _context(token, R)
    corr = None if corr_file is None else corr_file.open("r")
    n_cols = R.shape[1]
    screen = _lead_lag_screen(context, max_lag, corr is None, min_overlap, min_improvement)
    inline = _Inline()
    columns = lead_lag_module.ColumnPool(
        n_cols, k_cols, max_pool=lead_lag_module.max_pool(n_cols, k_cols), floor=floor
    )
    row_pairs: list[np.ndarray] = [np.empty(0, lead_lag_module.LEAD_LAG_DTYPE)]
    start0, stop0 = stripe
    for start, stop in row_blocks(stop0 - start0, 1, block_rows=block_rows):
        if k_rows > 0 or k_cols > 0:
            row_pairs.append(
                lead_lag_module.scan_block(
                    start0 + start,
                    start0 + stop,
                    corr,
                    screen,
                    k_rows,
                    inline,
                    columns,
                    thread_buffer,  # the block's b x N arrays, reused from block to block
                )
            )
    column_pairs = lead_lag_module.pair_records(columns.top, owner_is_leader=False)
    if floor is not None:  # below the floor: in no final top-k (see LaggerFloor)
        column_pairs = column_pairs[column_pairs["improvement"] >= floor[column_pairs["lagger"]]]
    leaders, laggers, upper, syncs = columns.pooled()
    pool = np.empty(leaders.size, POOL_DTYPE)
    pool["leader"], pool["lagger"], pool["upper"], pool["sync"] = leaders, laggers, upper, syncs
    return LeadLagStripe(
        np.concatenate(row_pairs), pool, column_pairs, np.sort(columns.lower, axis=1)
    )


def lead_lag_screen(
    R: np.ndarray, max_lag: int, with_sync: bool, min_overlap: int, min_improvement: float
) -> Any:
    """The window and screen :func:`merge_lead_lag_stripes` evaluates pooled candidates on
    (``R`` standardised on this thread, as in a worker: the same values)."""
    return lead_lag_module.make_screen(
        standardize(R), max_lag, with_sync, min_overlap, min_improvement
    )


def _select_pooled(parts: Sequence[LeadLagStripe], screen: Any, floor: np.ndarray) -> np.ndarray:
    """Per lagger, the exact top-k of the stripes' pooled candidates whose bound reaches
    ``floor`` (the :class:`LaggerFloor` of every stripe, so at least the threaded scan's
    threshold), evaluated in this process on threads as the threaded scan evaluates its pool:
    the same kernel, in the same threshold order, on its pairs less those below the floor (so
    no more evaluations than the threaded scan's)."""
    n_cols, k_cols = parts[0].lower.shape
    columns = lead_lag_module.ColumnPool(
        n_cols, k_cols, max_pool=lead_lag_module.max_pool(n_cols, k_cols), floor=floor
    )
    for part in parts:
        pool = part.pool
        columns.take(pool["leader"], pool["lagger"], pool["upper"], pool["sync"])
    if not any(part.pool.size for part in parts):
        return np.empty(0, lead_lag_module.LEAD_LAG_DTYPE)
    with worker_pool() as threads:
        return columns.select(screen, threads)


def merge_lead_lag_stripes(parts: Sequence[LeadLagStripe], screen: Any, k_cols: int) -> np.ndarray:
    """The lead-lag result from the stripes' shares (``screen``: :func:`lead_lag_screen` of
    the stripes' arguments).

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
        return np.empty(0, lead_lag_module.LEAD_LAG_DTYPE)
    pairs = [p.row_pairs for p in parts]
    if k_cols > 0:
        everyone = LaggerFloor(*parts[0].lower.shape)
        for part in parts:
            everyone.update(part)
        floor = everyone.current()
        pooled = _select_pooled(parts, screen, floor)
        column = np.concatenate([*(p.column_pairs for p in parts), pooled])
        column = column[column["improvement"] >= floor[column["lagger"]]]
        order = np.lexsort(
            (column["leader"], -column["improvement"].astype(np.float64), column["lagger"])
        )
        column = column[order]
        laggers = column["lagger"]
        rank = np.arange(column.size) - np.searchsorted(laggers, laggers, side="left")
        pairs.append(column[rank < k_cols])
    return lead_lag_module.union_sorted(np.concatenate(pairs))


def striped_lead_lag(
    R: np.ndarray,
    runner: StripeRunner,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
    corr: np.ndarray | None = None,
    block_rows: int = lead_lag_module.MAX_BLOCK_ROWS,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
    progress: Progress | None = None,
) -> np.ndarray:
    """:func:`~corr_pipeline.compute.lead_lag.find_lead_lag_pairs`, one
    :func:`lead_lag_stripe` per stripe of leaders on ``runner`` (``corr``, when given, a
    file-backed memory map), each given the :class:`LaggerFloor` of the stripes finished before
    it was submitted, then the stripes' column candidates evaluated in this process on
    threads (:func:`merge_lead_lag_stripes`, on ``R`` standardised here while the stripes
    run); exactly its result."""
    lead_lag_module.check_lead_lag_args(
        R, max_lag, k_leaders, k_laggers, min_overlap, min_improvement, corr
    )
    n_cols = R.shape[1]
    k_rows = min(k_laggers, max(n_cols - 1, 0))
    k_cols = min(k_leaders, max(n_cols - 1, 0))
    corr_file = None if corr is None else MappedFile.of(corr)
    screen_args = (max_lag, corr is None, min_overlap, float(min_improvement))
    with ThreadPoolExecutor(1, thread_name_prefix="lead-lag-screen") as background:
        # the window the pools are evaluated on, built here while the stripes run
        screen = background.submit(lead_lag_screen, R, *screen_args) if k_cols > 0 else None
        parts = runner.map(
            lead_lag_stripe,
            R,
            stripes_of(n_cols, stripe_rows),
            corr_file,
            max_lag,
            k_rows,
            k_cols,
            min_overlap,
            float(min_improvement),
            int(block_rows),
            progress=progress,
            feedback=LaggerFloor(n_cols, max(k_cols, 1)),
        )
        return merge_lead_lag_stripes(parts, None if screen is None else screen.result(), k_cols)


__all__ = [
    "CORRELATION_STRIPE_ROWS",
    "DEFAULT_STRIPE_ROWS",
    "LaggerFloor",
    "LeadLagStripe",
    "MappedFile",
    "POOL_DTYPE",
    "StripeFeedback",
    "StripeRunner",
    "correlation_stripe",
    "lead_lag_screen",
    "lead_lag_stripe",
    "merge_lead_lag_stripes",
    "neighbors_stripe",
    "striped_correlation",
    "striped_lead_lag",
    "striped_neighbors",
    "stripes_of",
]
