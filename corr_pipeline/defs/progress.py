"""Progress of the assets' long kernels, logged to the Dagster run's event log."""

from __future__ import annotations

import logging
from typing import Any

from corr_pipeline.snapshot.progress import LogProgress

__all__ = ["dagster_progress", "session_progress"]


def dagster_progress(context: Any, label: str, **kwargs: Any) -> LogProgress:
    """:class:`~corr_pipeline.snapshot.progress.LogProgress` writing to a Dagster
    ``context.log`` (or, when ``context`` has none, to the ``corr_pipeline`` logger);
    ``kwargs`` go to ``LogProgress``.

    Shorthand for the assets: ``progress=dagster_progress(context, "correlation")``.
    """
    log = getattr(context, "log", None) or logging.getLogger("corr_pipeline")
    return LogProgress(log, label, **kwargs)


def session_progress(context: Any, label: str) -> LogProgress | None:
    """:func:`dagster_progress` in a run of one session; None in a run over a range of sessions
    (a backfill), where each session's own line after it is the progress: a kernel's lines for
    every session would double the run's event log."""
    return dagster_progress(context, label) if context.has_partition_key else None
