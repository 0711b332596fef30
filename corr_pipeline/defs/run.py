"""Materialize the snapshot graph from Python (the ``corr-pipeline demo`` command, scripts, tests).

:func:`materialize_snapshot` runs ``snapshot_job`` for one partition through
``dagster.execute_job`` on a *persistent* Dagster instance, with the multiprocess executor by
default (each step in its own process, exactly as the daemon would run it). The run is recorded
in that instance, so ``dg dev`` started with the same ``DAGSTER_HOME`` shows it (assets,
checks, metadata plots) afterwards.

Instance resolution: the ``instance`` argument, else :func:`corr_pipeline.settings.dagster_home`
(``$DAGSTER_HOME`` if set; else the current directory when it holds ``dagster.yaml``, i.e. the
repository root, whose ``dagster.yaml`` is the instance's configuration; else
``$CORR_PIPELINE_HOME/dagster_home``; created, with the repository's ``dagster.yaml`` copied in
when it has none).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource
from corr_pipeline.db.reads import latest_trade_date
from corr_pipeline.defs.definitions import build_definitions
from corr_pipeline.defs.partitions import (
    partition_key_for,
    snapshot_calendar,
    snapshot_partitions,
)
from corr_pipeline.defs.resources import SnapshotParams

SNAPSHOT_JOB_NAME = "snapshot_job"
REPO_DAGSTER_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml"


def snapshot_job_def() -> dg.JobDefinition:
    """``snapshot_job`` resolved from :func:`build_definitions` (a module-level function, so it
    is reconstructable in the step subprocesses of the multiprocess executor)."""
    return build_definitions().resolve_job_def(SNAPSHOT_JOB_NAME)


def open_instance(dagster_home: Path | None = None) -> dg.DagsterInstance:
    """A persistent instance in ``dagster_home`` (default :func:`settings.dagster_home`),
    created with the repository's ``dagster.yaml`` if the directory has none."""
    home = settings.ensure_dir(dagster_home or settings.dagster_home())
    config = home / "dagster.yaml"
    if not config.exists() and REPO_DAGSTER_YAML.is_file():
        shutil.copyfile(REPO_DAGSTER_YAML, config)
    return dg.DagsterInstance.from_config(str(home))


def latest_partition_key(
    engine: sa.Engine, today: dt.date | None = None, *, source: PriceSource = NATIVE_PRICES
) -> str:
    """The partition containing the last trade date of the price source (``prices`` by
    default; a date that is not a session maps to the session before it). Raises ValueError when it is empty or
    the date is outside the partitions (before ``$CORR_PIPELINE_PARTITION_START`` or in the
    future)."""
    last = latest_trade_date(engine, source)
    if last is None:
        if not source.is_native:
            raise ValueError(f"the price source {source} is empty")
        raise ValueError(
            "the prices table is empty: load prices first (corr-pipeline demo seeds it)"
        )
    key = partition_key_for(last)
    check_partition_key(key, today=today)
    return key


def check_partition_key(key: str, today: dt.date | None = None) -> None:
    """Raise ValueError (saying which partitions exist) unless ``key`` is a snapshot partition."""
    current = dt.datetime.combine(today, dt.time(12), tzinfo=dt.UTC) if today is not None else None
    keys = snapshot_partitions.get_partition_keys(current_time=current)
    if key not in keys:
        span = f"{keys[0]} .. {keys[-1]}" if keys else "none"
        raise ValueError(
            f"{key} is not a snapshot partition (sessions of {snapshot_calendar.name}: {span}; "
            "the first one is set by CORR_PIPELINE_PARTITION_START, the calendar by "
            "CORR_PIPELINE_CALENDAR)"
        )


@dataclass
class StepRun:
    """One step of a run: its process id (from its ``STEP_START`` event; with the multiprocess
    executor each step has its own), its status, and the seconds from its start to its end as
    Dagster recorded them (process start-up, inputs, the asset, its checks and outputs)."""

    key: str
    pid: int | None
    status: str
    seconds: float | None


@dataclass
class SnapshotRunSummary:
    """What one snapshot run produced, from its materialization and check events; ``steps``:
    every step of the run in the order they started (see :class:`StepRun`)."""

    partition_key: str
    run_id: str
    success: bool
    dagster_home: Path
    store_dir: Path
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    failed_steps: list[str] = field(default_factory=list)
    steps: list[StepRun] = field(default_factory=list)

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def failed_checks(self) -> list[str]:
        return sorted(name for name, passed in self.checks.items() if not passed)

    def __str__(self) -> str:
        status = "succeeded" if self.success else "FAILED"
        lines = [
            f"snapshot {self.partition_key} {status} (run {self.run_id})",
            f"  as of trade date {self.value('returns_matrix', 'as_of_trade_date', '?')}: "
            f"{self.value('returns_matrix', 'n_symbols', '?')} symbols kept, "
            f"{self.value('returns_matrix', 'n_dropped', '?')} dropped, "
            f"{self.value('returns_matrix', 'bad_prices', '?')} bad prices in the window",
            f"  mean |corr| {_fmt(self.value('correlation_matrix', 'mean_abs_corr'))}, "
            f"{self.value('clusters', 'n_clusters', '?')} clusters "
            f"(largest {self.value('clusters', 'largest_cluster_size', '?')}), "
            f"{self.value('lead_lag_pairs', 'n_pairs', '?')} lead-lag pairs",
            f"  published: {self.value('snapshot_publication', 'peer_neighbors_rows', '?')} "
            f"neighbor rows, {self.value('snapshot_publication', 'symbol_clusters_rows', '?')} "
            f"cluster rows, {self.value('snapshot_publication', 'lead_lag_pairs_rows', '?')} "
            "pair rows",
            f"  checks: {sum(self.checks.values())}/{len(self.checks)} passed"
            + (f" (failed: {', '.join(self.failed_checks)})" if self.failed_checks else ""),
            f"  matrix store: {self.store_dir}",
        ]
        if self.failed_steps:
            lines.append(f"  failed steps: {', '.join(self.failed_steps)}")
        return "\n".join(lines)


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value if value is not None else "?")


def _plain(value: Any) -> Any:
    """Metadata value -> plain Python (numbers, text)."""
    inner = getattr(value, "value", value)
    return inner if isinstance(inner, int | float | str | bool) else str(inner)


def summarize(
    result: Any,
    partition_key: str,
    dagster_home: Path,
    store_dir: Path,
    instance: dg.DagsterInstance | None = None,
) -> SnapshotRunSummary:
    """Collect materialization metadata and check outcomes from an execution result, and with
    ``instance`` the steps' times (:meth:`~dagster.DagsterInstance.get_run_step_stats`)."""
    summary = SnapshotRunSummary(
        partition_key=partition_key,
        run_id=result.run_id,
        success=result.success,
        dagster_home=dagster_home,
        store_dir=store_dir,
    )
    for event in result.all_events:
        kind = event.event_type_value
        if kind == "ASSET_MATERIALIZATION":
            materialization = event.event_specific_data.materialization
            asset = materialization.asset_key.to_user_string()
            summary.metadata[asset] = {k: _plain(v) for k, v in materialization.metadata.items()}
        elif kind == "ASSET_CHECK_EVALUATION":
            evaluation = event.event_specific_data
            summary.checks[evaluation.check_name] = bool(evaluation.passed)
        elif kind == "STEP_FAILURE" and event.step_key:
            summary.failed_steps.append(event.step_key)
        elif kind == "STEP_START" and event.step_key:
            summary.steps.append(StepRun(event.step_key, event.pid, "STARTED", None))
    if instance is not None:
        stats = {s.step_key: s for s in instance.get_run_step_stats(result.run_id)}
        for step in summary.steps:
            found = stats.get(step.key)
            if found is None:
                continue
            step.status = found.status.value if found.status is not None else step.status
            if found.start_time is not None and found.end_time is not None:
                step.seconds = found.end_time - found.start_time
    return summary


def materialize_snapshot(
    partition_key: str,
    *,
    instance: dg.DagsterInstance | None = None,
    params: dict[str, Any] | None = None,
    store_dir: str | os.PathLike[str] | None = None,
    in_process: bool = False,
    max_concurrent: int | None = None,
    forkserver: bool = True,
    log_level: str = "INFO",
    raise_on_error: bool = False,
) -> SnapshotRunSummary:
    """Run ``snapshot_job`` for ``partition_key`` and summarize it.

    ``params`` overrides fields of :class:`~corr_pipeline.defs.resources.SnapshotParams`
    (validated at run start); ``store_dir`` overrides the matrix store directory (default
    :func:`settings.store_dir`); ``in_process`` uses the in-process executor instead of one
    process per step; ``max_concurrent`` caps parallel step processes (default: CPU count);
    ``forkserver`` starts step processes from a forkserver that has preloaded
    ``corr_pipeline.definitions`` (dagster, numpy, numba kernels), saving the few seconds each
    freshly spawned step would spend importing them; ``log_level`` is the console log level
    (the instance's event log keeps everything).
    """
    check_partition_key(partition_key)
    resources: dict[str, Any] = {}
    if params:
        # Mistyped and inconsistent values are refused here, before a run starts, as one
        # ValueError naming every field (inside the run Dagster reports them only as the cause
        # of a generic resource-initialisation error). Unknown keys are refused by Dagster's
        # config check, which names them.
        SnapshotParams(**params)
        resources["snapshot_params"] = {"config": dict(params)}
    store = Path(store_dir).expanduser().resolve() if store_dir else settings.store_dir()
    if store_dir:
        resources["matrix_io_manager"] = {"config": {"base_dir": str(store)}}
        resources["matrix_store"] = {"config": {"base_dir": str(store)}}
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if resources:
        run_config["resources"] = resources
    if in_process:
        run_config["execution"] = {"config": {"in_process": {}}}
    else:
        multiprocess: dict[str, Any] = {}
        if max_concurrent:
            multiprocess["max_concurrent"] = int(max_concurrent)
        if forkserver:
            multiprocess["start_method"] = {
                "forkserver": {"preload_modules": ["corr_pipeline.definitions"]}
            }
        if multiprocess:
            run_config["execution"] = {"config": {"multiprocess": multiprocess}}

    owned = instance is None
    instance = instance or open_instance()
    home = Path(instance.root_directory) if instance.is_persistent else settings.dagster_home()
    try:
        with dg.execute_job(
            dg.reconstructable(snapshot_job_def),
            instance=instance,
            run_config=run_config,
            tags={"dagster/partition": partition_key},
            raise_on_error=raise_on_error,
        ) as result:
            return summarize(result, partition_key, home, store, instance)
    finally:
        if owned:
            instance.dispose()
