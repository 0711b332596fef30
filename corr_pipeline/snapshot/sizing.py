"""Memory and time of one snapshot run: how many runs fit a machine at once, how many sessions
one run of a backfill covers.

A run of ``snapshot_job`` is one process, the run worker, computing its sessions one after the
other and each session's stages in turn (:mod:`corr_pipeline.defs.assets`). With N symbols,
T returns, a working-memory budget W (bytes, the ``working_memory_mb`` parameter) and P the
anonymous memory of one idle process (interpreter, Dagster, numpy, the code location), a run
needs at most, in bytes:

    largest_stage(N, T, W) = max(4 · N · (N − 1), 64 · T · N) + W   the clusters' condensed
                                                                    float64 distances (on the
                                                                    heap, or a scratch file),
                                                                    or a table stage, and its
                                                                    block temporaries
    matrices(N)            = 2 · 6 · N²                              corr (float32) + overlap
                                                                    (int16) of the session and
                                                                    of the one before it (its
                                                                    changes read both)
    per_run                = P + largest_stage + matrices

``64 · T · N`` bounds what a table stage holds besides its block temporaries: the window
measured 344 MiB above the interpreter at T × N = 252 × 22,465 (61 bytes per cell: the fetched
price blobs, the float64 pivot, the float32 returns); the lead-lag keeps 46 bytes per cell (its
standardised window), the correlation less. The matrices' pages are page cache or the store's memory area, not
heap: under a cgroup (a Kubernetes pod) they count towards its memory limit, hence they are
part of what a run is given. A run over a range adds the union of its windows, 17 bytes per
symbol and date (41 MB per 100 dates at N = 24,000), and no more matrices: only one session is
in flight.

On a machine with M bytes (its memory, or its cgroup's limit when lower) of which ``reserve`` is
kept for the rest (the operating system, PostgreSQL, the Dagster web server, daemon and code
server), the number of snapshot runs at once is

    runs by memory = max(1, floor((M − reserve) / per_run))
    runs by cores  = C, the cores the runs may use (this process's CPU affinity by default)
    runs limit     = min(runs by memory, runs by cores)

Cores bound it too: each run's kernels use one thread per core, so runs beyond one per core only
share the same cores (no run ends sooner) while each holds its memory; what parallel runs gain is
the overlap of the parts that leave cores idle (the database load and publication, process
start-up, the single-threaded NN-chain), which one run per core already has.

**Sessions per backfill run.** Memory does not grow with the sessions of a run, so a run covers
as many as a share of its maximum runtime (``dagster/max_runtime``, default 4 h) allows, at
an estimated

    session_seconds(N, T) = SESSION_FIXED_SECONDS + SECONDS_PER_CELL · T · N²

    sessions_per_run = clamp(floor(RUNTIME_SHARE · max_runtime / session_seconds), 1,
                             MAX_SESSIONS_PER_RUN)

(the constants are rounded up from docs/benchmarks.md: about 0.15 s of a session at N = 500
and 72–78 s for a session at N = 24,000, T = 252, on 2 cores, whose lead-lag counts the
p-value of every pair). A run killed part-way loses only the
session it was computing: every session is published and reported as it is done.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
GIB = 2**30

#: Anonymous memory of one idle pipeline process (interpreter, Dagster, numpy, numba, the code
#: location): P in the module docstring. The ``rss_anon_mib`` the demo's runs (2,808 symbols,
#: whose data weigh a few MiB) record is 178-244 MiB; rounded up.
PROCESS_BYTES = 256 * MIB
#: Bytes per cell of the T × N window a table stage keeps besides its block temporaries.
TABLE_BYTES_PER_CELL = 64
#: Default memory kept for everything that is not a snapshot run on a single machine.
DEFAULT_RESERVE_BYTES = 2 * GIB

#: The estimate of a session's seconds (module docstring): what does not grow with N² ...
SESSION_FIXED_SECONDS = 0.5
#: ... and what does, per T · N² (the kernels and the passes over the matrices).
SECONDS_PER_CELL = 6e-10
#: The share of a run's maximum runtime its sessions are planned to fill.
RUNTIME_SHARE = 0.5
#: The most sessions one backfill run covers: ten years of an exchange calendar.
MAX_SESSIONS_PER_RUN = 2520

_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")


@dataclass(frozen=True)
class RunMemory:
    """The terms of ``per_run`` (module docstring), in bytes."""

    n: int
    t: int
    working_memory_mb: float
    process: int
    largest_stage: int
    matrices: int

    @property
    def per_run(self) -> int:
        return self.process + self.largest_stage + self.matrices


def run_memory(n: int, t: int, working_memory_mb: float) -> RunMemory:
    """The memory one snapshot run needs at most (module docstring)."""
    if n < 1 or t < 1:
        raise ValueError(f"N and T must be >= 1, got N = {n}, T = {t}")
    if working_memory_mb <= 0:
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb}")
    return RunMemory(
        n=n,
        t=t,
        working_memory_mb=working_memory_mb,
        process=PROCESS_BYTES,
        largest_stage=max(4 * n * (n - 1), TABLE_BYTES_PER_CELL * t * n)
        + int(working_memory_mb * MIB),
        matrices=2 * 6 * n * n,
    )


def session_seconds(n: int, t: int) -> float:
    """The estimated seconds of one session of a backfill run (module docstring)."""
    return SESSION_FIXED_SECONDS + SECONDS_PER_CELL * t * n * n


def sessions_per_run(n: int, t: int, max_runtime_seconds: float) -> int:
    """Consecutive sessions one backfill run covers (``sessions_per_run``, module docstring)."""
    planned = RUNTIME_SHARE * max_runtime_seconds / session_seconds(n, t)
    return int(min(MAX_SESSIONS_PER_RUN, max(1, planned)))


def runs_limit(memory_bytes: int, per_run_bytes: int, reserve_bytes: int) -> int:
    """``max(1, floor((memory − reserve) / per_run))``: snapshot runs that fit the memory at once
    (the cores bound them too: :func:`runs_at_once`)."""
    if per_run_bytes < 1:
        raise ValueError(f"per_run_bytes must be >= 1, got {per_run_bytes}")
    return max(1, (memory_bytes - reserve_bytes) // per_run_bytes)


@dataclass(frozen=True)
class RunsAtOnce:
    """Snapshot runs at once (module docstring): ``by_memory`` those that fit the memory,
    ``by_cores`` one per core; ``limit`` the lower, ``binding`` which bound that is (``memory``,
    ``cores``, or ``memory and cores`` when they are equal)."""

    by_memory: int
    by_cores: int

    @property
    def limit(self) -> int:
        return min(self.by_memory, self.by_cores)

    @property
    def binding(self) -> str:
        if self.by_memory == self.by_cores:
            return "memory and cores"
        return "cores" if self.by_cores < self.by_memory else "memory"


def runs_at_once(
    memory_bytes: int, per_run_bytes: int, reserve_bytes: int, cores: int
) -> RunsAtOnce:
    """``min(runs_limit(memory, per_run, reserve), cores)`` with both bounds (module
    docstring); ``cores`` must be >= 1."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return RunsAtOnce(runs_limit(memory_bytes, per_run_bytes, reserve_bytes), int(cores))


def machine_memory_bytes() -> int:
    """This machine's memory (``MemTotal``), or its cgroup's memory limit when that is lower
    (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        raw = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return int(total)
    return int(min(total, int(raw))) if raw.isdigit() else int(total)
