"""The terminal progress bar of the ``corr-pipeline`` commands.

:class:`TerminalProgressBar` is a ``progress(done, total)`` callback (the kernels' protocol,
:mod:`corr_pipeline.snapshot.progress`) drawing a one-line bar redrawn in place on ``stderr`` ::

    correlation [##########..........]  50%  20/40 blocks  0:32 elapsed  ~0:32 left

only when the stream is a terminal (``isatty()``); otherwise it prints nothing at all, so pipes,
files and CI logs stay clean. It redraws at most every ``min_redraw_s`` seconds (and on the last
block); :meth:`TerminalProgressBar.close` ends the line. Time left is
:func:`~corr_pipeline.snapshot.progress.eta_seconds`, omitted until the first block is done.

Use :func:`cli_progress` in commands: it returns a bar when stderr is a terminal and ``None``
otherwise (the kernels skip a ``None`` callback at no cost).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from corr_pipeline.snapshot.progress import checked_counts, eta_seconds

__all__ = ["TerminalProgressBar", "cli_progress"]


def _clock_duration(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss`` for the bar (``"?"`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


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
            eta = eta_seconds(elapsed, done, total)
            if math.isfinite(eta):
                text += f"  ~{_clock_duration(eta)} left"
        return text

    def __call__(self, done: int, total: int) -> None:
        done, total = checked_counts(done, total)
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
