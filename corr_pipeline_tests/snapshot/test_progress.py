"""Progress reporting (corr_pipeline.snapshot.progress): log lines, durations, time left."""

from __future__ import annotations

import re

import pytest

from corr_pipeline.snapshot.progress import LogProgress, format_duration, progress_line
from corr_pipeline_tests.fixtures.progress_fakes import FakeClock

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


def test_log_progress_rejects_bad_arguments():
    with pytest.raises(ValueError, match="every_percent"):
        LogProgress(print, "x", every_percent=0)
    with pytest.raises(TypeError):
        LogProgress(42, "x")  # type: ignore[arg-type]
    progress = LogProgress(print, "x")
    with pytest.raises(ValueError, match="counts must be >= 0"):
        progress(-1, 10)
