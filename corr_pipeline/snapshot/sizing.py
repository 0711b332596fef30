"""Memory of one snapshot run, and how many runs fit a machine: the parallelism of backfills.

A run of ``snapshot_job`` is a run-worker process, a forkserver and one process per step (the
multiprocess executor). After the correlation, the neighbors, the clusters and the lead-lag scan
may run at once: ``s = min(c, 3)`` step processes, ``c`` being the executor's ``max_concurrent``
(default the CPU count). With N symbols, T returns, a working-memory budget W (bytes, the
``working_memory_mb`` parameter) and P the anonymous memory of one idle process (interpreter,
Dagster, numpy, the code location), a run needs at most, in bytes:

    anonymous(N, T, W, c) = (2 + s) · P                        run worker, forkserver, s steps
                          + max(4 · N · (N − 1), 64 · T · N + W)  the largest step: clusters'
                                                                  condensed float64 distances
                                                                  (8 bytes × N(N−1)/2), or a
                                                                  table step
                          + (s − 1) · (64 · T · N + W)          the other steps at the same time:
                                                                  their T × N tables and W of
                                                                  block temporaries
    matrices(N)           = 6 · N²                              its own corr (float32) + overlap
                                                                  (int16) maps, which the steps
                                                                  read and write: page cache
    per_run               = anonymous + matrices

``64 · T · N`` bounds what a table step holds besides its block temporaries: the window step
measured 344 MiB above the interpreter at T × N = 252 × 22,465 (61 bytes per cell: the fetched
price blobs, the float64 pivot, the float32 returns); the correlation and lead-lag steps keep
about 49 bytes per cell (the standardised window, its transpose, presence, four float64 prefix
sums). The matrices' pages are page cache, not heap: the kernel can drop them, but then every
pass over the matrices reads the disk, and under a cgroup (a Kubernetes pod) they count towards
its memory limit. Hence they are part of what a run is given.

On a machine with M bytes (its memory, or its cgroup's limit when lower) of which ``reserve`` is
kept for the rest (the operating system, PostgreSQL, the Dagster web server, daemon and code
server), the number of snapshot runs at once is

    runs limit = max(1, floor((M − reserve) / per_run))

**One process.** Dagster's in-process executor runs the steps one after the other in the run
worker, so one process holds at most one step's working memory at a time, plus what the earlier
steps left on its heap (bounded by the largest step again, for the allocator reuses it):

    one_process(N, T, W) = P + 2 · max(4 · N · (N − 1), 64 · T · N + W) + matrices(N)

A run executes in one process when ``one_process <= M − reserve``, else one process per step.

**Sessions per backfill run.** A run over ``K`` consecutive sessions computes every step for
all of them before the next step (Dagster runs one step per asset), so the matrices of all
``K`` sessions (``6 · N²`` each) and their windows (``4 · T · N``) are in the store at once:

    sessions_per_run = clamp(floor((M − reserve − one_process) / (6 · N² + 4 · T · N)),
                             1, MAX_SESSIONS_PER_RUN)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
GIB = 2**30

#: Anonymous memory of one idle pipeline process (interpreter, Dagster, numpy, numba, the code
#: location): P in the module docstring. The ``rss_anon_mib`` the assets record on the demo's
#: 2,808-symbol run (``corr-pipeline demo``, whose data weigh a few MiB) was 178-244 MiB per
#: step process; rounded up.
PROCESS_BYTES = 256 * MIB
#: Bytes per cell of the T × N window a table step keeps besides its block temporaries.
TABLE_BYTES_PER_CELL = 64
#: Steps that may run at once within one run (neighbors, clusters, lead-lag).
PARALLEL_STEPS = 3
#: Default memory kept for everything that is not a snapshot run on a single machine.
DEFAULT_RESERVE_BYTES = 2 * GIB

#: The most sessions one backfill run covers (about a year): what a run killed part-way can lose.
MAX_SESSIONS_PER_RUN = 250

_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")


@dataclass(frozen=True)
class RunMemory:
    """The terms of ``per_run`` (module docstring), in bytes."""

    n: int
    t: int
    working_memory_mb: float
    concurrent_steps: int
    processes: int
    largest_step: int
    other_steps: int
    matrices: int

    @property
    def anonymous(self) -> int:
        return self.processes + self.largest_step + self.other_steps

    @property
    def per_run(self) -> int:
        return self.anonymous + self.matrices


def run_memory(
    n: int, t: int, working_memory_mb: float, concurrent_steps: int | None = None
) -> RunMemory:
    """The memory one snapshot run needs at most (module docstring); ``concurrent_steps`` is the
    executor's ``max_concurrent`` (default: this machine's CPU count)."""
    if n < 1 or t < 1:
        raise ValueError(f"N and T must be >= 1, got N = {n}, T = {t}")
    if working_memory_mb <= 0:
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb}")
    c = concurrent_steps if concurrent_steps is not None else (os.cpu_count() or 1)
    if c < 1:
        raise ValueError(f"concurrent steps must be >= 1, got {c}")
    s = min(c, PARALLEL_STEPS)
    table = TABLE_BYTES_PER_CELL * t * n + int(working_memory_mb * MIB)
    return RunMemory(
        n=n,
        t=t,
        working_memory_mb=working_memory_mb,
        concurrent_steps=s,
        processes=(2 + s) * PROCESS_BYTES,
        largest_step=max(4 * n * (n - 1), table),
        other_steps=(s - 1) * table,
        matrices=6 * n * n,
    )


def one_process_memory(n: int, t: int, working_memory_mb: float) -> int:
    """Bytes one process running every step in turn needs (``one_process``, module docstring)."""
    single = run_memory(n, t, working_memory_mb, concurrent_steps=1)
    return PROCESS_BYTES + 2 * single.largest_step + single.matrices


def fits_one_process(
    n: int,
    t: int,
    working_memory_mb: float,
    memory_bytes: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> bool:
    """Whether a run's steps fit in one process on a machine of ``memory_bytes`` (default
    :func:`machine_memory_bytes`) keeping ``reserve_bytes`` for the rest."""
    memory = machine_memory_bytes() if memory_bytes is None else memory_bytes
    return one_process_memory(n, t, working_memory_mb) <= memory - reserve_bytes


def sessions_per_run(
    n: int,
    t: int,
    working_memory_mb: float,
    memory_bytes: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> int:
    """Consecutive sessions one backfill run covers (``sessions_per_run``, module docstring)."""
    memory = machine_memory_bytes() if memory_bytes is None else memory_bytes
    free = memory - reserve_bytes - one_process_memory(n, t, working_memory_mb)
    per_session = 6 * n * n + 4 * t * n
    return int(min(MAX_SESSIONS_PER_RUN, max(1, free // per_session)))


def runs_limit(memory_bytes: int, per_run_bytes: int, reserve_bytes: int) -> int:
    """``max(1, floor((memory − reserve) / per_run))``: snapshot runs that fit at once."""
    if per_run_bytes < 1:
        raise ValueError(f"per_run_bytes must be >= 1, got {per_run_bytes}")
    return max(1, (memory_bytes - reserve_bytes) // per_run_bytes)


def machine_memory_bytes() -> int:
    """This machine's memory (``MemTotal``), or its cgroup's memory limit when that is lower
    (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        raw = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return int(total)
    return int(min(total, int(raw))) if raw.isdigit() else int(total)
