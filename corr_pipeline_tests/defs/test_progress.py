"""Progress of the assets logged through Dagster's context.log (corr_pipeline.defs.progress)."""

from __future__ import annotations

import logging

from corr_pipeline.defs.progress import dagster_progress
from corr_pipeline.snapshot.progress import LogProgress
from corr_pipeline_tests.fixtures.progress_fakes import FakeClock


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
