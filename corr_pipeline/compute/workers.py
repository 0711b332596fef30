"""Worker threads: one per core, each running whole work items (a product, then its fused pass).

A work item's float32 product is a single-threaded BLAS call and its fused
pass a GIL-free numba function, so items run side by side in plain threads,
with no second thread pool. Measured at N = 4,000 on 2 cores, this is ~1.8×
faster than a two-threaded BLAS call followed by a parallel numba pass per
tile (the two pools spin against each other between calls). Single-threaded
products also make every value independent of the number of cores.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
from numpy.typing import DTypeLike
from threadpoolctl import ThreadpoolController


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    return max(1, len(os.sched_getaffinity(0)))


@functools.cache
def _blas_controller() -> ThreadpoolController:
    """The BLAS libraries loaded at the first call (numpy's among them: the products' BLAS,
    loaded with numpy). Inspecting the process's libraries, as each ``threadpool_limits`` call
    does, costs serial time in every pool; limiting through the cached controller almost
    none."""
    return ThreadpoolController()


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """numpy's BLAS limited to one thread for the block. A product's rounding depends on how
    BLAS splits it between its threads, so products that must come out the same in every
    process (the lead-lag sweep's) are taken inside this, whatever pool runs them."""
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


@contextmanager
def worker_pool() -> Iterator[ThreadPoolExecutor]:
    """A pool of one thread per available core, with numpy's BLAS limited to one thread."""
    with (
        single_threaded_blas(),
        ThreadPoolExecutor(available_cores(), thread_name_prefix="corr-worker") as pool,
    ):
        yield pool


_buffers = threading.local()


def fresh_buffer(_name: str, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """A new uninitialised array of ``shape``: :func:`thread_buffer`'s signature, for a caller
    that keeps nothing from call to call."""
    return np.empty(shape, dtype)


def thread_buffer(name: str, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """An uninitialised array of ``shape`` for the calling thread, reused from call to call
    under the same ``name`` (grown when too small), kept as long as the thread lives.

    For the arrays of megabytes a work item or a stripe fills and drops: a fresh one each time
    is new pages to fault in and zero whenever the allocator maps arrays this large afresh, as
    glibc does for every one of them in a Dask worker (whose ``MALLOC_TRIM_THRESHOLD_`` turns
    off glibc's adaptive mmap threshold)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    found: np.ndarray | None = getattr(_buffers, name, None)
    if found is None or found.nbytes < nbytes:
        found = np.empty(nbytes, np.uint8)
        setattr(_buffers, name, found)
    return found[:nbytes].view(np.dtype(dtype)).reshape(shape)
