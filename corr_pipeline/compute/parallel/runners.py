"""The runner protocol of the striped products, and what every stripe task shares.

A *stripe* is a range ``[start, stop)`` of rows of an output (leaders, for the lead-lag scan).
The striped variant of an algorithm (``correlation/striped.py``, ``neighbors/striped.py``,
``lead_lag/striped.py``) maps a stripe function over its stripes with a :class:`StripeRunner`:
:class:`InProcessRunner` here (the stripes one after the other) or
:class:`~corr_pipeline.compute.parallel.dask_runner.DaskRunner` (tasks of a Dask cluster, in
other processes). Results are bit-identical to the threaded path for any stripe size and any
number of processes: every value comes from the same product call on the fixed tile grid
(:mod:`~corr_pipeline.compute.tiling`), with BLAS on one thread in every process, or from the
same exact per-pair evaluation.

Only ``R`` (T x N float32) goes to the processes (the runner ships it once per call); each
process standardises it once per call (``token``) and keeps it for the call's other stripes
(:func:`stripe_context`). Output files must be reachable under the same path by every process
(the matrix store's root, a shared file system when the workers are on several hosts):
:class:`MappedFile` names them.
"""

from __future__ import annotations

import mmap
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from corr_pipeline.compute.standardize import Standardized, standardize
from corr_pipeline.compute.tiling import GEMM_TILE, Progress, block_rows_for, row_blocks

T = TypeVar("T")

DEFAULT_STRIPE_ROWS = 4 * GEMM_TILE
"""Rows per stripe (a multiple of the tile, so no product is issued twice); results do not
depend on it. 512 rows at N = 24,000 is 47 stripes: enough for the workers to balance the
triangle's uneven stripes, few enough that per-task overhead (~ms) is nothing."""

CACHED_CONTEXTS = 2
"""Contexts (standardised windows) a process keeps: the correlation and the lead-lag scan of
one snapshot may run at the same time on one cluster."""


class StripeFeedback(Protocol):
    """What a stripe learns from the stripes done before it (see :meth:`StripeRunner.map`)."""

    def current(self) -> Any:
        """The last argument of the next stripe submitted."""
        ...

    def update(self, result: Any) -> Any:
        """Take in a finished stripe's result; returns what the map keeps of it (the result, or
        what is left of it once taken in)."""
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
    whatever was retried), the map returning what it returns; the results must not depend on
    when that happens.
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
            result = fn(shared, stripe, token, *args, *extra)
            results.append(result if feedback is None else feedback.update(result))
            if progress is not None:
                progress(len(results), len(stripes))
        return results


def stripes_of(n_rows: int, stripe_rows: int = DEFAULT_STRIPE_ROWS) -> list[tuple[int, int]]:
    """``[start, stop)`` stripes of ``stripe_rows`` rows covering ``[0, n_rows)``."""
    return row_blocks(n_rows, 1, block_rows=stripe_rows)


def budget_stripe_rows(row_bytes: int, working_memory_mb: float, n_rows: int, most: int) -> int:
    """Rows per stripe for a task whose temporaries take ``row_bytes`` per row: as many whole
    tiles as fit in ``working_memory_mb`` (at least one tile), at most ``most``; the results
    do not depend on it."""
    rows = block_rows_for(row_bytes, working_memory_mb, n_rows)
    return int(min(most, max(GEMM_TILE, rows // GEMM_TILE * GEMM_TILE)))


class InlineExecutor(Executor):
    """Runs a stripe's work items one after the other in the task's thread: the cluster's
    parallelism is its tasks (one per worker thread)."""

    def map(self, fn, *iterables, timeout=None, chunksize=1):  # type: ignore[no-untyped-def]
        return map(fn, *iterables)


@dataclass
class StripeContext:
    """What the stripes of one call share in a process: the standardised ``window``, and
    ``derived`` objects an algorithm builds from it once (its correlator, its screens)."""

    window: Standardized
    derived: dict[Any, Any] = field(default_factory=dict)


_contexts: OrderedDict[str, StripeContext] = OrderedDict()
_contexts_lock = threading.Lock()


def stripe_context(token: str, R: np.ndarray) -> StripeContext:
    """The standardised window of call ``token`` in this process (built on first use, kept for
    the call's other stripes; the oldest of more than :data:`CACHED_CONTEXTS` is dropped).

    Sets this process's BLAS to one thread for good, as the threaded path does for its pool:
    a product's rounding must not depend on the threads BLAS uses.
    """
    with _contexts_lock:
        found = _contexts.get(token)
        if found is not None:
            _contexts.move_to_end(token)
            return found
        threadpool_limits(limits=1, user_api="blas")
        context = StripeContext(standardize(R))
        _contexts[token] = context
        while len(_contexts) > CACHED_CONTEXTS:
            _contexts.popitem(last=False)
        return context


__all__ = [
    "CACHED_CONTEXTS",
    "DEFAULT_STRIPE_ROWS",
    "InProcessRunner",
    "InlineExecutor",
    "MappedFile",
    "StripeContext",
    "StripeFeedback",
    "StripeRunner",
    "budget_stripe_rows",
    "stripe_context",
    "stripes_of",
]
