"""The snapshot job and its nightly schedule.

``snapshot_job`` materializes the whole ``correlation_snapshot`` group (every asset and its
checks) for one partition. Its run tags carry the operational limits:

- ``dagster/max_runtime``: the run is terminated and marked failed after this many seconds
  (enforced by the daemon's run monitoring, enabled in ``dagster.yaml``). Default
  :data:`corr_pipeline.settings.DEFAULT_MAX_RUNTIME_SECONDS`, override with ``$CORR_PIPELINE_MAX_RUNTIME_SECONDS``.
- ``corr_pipeline/heavy``: ``dagster.yaml`` limits runs carrying this tag to one at a time
  (``concurrency.runs.tag_concurrency_limits``), so two snapshot runs never share a machine.
  Runs launched from the asset graph rather than the job are held back by the
  ``corr_pipeline_snapshot`` pool instead (see :mod:`corr_pipeline.defs.step_options`).

``nightly_snapshot_schedule`` fires at 06:30 UTC Monday to Friday and requests the partition
of the previous weekday (Friday's on Monday), with ``run_key`` = partition key so a tick is
never launched twice for the same date.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.defs.partitions import (
    PARTITION_FMT,
    PARTITION_TIMEZONE,
    previous_weekday,
)
from corr_pipeline.defs.step_options import SNAPSHOT_GROUP

HEAVY_RUN_TAG = "corr_pipeline/heavy"
NIGHTLY_CRON = "30 6 * * 1-5"


def snapshot_run_tags() -> dict[str, str]:
    """Run tags of every snapshot run (max runtime and the heavy-run concurrency tag)."""
    return {
        dg.MAX_RUNTIME_SECONDS_TAG: str(settings.max_runtime_seconds()),
        HEAVY_RUN_TAG: "snapshot",
    }


#: Default executor config: one process per step (the multiprocess executor), forked from a
#: forkserver that has already imported the code location (dagster, numpy, the numba kernels),
#: so a step starts in well under a second instead of re-importing everything (~5 s per step).
SNAPSHOT_EXECUTION_CONFIG = {
    "execution": {
        "config": {
            "multiprocess": {
                "start_method": {"forkserver": {"preload_modules": ["corr_pipeline.definitions"]}}
            }
        }
    }
}


snapshot_job = dg.define_asset_job(
    name="snapshot_job",
    selection=dg.AssetSelection.groups(SNAPSHOT_GROUP),
    config=SNAPSHOT_EXECUTION_CONFIG,
    tags=snapshot_run_tags(),
    description="Materialize the correlation snapshot (window, correlation, neighbors, "
    "clusters, lead-lag, publication) and its checks for one snapshot date.",
)


def nightly_partition_key(scheduled_time: dt.datetime) -> str | None:
    """Partition the nightly tick at ``scheduled_time`` should build: the weekday before the
    tick's date (in UTC), or None if that is before the first partition."""
    when = scheduled_time.astimezone(dt.UTC) if scheduled_time.tzinfo else scheduled_time
    day = previous_weekday(when.date())
    if day < settings.partition_start():
        return None
    return day.strftime(PARTITION_FMT)


@dg.schedule(
    name="nightly_snapshot_schedule",
    cron_schedule=NIGHTLY_CRON,
    execution_timezone=PARTITION_TIMEZONE,
    job=snapshot_job,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="06:30 UTC Mon-Fri: snapshot of the previous weekday's session.",
)
def nightly_snapshot_schedule(context: dg.ScheduleEvaluationContext):
    scheduled = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    key = nightly_partition_key(scheduled)
    if key is None:
        return dg.SkipReason(
            f"the previous weekday of {scheduled:%Y-%m-%d} is before the first partition "
            f"({settings.partition_start():%Y-%m-%d})"
        )
    return dg.RunRequest(run_key=key, partition_key=key)
