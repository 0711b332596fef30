"""Materialize the snapshot graph from Python (the ``corr-pipeline demo`` command, scripts, tests).

:func:`materialize_snapshot` runs ``snapshot_job`` for one partition through
``dagster.execute_job`` on a *persistent* Dagster instance, with the multiprocess executor by
default (each step in its own process, exactly as the daemon would run it). The run is recorded
in that instance, so ``dagster dev`` started with the same ``DAGSTER_HOME`` shows it (assets,
checks, metadata plots) afterwards.

Instance resolution: the ``instance`` argument, else ``$DAGSTER_HOME`` if set, else
``$CORR_PIPELINE_HOME/dagster_home`` (created, with the repository's ``dagster.yaml`` copied in
when available).
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
from corr_pipeline.defs.partitions import partition_key_for, snapshot_partitions

SNAPSHOT_JOB_NAME = "snapshot_job"
REPO_DAGSTER_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml"


def snapshot_job_def() -> dg.JobDefinition:
    """``snapshot_job`` resolved from the code location (module-level, so it is reconstructable
    in the step subprocesses of the multiprocess executor)."""
    from corr_pipeline.definitions import defs

    return defs.resolve_job_def(SNAPSHOT_JOB_NAME)


def default_dagster_home() -> Path:
    """``$DAGSTER_HOME`` if set, else ``$CORR_PIPELINE_HOME/dagster_home``."""
    env = os.environ.get("DAGSTER_HOME", "").strip()
    if env:
        return Path(env).expanduser().resolve()
    return settings.corr_pipeline_home() / "dagster_home"


def open_instance(dagster_home: Path | None = None) -> dg.DagsterInstance:
    """A persistent instance in ``dagster_home`` (default :func:`default_dagster_home`),
    created with the repository's ``dagster.yaml`` if the directory has none."""
    home = settings.ensure_dir(dagster_home or default_dagster_home())
    config = home / "dagster.yaml"
    if not config.exists() and REPO_DAGSTER_YAML.is_file():
        shutil.copyfile(REPO_DAGSTER_YAML, config)
    return dg.DagsterInstance.from_config(str(home))


def latest_partition_key(engine: sa.Engine, today: dt.date | None = None) -> str:
    """The partition containing the last ``trade_date`` in ``prices`` (a weekend date maps to
    the Friday before). Raises ValueError when ``prices`` is empty or the date is outside the
    partitions (before ``$CORR_PIPELINE_PARTITION_START`` or in the future)."""
    with engine.connect() as conn:
        last = conn.execute(sa.text("SELECT max(trade_date) FROM prices")).scalar_one()
    if last is None:
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
            f"{key} is not a snapshot partition (weekdays {span}; the first one is set by "
            "CORR_PIPELINE_PARTITION_START)"
        )


@dataclass
class SnapshotRunSummary:
    """What one snapshot run produced, from its materialization and check events."""

    partition_key: str
    run_id: str
    success: bool
    dagster_home: Path
    store_dir: Path
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    failed_steps: list[str] = field(default_factory=list)

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
            f"{self.value('returns_matrix', 'bad_prices', '?')} bad prices",
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
    result: Any, partition_key: str, dagster_home: Path, store_dir: Path
) -> SnapshotRunSummary:
    """Collect materialization metadata and check outcomes from an execution result."""
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
        from corr_pipeline.defs.resources import SnapshotParams

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
    home = Path(instance.root_directory) if instance.is_persistent else default_dagster_home()
    try:
        with dg.execute_job(
            dg.reconstructable(snapshot_job_def),
            instance=instance,
            run_config=run_config,
            tags={"dagster/partition": partition_key},
            raise_on_error=raise_on_error,
        ) as result:
            return summarize(result, partition_key, home, store)
    finally:
        if owned:
            instance.dispose()


# --------------------------------------------------------------------------------------------
# corr-pipeline demo: the pipeline step
# --------------------------------------------------------------------------------------------


class SnapshotRunError(ValueError):
    """A snapshot run did not succeed (the CLI reports it in one line, exit status 2)."""


def demo_params(engine: sa.Engine, partition_key: str) -> dict[str, Any]:
    """Parameter overrides for the demo: none when the data holds a full default window
    (252 returns), otherwise a lookback shrunk to the history available (so a short CSV or a
    small synthetic universe still gives a snapshot), with the other windows scaled to fit."""
    from corr_pipeline.defs.resources import SnapshotParams

    defaults = SnapshotParams()
    with engine.connect() as conn:
        n_dates = conn.execute(
            sa.text(
                "SELECT count(*) FROM (SELECT DISTINCT trade_date FROM prices "
                "WHERE trade_date <= :d ORDER BY trade_date DESC LIMIT :n) AS w"
            ),
            {"d": partition_key, "n": defaults.lookback_days + 1},
        ).scalar_one()
    n_returns = int(n_dates) - 1
    if n_returns >= defaults.lookback_days:
        return {}
    if n_returns < 12:
        raise SnapshotRunError(
            f"only {n_dates} trade dates on or before {partition_key} in prices: a snapshot "
            "needs at least 13 (load more history, or let the demo seed a synthetic universe "
            "into an empty database)"
        )
    min_history = max(10, n_returns // 2)
    min_overlap = min(defaults.min_overlap, max(5, min_history // 2))
    max_lag = min(defaults.max_lag, min_history - 1, n_returns - min_overlap)
    return {
        "lookback_days": n_returns,
        "min_history_days": min_history,
        "min_overlap": min_overlap,
        "max_lag": max_lag,
    }


def demo_step_pipeline(ctx: Any) -> SnapshotRunSummary:
    """Materialize the whole graph for the partition of the last trade date and print a summary
    and how to open the UI. ``ctx`` is the CLI's ``DemoContext`` (``require_engine()``,
    ``echo``); raises :class:`SnapshotRunError` when the run fails."""
    engine = ctx.require_engine()
    key = latest_partition_key(engine)
    params = demo_params(engine, key)
    instance = open_instance()
    home = Path(instance.root_directory)
    try:
        ctx.echo(
            f"[3] pipeline: materializing snapshot_job for partition {key} "
            f"(one process per step; Dagster instance {home})"
        )
        if params:
            ctx.echo(f"    short price history: using {params}")
        summary = materialize_snapshot(key, instance=instance, params=params or None)
    finally:
        instance.dispose()
    for line in str(summary).splitlines():
        ctx.echo(f"    {line}")
    if not summary.success:
        raise SnapshotRunError(
            f"the snapshot run for {key} failed (steps: {', '.join(summary.failed_steps) or '?'}); "
            f"open the UI (below) or see run {summary.run_id} in {home}"
        )
    env = f"CORR_PIPELINE_HOME={settings.corr_pipeline_home()} DAGSTER_HOME={home}"
    ctx.echo("[4] explore the results:")
    ctx.echo(f"    Dagster UI:  {env} dagster dev")
    ctx.echo(
        "                 (from the repository root, which holds workspace.yaml; then open "
        "http://127.0.0.1:3000 -> Assets -> correlation_snapshot; this run is in Runs)"
    )
    ctx.echo(f"    tables:      snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs ({key})")
    ctx.echo(
        f"    matrices:    {summary.store_dir}/<asset>/{key}/*.npy (np.load(..., mmap_mode='r'))"
    )
    return summary
