"""The terminal progress bar of the ``corr-pipeline`` commands, drawn by ``tqdm``.

:class:`TerminalProgressBar` is a ``progress(done, total)`` callback (the kernels' protocol,
:mod:`corr_pipeline.snapshot.progress`) drawing a one-line bar redrawn in place on ``stderr`` ::

    correlation [##########..........]  50%  20/40 blocks  00:32 elapsed  ~00:32 left

only when the stream is a terminal (tqdm's ``disable=None``); otherwise it prints nothing at all,
so pipes, files and CI logs stay clean. tqdm redraws it at most every ``min_redraw_s`` seconds,
pads over a longer previous line and ends the line on :meth:`TerminalProgressBar.close`, which
draws the final state. Time left is the linear ``elapsed · (total − done) / done`` (as in the
logs), in tqdm's time format, omitted until the first block and at the end.

What is ours: the adapter from absolute ``(done, total)`` calls to tqdm's increments (tqdm counts
steps and learns the total late), the ``~ left`` part that disappears at the end (a field tqdm's
``bar_format`` has no condition for), and the injectable clock of the tests.

Use :func:`cli_progress` in commands: it returns a bar when stderr is a terminal and ``None``
otherwise (the kernels skip a ``None`` callback at no cost).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from corr_pipeline.snapshot.progress import checked_counts

__all__ = ["TerminalProgressBar", "cli_progress"]

_FORMAT = "{desc} [{bar}] {percentage:3.0f}%  {n_fmt}/{total_fmt} {unit}  {elapsed} elapsed{left}"


class _Bar(tqdm):  # type: ignore[type-arg]
    """tqdm with a ``{left}`` field (``"  ~00:06 left"`` while work remains, else empty) and no
    monitor thread (the bar is redrawn on each call, which is all a callback needs)."""

    monitor_interval = 0

    @property
    def format_dict(self) -> dict[str, Any]:
        d = dict(super().format_dict)
        n, total, elapsed = d.get("n") or 0, d.get("total"), d.get("elapsed") or 0
        left = ""
        if total and 0 < n < total:
            left = f"  ~{self.format_interval(elapsed * (total - n) / n)} left"
        d["left"] = left
        return d


class TerminalProgressBar:
    """A progress bar on a terminal (``stderr`` by default); silent when not a TTY.

    Use as ``progress=`` callback, then :meth:`close` (or use it as a context manager).
    ``enabled`` forces the bar on/off (default: ``stream.isatty()``, tqdm's rule); ``width`` is
    the bar's length in characters; ``clock`` replaces tqdm's clock (tests).
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
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.unit = unit
        self._closed = False
        self._bar = _Bar(
            total=None,
            desc=label,
            file=self.stream,
            disable=None if enabled is None else not enabled,
            unit=unit,
            bar_format=_FORMAT.replace("{bar}", f"{{bar:{max(5, int(width))}}}"),
            ascii=".#",
            mininterval=float(min_redraw_s),
            miniters=1,
            smoothing=0,
            dynamic_ncols=False,
            leave=True,
            # nothing is drawn before the first call (the total is not known until then)
            delay=1e-9,
        )
        self.enabled = not self._bar.disable
        if self.enabled and clock is not None:
            # tqdm's own test idiom: its clock and start time are plain attributes
            self._bar._time = clock  # noqa: SLF001
            self._bar.start_t = self._bar.last_print_t = clock()

    def __call__(self, done: int, total: int) -> None:
        done, total = checked_counts(done, total)
        if self._closed or self._bar.disable:
            return
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        """Draw the final state and end the line (only if something was drawn). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._bar.close()

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
