"""The terminal progress bar of the CLI (corr_pipeline.cli.progress)."""

from __future__ import annotations

import io

import numpy as np

from corr_pipeline.cli.progress import TerminalProgressBar, cli_progress
from corr_pipeline.snapshot.progress import LogProgress
from corr_pipeline_tests.fixtures.progress_fakes import FakeClock, TtyStringIO


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
    # one frame per call, and tqdm draws the final state once more when it closes
    assert len(frames) == 5 and frames[-1].rstrip() == frames[-2].rstrip()
    assert out.endswith("\n") and out.count("\n") == 1
    assert frames[0].rstrip() == (
        "correlation [##........]  25%  1/4 blocks  00:02 elapsed  ~00:06 left"
    )
    assert frames[-1].rstrip() == "correlation [##########] 100%  4/4 blocks  00:08 elapsed"


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
