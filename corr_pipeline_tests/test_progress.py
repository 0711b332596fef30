"""Progress reporting (corr_pipeline.progress): log lines for Dagster, a bar for terminals."""

from __future__ import annotations

import io
import logging
import re

import numpy as np
import pytest

from corr_pipeline.progress import (
    LogProgress,
    TerminalProgressBar,
    cli_progress,
    dagster_progress,
    format_duration,
    progress_line,
)


class FakeClock:
    """Monotonic clock advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TtyStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


LINE_RE = re.compile(
    r"^(?P<label>[\w -]+): (?P<done>\d+)/(?P<total>\d+) blocks \((?P<pct>\d+)%\), "
    r"(?P<elapsed>\S+) elapsed(, ~(?P<eta>\S+) left|, done)$"
)


def test_format_duration():
    assert format_duration(0) == "0s"
    assert format_duration(42.4) == "42s"
    assert format_duration(185) == "3m05s"
    assert format_duration(2 * 3600 + 7 * 60 + 3) == "2h07m"
    assert format_duration(float("nan")) == "?"
    assert format_duration(-1) == "?"


def test_progress_line_format_and_eta():
    line = progress_line("correlation", 12, 40, 64.0)
    # ETA = elapsed * (total - done) / done = 64 * 28 / 12 = 149.3 s
    assert line == "correlation: 12/40 blocks (30%), 1m04s elapsed, ~2m29s left"
    assert progress_line("x", 40, 40, 10.0) == "x: 40/40 blocks (100%), 10s elapsed, done"
    assert progress_line("x", 0, 40, 1.0) == "x: 0/40 blocks (0%), 1s elapsed"


def test_log_progress_throttles_to_every_percent_and_always_logs_the_end():
    clock = FakeClock()
    lines: list[str] = []
    progress = LogProgress(lines.append, "lead-lag scan", every_percent=10, clock=clock)
    total = 1000
    for done in range(1, total + 1):
        clock.now += 0.5
        progress(done, total)
    assert len(lines) == 10  # 10%, 20%, ..., 100%
    parsed = [LINE_RE.match(line) for line in lines]
    assert all(parsed), lines
    assert [int(m["pct"]) for m in parsed] == list(range(10, 101, 10))
    assert all(m["label"] == "lead-lag scan" for m in parsed)
    assert parsed[-1].group(0).endswith(", done")
    # first line at 100 blocks after 50 s: 900 blocks left at 0.5 s each = 7m30s
    assert parsed[0]["elapsed"] == "50s" and parsed[0]["eta"] == "7m30s"


def test_log_progress_small_jobs_log_every_block():
    lines: list[str] = []
    progress = LogProgress(lines.append, "correlation", every_percent=10, clock=FakeClock())
    for done in (1, 2, 3):
        progress(done, 3)
    assert [line.split(":")[1].split()[0] for line in lines] == ["1/3", "2/3", "3/3"]


def test_log_progress_min_interval_and_restart():
    clock = FakeClock()
    lines: list[str] = []
    progress = LogProgress(lines.append, "c", every_percent=5, min_interval_s=60, clock=clock)
    for done in range(1, 101):
        clock.now += 1.0  # 100 s in total: lines >= 60 s apart, plus always the final one
        progress(done, 100)
    assert [line.split(" blocks")[0] for line in lines] == ["c: 5/100", "c: 65/100", "c: 100/100"]
    progress.restart()
    clock.now += 5
    progress(100, 100)
    assert lines[-1] == "c: 100/100 blocks (100%), 5s elapsed, done"


def test_log_progress_through_a_logger_and_dagster_like_context(caplog):
    logger = logging.getLogger("corr_pipeline.test_progress")
    with caplog.at_level(logging.INFO, logger=logger.name):
        progress = LogProgress(logger, "correlation", clock=FakeClock())
        progress(1, 1)
    assert caplog.records[-1].getMessage().startswith("correlation: 1/1 blocks (100%)")

    class Context:
        def __init__(self) -> None:
            self.messages: list[str] = []
            self.log = self

        def info(self, message: str) -> None:
            self.messages.append(message)

    context = Context()
    progress = dagster_progress(context, "lead-lag scan")
    progress(5, 5)
    assert context.messages and context.messages[0].startswith("lead-lag scan: 5/5 blocks")


def test_log_progress_rejects_bad_arguments():
    with pytest.raises(ValueError, match="every_percent"):
        LogProgress(print, "x", every_percent=0)
    with pytest.raises(TypeError):
        LogProgress(42, "x")  # type: ignore[arg-type]
    progress = LogProgress(print, "x")
    with pytest.raises(ValueError, match="counts must be >= 0"):
        progress(-1, 10)


def test_terminal_bar_draws_in_place_on_a_tty():
    clock = FakeClock()
    stream = TtyStringIO()
    bar = TerminalProgressBar("correlation", stream=stream, width=10, clock=clock, min_redraw_s=0)
    assert bar.enabled
    for done in range(1, 5):
        clock.now += 2.0
        bar(done, 4)
    bar.close()
    bar.close()  # idempotent
    out = stream.getvalue()
    frames = out.rstrip("\n").split("\r")[1:]
    assert len(frames) == 4 and out.endswith("\n") and out.count("\n") == 1
    assert frames[0].rstrip() == (
        "correlation [##........]  25%  1/4 blocks  0:02 elapsed  ~0:06 left"
    )
    assert frames[-1].rstrip() == "correlation [##########] 100%  4/4 blocks  0:08 elapsed"


def test_terminal_bar_throttles_redraws_but_always_draws_the_end():
    clock = FakeClock()
    stream = TtyStringIO()
    with TerminalProgressBar("x", stream=stream, clock=clock, min_redraw_s=0.1) as bar:
        for done in range(1, 1001):
            clock.now += 0.001  # 1 s in total
            bar(done, 1000)
    frames = stream.getvalue().split("\r")[1:]
    assert 5 <= len(frames) <= 12
    assert "1000/1000" in frames[-1]


def test_terminal_bar_is_silent_when_not_a_tty():
    stream = io.StringIO()  # isatty() is False
    bar = TerminalProgressBar("x", stream=stream)
    assert not bar.enabled
    bar(1, 2)
    bar(2, 2)
    bar.close()
    assert stream.getvalue() == ""
    assert cli_progress("x", stream=stream) is None
    assert isinstance(cli_progress("x", stream=TtyStringIO()), TerminalProgressBar)


def test_progress_callbacks_work_with_the_correlation_kernel():
    from corr_pipeline.compute import pairwise_correlation

    rng = np.random.default_rng(3)
    R = rng.standard_normal((60, 50)).astype(np.float32)
    lines: list[str] = []
    stream = TtyStringIO()
    bar = TerminalProgressBar("correlation", stream=stream, min_redraw_s=0)
    log = LogProgress(lines.append, "correlation", every_percent=10)

    def both(done: int, total: int) -> None:
        log(done, total)
        bar(done, total)

    pairwise_correlation(R, min_overlap=10, block_rows=8, progress=both)
    bar.close()
    total = -(-50 // 8)  # 7 row blocks
    assert lines[-1].startswith(f"correlation: {total}/{total} blocks (100%)")
    assert len(lines) == total  # each block is >= 10% of the work
    assert f"{total}/{total} blocks" in stream.getvalue()
