"""Fakes for the progress tests: a hand-driven clock and a stream that claims to be a TTY."""

from __future__ import annotations

import io


class FakeClock:
    """Monotonic clock advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TtyStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True
