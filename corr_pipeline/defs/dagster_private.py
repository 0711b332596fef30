"""What the pipeline takes from Dagster that Dagster does not export (``dagster._``): here alone,
each with why, so that the rest of the project uses Dagster's public API only.
``corr_pipeline_tests/defs/test_dagster_private.py`` pins what each is relied on for (and that
no other module reaches into ``dagster._``): a Dagster release that moves or changes one fails
that test, not a night's run. Written against Dagster 1.13 (``pyproject.toml`` pins the family).
"""

from __future__ import annotations

# The executor config schemas of Dagster's multiprocess and in-process executors: the
# pipeline's executor offers the same two with its own default, a forkserver (``executor``).
from dagster._core.definitions.executor_definition import IN_PROC_CONFIG, MULTI_PROC_CONFIG

# A range's per-session materializations written as one batch of events (``ranges``), and the
# event log storage that writes such batches in one SQLite transaction (``instance_storage``).
from dagster._core.events import (
    ASSET_CHECK_EVENTS,
    ASSET_EVENTS,
    BATCH_WRITABLE_EVENTS,
    DagsterEventBatchMetadata,
    generate_event_batch_id,
)

# The storages the project's pooled SQLite storage extends (``instance_storage``): the same files
# and schema as Dagster's default, its connections kept open; an instance's default config.
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage import sqlite_storage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

# The run tags Dagster itself writes and reads by name: a partition's run (``run``), a resumed
# run (``assets``: a resumed run recomputes rather than trusts what a killed one left).
from dagster._core.storage.tags import PARTITION_NAME_TAG, PARTITION_SET_TAG, RESUME_RETRY_TAG

# The workspace of a code location in this process: runs launched as ``dagster job launch``
# launches them (``run``) and the UI's application served by ``corr-pipeline ui``
# (``cli.webserver_app``).
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget, WorkspaceFileTarget

# How often a live daemon writes its heartbeat: a backfill tells a gone daemon from a slow one.
from dagster._daemon.controller import DEFAULT_HEARTBEAT_INTERVAL_SECONDS
from dagster._serdes import ConfigurableClassData

runs_directory = sqlite_storage._runs_directory
event_logs_directory = sqlite_storage._event_logs_directory
schedule_directory = sqlite_storage._schedule_directory

__all__ = [
    "ASSET_CHECK_EVENTS",
    "ASSET_EVENTS",
    "BATCH_WRITABLE_EVENTS",
    "DEFAULT_HEARTBEAT_INTERVAL_SECONDS",
    "INDEX_SHARD_NAME",
    "IN_PROC_CONFIG",
    "MULTI_PROC_CONFIG",
    "PARTITION_NAME_TAG",
    "PARTITION_SET_TAG",
    "RESUME_RETRY_TAG",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "ConfigurableClassData",
    "DagsterEventBatchMetadata",
    "DagsterSqliteStorage",
    "InstanceRef",
    "ModuleTarget",
    "SqliteEventLogStorage",
    "SqliteRunStorage",
    "SqliteScheduleStorage",
    "WorkspaceFileTarget",
    "WorkspaceProcessContext",
    "db_result",
    "event_logs_directory",
    "generate_event_batch_id",
    "runs_directory",
    "schedule_directory",
]
