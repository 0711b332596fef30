"""Wall time and memory of one stage, read from ``/proc/self/status`` (Linux).

- ``VmHWM``: peak resident set size. On entry ``5`` is written to ``/proc/self/clear_refs``,
  which resets the peak to the current RSS, so the figure is the stage's own peak even when
  several stages share one process. It counts the memory-mapped matrix pages the stage touched.
- ``RssAnon``: anonymous resident memory (heap, numpy temporaries): what the working-memory
  budget governs; memory-mapped matrices count in ``RssFile``, not here. The kernel keeps no
  peak of it, so :class:`PeakMemory` samples it from a thread when asked to.

Where ``/proc`` is unavailable the figures are omitted (None), never invented. Every figure is
the whole process's, so it includes the interpreter and whatever earlier stages still hold.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corr_pipeline.snapshot import display

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def read_proc_status_kib(
    keys: tuple[str, ...] = ("VmHWM", "VmRSS", "RssAnon", "RssFile"),
    status: Path = _STATUS,
) -> dict[str, int]:
    """The requested fields of ``status`` (default ``/proc/self/status``; another process's is
    ``/proc/<pid>/status``) in KiB (missing fields are absent; nothing if it cannot be read)."""
    values: dict[str, int] = {}
    try:
        text = status.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[name] = int(parts[0])
    return values


def release_freed_memory() -> None:
    """Collect reference cycles, then give the C heap's free pages back to the kernel (glibc's
    ``malloc_trim(0)``; nothing elsewhere), so that a process computing sessions one after the
    other starts each from what it holds, not from the previous session's high-water mark."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` among the process's loaded symbols, or None (another libc)."""
    return _libc("malloc_trim")


def _libc(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None


#: ``mallopt``'s parameter number of the mmap threshold (glibc's ``M_MMAP_THRESHOLD``).
_M_MMAP_THRESHOLD = -3

#: Blocks from this size up are mapped on their own and unmapped when freed.
MMAP_THRESHOLD_BYTES = 4 << 20


def fix_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` (``mallopt``); False elsewhere.

    By default the threshold starts at 128 KiB and rises, up to 32 MiB, to the size of each
    mapped block freed; a process computing sessions one after the other then keeps the
    temporaries of its first sessions, up to 32 MiB each, in the heap's arenas, whose free pages
    ``malloc_trim`` cannot all give back. A fixed threshold turns that off: a block this large
    or larger is mapped when allocated and returned when freed."""
    mallopt = _libc("mallopt")
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (``echo 5 > /proc/self/clear_refs``); False if not
    possible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryPeak:
    """Peaks above the level at entry, MiB."""

    rss_mib: float
    anon_mib: float


class PeakMemory:
    """Context manager recording the process's memory over the ``with`` body, in KiB.

    ``interval``: seconds between samples of ``RssAnon`` and ``VmRSS`` taken by a thread; None
    takes no samples (only the values at entry and exit, and ``VmHWM``).
    ``peak_rss``: ``VmHWM`` at exit when it could be reset at entry (the exact peak), else the
    highest ``VmRSS`` seen; ``peak_anon``: the highest ``RssAnon`` seen; ``end_anon``: ``RssAnon``
    at exit; ``base_rss`` / ``base_anon``: at entry; :attr:`above`: the peaks above entry, MiB;
    ``available``: whether ``/proc/self/status`` could be read.
    """

    def __init__(self, interval: float | None = 0.01) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.hwm_reset = False
        self.available = False
        self.base_anon = self.base_rss = 0
        self.peak_anon = self.peak_rss = 0
        self.end_anon = 0

    def _read(self) -> dict[str, int]:
        status = read_proc_status_kib(("VmRSS", "RssAnon", "VmHWM"))
        self.peak_anon = max(self.peak_anon, status.get("RssAnon", 0))
        self.peak_rss = max(self.peak_rss, status.get("VmRSS", 0))
        return status

    def _sample(self) -> None:
        assert self.interval is not None
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self) -> PeakMemory:
        self.hwm_reset = reset_peak_rss()
        status = self._read()
        self.available = bool(status)
        self.base_anon = self.peak_anon = status.get("RssAnon", 0)
        self.base_rss = self.peak_rss = status.get("VmRSS", 0)
        if self.interval is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        status = self._read()
        self.end_anon = status.get("RssAnon", 0)
        if self.hwm_reset and "VmHWM" in status:
            self.peak_rss = max(self.peak_rss, status["VmHWM"])

    @property
    def above(self) -> MemoryPeak:
        """Peaks above the entry level, MiB."""
        return MemoryPeak(
            (self.peak_rss - self.base_rss) / 1024, (self.peak_anon - self.base_anon) / 1024
        )


@dataclass
class StageStats:
    """What one stage cost: wall seconds and memory figures (MiB; None where unknown).

    ``peak_rss_mib``: the stage's peak RSS (see :class:`PeakMemory`); ``rss_anon_mib``:
    ``RssAnon`` at the end of the stage; ``peak_anon_mib``: the sampled peak of ``RssAnon``
    (only when the stage was measured with a sampling interval).
    """

    seconds: float = 0.0
    peak_rss_mib: float | None = None
    rss_anon_mib: float | None = None
    peak_anon_mib: float | None = None
    peak_is_stage_local: bool = False
    extra: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict[str, float]:
        """Numeric metadata (the Dagster UI plots these across partitions)."""
        out: dict[str, float] = {"stage_seconds": display.seconds(self.seconds)}
        if self.peak_rss_mib is not None:
            out["peak_rss_mib"] = display.mib(self.peak_rss_mib)
        if self.rss_anon_mib is not None:
            out["rss_anon_mib"] = display.mib(self.rss_anon_mib)
        out.update(self.extra)
        return out


@contextmanager
def measure_stage(*, sample_interval: float | None = None) -> Iterator[StageStats]:
    """Time the ``with`` body and record its memory (see the module docstring); with
    ``sample_interval`` (seconds) the peak of ``RssAnon`` is sampled too."""
    stats = StageStats()
    memory = PeakMemory(sample_interval)
    with memory:
        stats.peak_is_stage_local = memory.hwm_reset
        start = time.perf_counter()
        try:
            yield stats
        finally:
            stats.seconds = time.perf_counter() - start
    if memory.available:
        stats.peak_rss_mib = memory.peak_rss / 1024.0
        stats.rss_anon_mib = memory.end_anon / 1024.0
        if sample_interval is not None:
            stats.peak_anon_mib = memory.peak_anon / 1024.0
