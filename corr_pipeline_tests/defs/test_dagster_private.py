"""What the pipeline relies on in Dagster's unexported API (``corr_pipeline/defs/
dagster_private.py``), pinned: no other module of the package reaches into ``dagster._``, and
each name still is what the pipeline uses it as. A Dagster release that moves or changes one
fails here, by name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import dagster as dg
import pytest

from corr_pipeline.defs import dagster_private as private
from corr_pipeline.defs.run import IN_PROGRESS_STATUSES

PACKAGE = Path(__file__).resolve().parents[2] / "corr_pipeline"
PRIVATE_MODULE = PACKAGE / "defs" / "dagster_private.py"


def _dagster_private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if n.startswith("dagster._")]
    return found


def test_only_one_module_imports_dagster_private_names() -> None:
    reaching = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PRIVATE_MODULE and (found := _dagster_private_imports(path))
    }
    assert not reaching, reaching
    assert _dagster_private_imports(PRIVATE_MODULE)  # the scan sees such imports


def test_the_tags_dagster_writes_and_reads() -> None:
    assert private.PARTITION_NAME_TAG == "dagster/partition"
    assert private.PARTITION_SET_TAG == "dagster/partition_set"
    assert private.RESUME_RETRY_TAG == "dagster/is_resume_retry"


def test_in_progress_statuses_are_dagster_s() -> None:
    from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

    assert set(IN_PROGRESS_STATUSES) == set(IN_PROGRESS_RUN_STATUSES)
    assert all(isinstance(s, dg.DagsterRunStatus) for s in IN_PROGRESS_STATUSES)


def test_the_daemon_heartbeat_interval_is_seconds() -> None:
    assert isinstance(private.DEFAULT_HEARTBEAT_INTERVAL_SECONDS, int | float)
    assert 0 < private.DEFAULT_HEARTBEAT_INTERVAL_SECONDS <= 60


def test_the_executor_config_schemas() -> None:
    """The pipeline's executor offers Dagster's two schemas; the multiprocess one takes the
    forkserver start method and a process limit."""
    assert {"max_concurrent", "start_method"} <= set(private.MULTI_PROC_CONFIG.config_type.fields)
    assert isinstance(private.IN_PROC_CONFIG, type(private.MULTI_PROC_CONFIG))
    assert callable(dg.multi_or_in_process_executor.executor_creation_fn)


def test_event_batches() -> None:
    batch = private.generate_event_batch_id()
    assert isinstance(batch, str) and batch != private.generate_event_batch_id()
    end = private.DagsterEventBatchMetadata(batch, True)
    assert (end.id, end.is_end) == (batch, True)
    assert dg.DagsterEventType.ASSET_MATERIALIZATION in private.BATCH_WRITABLE_EVENTS
    assert dg.DagsterEventType.ASSET_MATERIALIZATION in private.ASSET_EVENTS
    assert dg.DagsterEventType.ASSET_CHECK_EVALUATION in private.ASSET_CHECK_EVENTS


@pytest.mark.parametrize(
    ("cls", "methods"),
    [
        (private.SqliteEventLogStorage, ["store_event", "store_event_batch", "has_table", "wipe",
                                          "dispose", "_connect"]),
        (private.DagsterSqliteStorage, ["from_config_value", "config_type"]),
        (private.SqliteRunStorage, ["from_local"]),
        (private.SqliteScheduleStorage, ["from_local"]),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)  # fmt: skip
def test_the_storages_the_pooled_storage_extends(cls: type, methods: list[str]) -> None:
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    assert not missing, (cls, missing)


def test_the_sqlite_layout_and_instance_defaults(tmp_path: Path) -> None:
    base = str(tmp_path)
    for directory in (private.runs_directory, private.event_logs_directory,
                      private.schedule_directory):  # fmt: skip
        assert Path(directory(base)).is_relative_to(tmp_path)
    assert private.INDEX_SHARD_NAME == "index"
    assert isinstance(private.SQLITE_BUSY_TIMEOUT_SECONDS, int | float)
    defaults = dict(private.InstanceRef.config_defaults(base))
    assert {"storage", "run_launcher", "run_coordinator"} <= set(defaults)
    assert all(d is None or isinstance(d, private.ConfigurableClassData) for d in defaults.values())
    assert inspect.isfunction(private.db_result) or callable(private.db_result)


def test_the_workspace_targets_take_what_the_pipeline_gives() -> None:
    target = private.ModuleTarget(
        module_name="m", attribute=None, working_directory=None, location_name="l"
    )
    assert (target.module_name, target.location_name) == ("m", "l")
    assert private.WorkspaceFileTarget(paths=["workspace.yaml"]).paths == ["workspace.yaml"]
    context = inspect.signature(private.WorkspaceProcessContext).parameters
    assert {"instance", "workspace_load_target", "code_server_log_level"} <= set(context)
    assert hasattr(private.WorkspaceProcessContext, "__enter__")
