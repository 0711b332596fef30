"""Progress reporting for long work: blocks done, percent, time left.

The compute kernels (SPEC §9) accept ``progress=callable(done, total)`` and call it after each
block (``done`` = blocks finished so far, ``total`` = blocks in the whole job). This module gives
two such callables:

``LogProgress``
    for Dagster runs (or any logger): writes one line such as ::

        correlation: 12/40 blocks (30%), 1m04s elapsed, ~2m29s left

    through ``log.info`` (a ``logging.Logger`` or Dagster's ``context.log``) or a plain
    ``callable(str)``, at most once per ``every_percent`` percent of progress (default 10%),
    plus always on the last block. So a job of 1,000 blocks logs 10 lines, one of 3 blocks logs
    3. Pass ``min_interval_s`` to also keep lines at least that many seconds apart (the last
    block is always logged).

``TerminalProgressBar``
    for the CLI: a one-line bar redrawn in place on ``stderr`` ::

        correlation [##########..........]  50%  20/40 blocks  0:32 elapsed  ~0:32 left

    only when the stream is a terminal (``isatty()``); otherwise it prints nothing at all, so
    pipes, files and CI logs stay clean. Redraws at most every ``min_redraw_s`` seconds (and on
    the last block); :meth:`TerminalProgressBar.close` ends the line.

Time left (ETA) is the linear estimate ``elapsed · (total − done) / done`` (blocks are of equal
size, apart from the last one); it is omitted until the first block is done.

Use :func:`cli_progress` in CLI commands: it returns a bar when stderr is a terminal and
``None`` otherwise (the kernels skip a ``None`` callback at no cost).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

__all__ = [
    "LogProgress",
    "ProgressCallback",
    "TerminalProgressBar",
    "cli_progress",
    "dagster_progress",
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


def _clock_duration(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss`` for the bar (``"?"`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _eta(elapsed: float, done: int, total: int) -> float:
    """Linear time-left estimate; NaN before the first block."""
    if done <= 0:
        return math.nan
    return elapsed * max(total - done, 0) / done


def progress_line(label: str, done: int, total: int, elapsed: float, unit: str = "blocks") -> str:
    """``"<label>: done/total <unit> (p%), <elapsed> elapsed, ~<eta> left"`` (the log format)."""
    percent = 100.0 * done / total if total > 0 else 100.0
    line = f"{label}: {done}/{total} {unit} ({percent:.0f}%), {format_duration(elapsed)} elapsed"
    if done >= total:
        return line + ", done"
    eta = _eta(elapsed, done, total)
    if math.isfinite(eta):
        line += f", ~{format_duration(eta)} left"
    return line


def _validate(done: int, total: int) -> tuple[int, int]:
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
        done, total = _validate(done, total)
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


class TerminalProgressBar:
    """A progress bar on a terminal (``stderr`` by default); silent when not a TTY.

    Use as ``progress=`` callback, then :meth:`close` (or use it as a context manager). The
    line is redrawn with ``\\r``; at the end a newline is written so later output starts on a
    fresh line. ``enabled`` forces the bar on/off (default: ``stream.isatty()``).
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        width: int = 30,
        unit: str = "blocks",
        enabled: bool | None = None,
        min_redraw_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            try:
                enabled = bool(isatty()) if callable(isatty) else False
            except (ValueError, OSError):  # closed stream
                enabled = False
        self.enabled = enabled
        self.label = label
        self.width = max(5, int(width))
        self.unit = unit
        self.min_redraw_s = float(min_redraw_s)
        self._clock = clock
        self._start = clock()
        self._last_draw: float | None = None
        self._last_len = 0
        self._drawn = False
        self._closed = False

    def render(self, done: int, total: int, elapsed: float) -> str:
        """The bar text for ``done`` of ``total`` after ``elapsed`` seconds (no ``\\r``)."""
        fraction = done / total if total > 0 else 1.0
        filled = int(self.width * fraction)
        bar = "#" * filled + "." * (self.width - filled)
        text = (
            f"{self.label} [{bar}] {100 * fraction:3.0f}%  {done}/{total} {self.unit}  "
            f"{_clock_duration(elapsed)} elapsed"
        )
        if done < total:
            eta = _eta(elapsed, done, total)
            if math.isfinite(eta):
                text += f"  ~{_clock_duration(eta)} left"
        return text

    def __call__(self, done: int, total: int) -> None:
        done, total = _validate(done, total)
        if not self.enabled or self._closed:
            return
        now = self._clock()
        final = done >= total
        if not final and self._last_draw is not None and now - self._last_draw < self.min_redraw_s:
            return
        self._last_draw = now
        text = self.render(done, total, now - self._start)
        pad = " " * max(0, self._last_len - len(text))
        self._last_len = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (only if something was drawn). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> TerminalProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cli_progress(
    label: str, *, stream: TextIO | None = None, unit: str = "blocks"
) -> TerminalProgressBar | None:
    """A :class:`TerminalProgressBar` when ``stream`` (default stderr) is a terminal, else None."""
    bar = TerminalProgressBar(label, stream=stream, unit=unit)
    return bar if bar.enabled else None


def dagster_progress(context: Any, label: str, **kwargs: Any) -> LogProgress:
    """:class:`LogProgress` writing to a Dagster ``context.log`` (or any logger/callable).

    Shorthand for the assets: ``progress=dagster_progress(context, "correlation")``.
    """
    log = getattr(context, "log", None) or logging.getLogger("corr_pipeline")
    return LogProgress(log, label, **kwargs)
