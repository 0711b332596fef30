"""Progress reporting for long work: blocks done, percent, time left (no Dagster, no terminal).

The compute kernels (SPEC §9) accept ``progress=callable(done, total)`` and call it after each
block (``done`` = blocks finished so far, ``total`` = blocks in the whole job).

``LogProgress``
    such a callable for logs: writes one line such as ::

        correlation: 12/40 blocks (30%), 1m04s elapsed, ~2m29s left

    through ``log.info`` (a ``logging.Logger`` or Dagster's ``context.log``) or a plain
    ``callable(str)``, at most once per ``every_percent`` percent of progress (default 10%),
    plus always on the last block. So a job of 1,000 blocks logs 10 lines, one of 3 blocks logs
    3. Pass ``min_interval_s`` to also keep lines at least that many seconds apart (the last
    block is always logged).

Time left (ETA) is the linear estimate ``elapsed · (total − done) / done`` (blocks are of equal
size, apart from the last one); it is omitted until the first block is done
(:func:`eta_seconds`).

The terminal bar of the CLI is :class:`corr_pipeline.cli.progress.TerminalProgressBar`; the
Dagster shorthand is :func:`corr_pipeline.defs.progress.dagster_progress`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "LogProgress",
    "ProgressCallback",
    "checked_counts",
    "eta_seconds",
    "format_duration",
    "progress_line",
]

ProgressCallback = Callable[[int, int], None]
"""``progress(done, total)``, called after each finished block (the kernels' protocol)."""


class _InfoLogger(Protocol):
    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


def format_duration(seconds: float) -> str:
    """Human duration: ``"42s"``, ``"3m05s"``, ``"2h07m"`` (``"?"`` when not finite/negative)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def eta_seconds(elapsed: float, done: int, total: int) -> float:
    """Linear time-left estimate ``elapsed · (total − done) / done``; NaN before the first block."""
    if done <= 0:
        return math.nan
    return elapsed * max(total - done, 0) / done


def progress_line(label: str, done: int, total: int, elapsed: float, unit: str = "blocks") -> str:
    """``"<label>: done/total <unit> (p%), <elapsed> elapsed, ~<eta> left"`` (the log format)."""
    percent = 100.0 * done / total if total > 0 else 100.0
    line = f"{label}: {done}/{total} {unit} ({percent:.0f}%), {format_duration(elapsed)} elapsed"
    if done >= total:
        return line + ", done"
    eta = eta_seconds(elapsed, done, total)
    if math.isfinite(eta):
        line += f", ~{format_duration(eta)} left"
    return line


def checked_counts(done: int, total: int) -> tuple[int, int]:
    """``(min(done, total), total)`` as ints; ValueError when either count is negative."""
    done, total = int(done), int(total)
    if total < 0 or done < 0:
        raise ValueError(f"progress(done={done}, total={total}): counts must be >= 0")
    return min(done, total), total


class LogProgress:
    """``progress(done, total)`` callback that logs every ``every_percent`` percent (see module).

    Parameters
    ----------
    log : object with ``.info(str)`` (``logging.Logger``, Dagster ``context.log``) or a
        ``callable(str)``.
    label : what is progressing, e.g. ``"correlation"`` or ``"lead-lag scan"``.
    every_percent : log when progress has advanced by at least this much since the last line
        (5-10 is sensible; the last block is always logged).
    min_interval_s : also require this many seconds between lines (0 = no time limit).
    unit : the word after the counts (``"blocks"``).
    clock : monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        log: _InfoLogger | Callable[[str], Any],
        label: str,
        *,
        every_percent: float = 10.0,
        min_interval_s: float = 0.0,
        unit: str = "blocks",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (0 < every_percent <= 100):
            raise ValueError(f"every_percent must be in (0, 100]; got {every_percent!r}")
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0; got {min_interval_s!r}")
        info = getattr(log, "info", None)
        self._emit: Callable[[str], Any] = info if callable(info) else log  # type: ignore[assignment]
        if not callable(self._emit):
            raise TypeError("log must have an .info(str) method or be a callable(str)")
        self.label = label
        self.every_percent = float(every_percent)
        self.min_interval_s = float(min_interval_s)
        self.unit = unit
        self._clock = clock
        self._start = clock()
        self._last_percent = 0.0
        self._last_time: float | None = None
        self.lines: int = 0

    def restart(self) -> None:
        """Reset the clock and the throttle (to reuse the callback for another job)."""
        self._start = self._clock()
        self._last_percent = 0.0
        self._last_time = None

    def __call__(self, done: int, total: int) -> None:
        done, total = checked_counts(done, total)
        percent = 100.0 * done / total if total > 0 else 100.0
        now = self._clock()
        final = done >= total
        if not final:
            if percent - self._last_percent + 1e-9 < self.every_percent:
                return
            if self._last_time is not None and now - self._last_time < self.min_interval_s:
                return
        self._last_percent = percent
        self._last_time = now
        self.lines += 1
        self._emit(progress_line(self.label, done, total, now - self._start, self.unit))
