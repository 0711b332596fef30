"""Stage timing and peak memory for the assets (progress logging: :mod:`corr_pipeline.progress`).

Peak memory comes from ``/proc/self/status`` (Linux):

- ``VmHWM``: peak resident set size. At the start of a stage we write ``5`` to
  ``/proc/self/clear_refs``, which resets the peak to the current RSS, so the figure is the
  stage's own peak even when several steps share one process (in-process executor). With the
  multiprocess executor every step is its own process anyway.
- ``RssAnon``: anonymous (heap) resident memory at the end of the stage. Memory-mapped
  matrices count in ``RssFile``, not here, so this is the figure the working-memory budget
  governs.

Where ``/proc`` is unavailable the figures are simply omitted (never invented).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def read_proc_status_kib(keys: tuple[str, ...] = ("VmHWM", "VmRSS", "RssAnon", "RssFile")) -> dict:
    """The requested ``/proc/self/status`` fields in KiB (missing fields are absent)."""
    values: dict[str, int] = {}
    try:
        text = _STATUS.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[name] = int(parts[0])
    return values


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (``echo 5 > /proc/self/clear_refs``); False if not possible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@dataclass
class StageStats:
    """What one stage cost: wall seconds and memory figures (MiB)."""

    seconds: float = 0.0
    peak_rss_mib: float | None = None
    rss_anon_mib: float | None = None
    peak_is_stage_local: bool = False
    extra: dict[str, float] = field(default_factory=dict)

    def metadata(self) -> dict[str, float]:
        """Numeric metadata (the UI plots these across partitions)."""
        out: dict[str, float] = {"stage_seconds": round(self.seconds, 3)}
        if self.peak_rss_mib is not None:
            out["peak_rss_mib"] = round(self.peak_rss_mib, 1)
        if self.rss_anon_mib is not None:
            out["rss_anon_mib"] = round(self.rss_anon_mib, 1)
        out.update(self.extra)
        return out


@contextmanager
def measure_stage() -> Iterator[StageStats]:
    """Time the ``with`` body and record its peak RSS (see the module docstring)."""
    stats = StageStats()
    stats.peak_is_stage_local = reset_peak_rss()
    start = time.perf_counter()
    try:
        yield stats
    finally:
        stats.seconds = time.perf_counter() - start
        status = read_proc_status_kib()
        if "VmHWM" in status:
            stats.peak_rss_mib = status["VmHWM"] / 1024.0
        if "RssAnon" in status:
            stats.rss_anon_mib = status["RssAnon"] / 1024.0
