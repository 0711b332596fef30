"""The Dagster instance of the project: its SQLite storage keeps its event log's databases open.

Dagster's ``SqliteEventLogStorage`` opens a new SQLAlchemy engine and SQLite connection for every
write and closes it after the commit. Closing the last connection of a WAL database checkpoints
it, and a new engine compiles every statement again, so one event costs milliseconds; a
backfill records about 25 events per session (its
materializations, check evaluations and planned materializations), which made Dagster's
bookkeeping cost more than the computation of a small universe.

:class:`PooledSqliteEventLogStorage` is the same storage (the same files, schema and
queries) with two changes:

- one engine per database, kept open (the index database and the most recently used run
  databases, :data:`OPEN_RUN_DATABASES`), whose single connection the storage's own lock already
  serialises; the file of a run database is touched after each write, so the file watchers that
  stream a run's events (``watch``, woken by the checkpoint of the close before) see new events
  at once, while SQLite checkpoints the write-ahead log itself every thousand pages; a table
  Dagster looks for before every check evaluation is looked up once;
- :meth:`store_event_batch` writes a batch in one transaction per database (and updates each
  asset's row once per kind of event, with the last one's values). Dagster sends batches
  (the planned materializations of a run, a step's materializations of a range of partitions,
  and the snapshot op's report of a session, :mod:`corr_pipeline.defs.ranges`) when
  ``DAGSTER_EVENT_BATCH_SIZE`` is set, which this storage sets (when unset) for the processes
  that use it.

After a ``fork`` the child forgets the parent's connections and opens its own.

:class:`PooledSqliteStorage` is ``DagsterSqliteStorage`` (runs, schedules and event log under one
directory) with this event log. :class:`SnapshotInstance`, the instance class ``dagster.yaml``
names, makes it the default storage of the instance's directory (where Dagster's default is
``DagsterSqliteStorage``); a ``storage:`` entry in ``dagster.yaml`` (PostgreSQL, say) still
replaces it. Whichever storage it has, opening the instance creates the snapshot pool there at
its default limit if it is missing (:mod:`corr_pipeline.defs.pool`)::

    instance_class:
      module: corr_pipeline.defs.instance_storage
      class: SnapshotInstance
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import dagster as dg
import yaml
from dagster import DagsterInstance
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from corr_pipeline.defs.dagster_private import (
    ASSET_CHECK_EVENTS,
    ASSET_EVENTS,
    BATCH_WRITABLE_EVENTS,
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    ConfigurableClassData,
    DagsterEventBatchMetadata,
    DagsterSqliteStorage,
    InstanceRef,
    SqliteEventLogStorage,
    SqliteRunStorage,
    SqliteScheduleStorage,
    db_result,
    event_logs_directory,
    runs_directory,
    schedule_directory,
)
from corr_pipeline.defs.event_secrets import hide_event_secrets
from corr_pipeline.defs.pool import SNAPSHOT_POOL, ensure_snapshot_pool

__all__ = [
    "OPEN_RUN_DATABASES",
    "PooledSqliteEventLogStorage",
    "PooledSqliteStorage",
    "SnapshotInstance",
]

#: Run databases whose engines stay open at once (the most recently used): a run worker writes
#: one; the web server and the daemon read many, so the others are closed.
OPEN_RUN_DATABASES = 8
#: ``DAGSTER_EVENT_BATCH_SIZE`` when unset: the most events Dagster buffers before a batch write.
EVENT_BATCH_SIZE = "1000"

#: The events :meth:`PooledSqliteEventLogStorage.store_event_batch` writes together: Dagster's
#: batchable events that are asset events (materializations, observations, failures, planned).
BATCHED_EVENTS = BATCH_WRITABLE_EVENTS & ASSET_EVENTS

_STORAGES: weakref.WeakSet[PooledSqliteEventLogStorage] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for storage in list(_STORAGES):
        storage.forget_connections()


os.register_at_fork(after_in_child=_forget_after_fork)


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` with its databases kept open and batches written in one
    transaction (module docstring)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_lock = threading.Lock()
        self._tables: set[str] = set()
        super().__init__(base_dir, inst_data=inst_data)
        os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", EVENT_BATCH_SIZE)
        _STORAGES.add(self)

    def _engine(self, shard: str) -> Engine:
        """The open engine of ``shard`` (created on first use; the least recently used run
        database's is closed beyond :data:`OPEN_RUN_DATABASES`)."""
        with self._engines_lock:
            engine = self._engines.get(shard)
            if engine is not None:
                self._engines.move_to_end(shard)
                return engine
            engine = create_engine(
                self.conn_string_for_shard(shard),
                poolclass=StaticPool,  # one connection, used under the storage's lock
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            )
            self._engines[shard] = engine
            runs = [name for name in self._engines if name != INDEX_SHARD_NAME]
            for name in runs[: max(0, len(runs) - OPEN_RUN_DATABASES)]:
                self._engines.pop(name).dispose()
            return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn:
                sqlite: Any = conn.connection.driver_connection
                before = sqlite.total_changes
                with conn.begin():
                    yield conn
                if shard != INDEX_SHARD_NAME and sqlite.total_changes != before:
                    os.utime(self.path_for_shard(shard))  # the run's file watchers wake up

    @property
    def open_databases(self) -> list[str]:
        """The databases whose engines are open (run ids, ``index``), least recently used
        first."""
        return list(self._engines)

    def has_table(self, table_name: str) -> bool:
        """Whether the index database has ``table_name`` (Dagster asks before every check
        evaluation, sometimes inside a transaction of this storage); looked up as Dagster does,
        on a connection of its own, and a table found is remembered (no migration drops one
        while a process runs)."""
        if table_name in self._tables:
            return True
        found = super().has_table(table_name)
        if found:
            self._tables.add(table_name)
        return found

    def forget_connections(self) -> None:
        """Drop the engines without closing them (a forked child must not use or close the
        parent's connections); the next use opens new ones."""
        self._engines = OrderedDict()
        self._engines_lock = threading.Lock()
        self._db_lock = threading.Lock()

    def _close_engines(self, keep_index: bool = False) -> None:
        with self._engines_lock:
            for name in list(self._engines):
                if keep_index and name == INDEX_SHARD_NAME:
                    continue
                self._engines.pop(name).dispose()

    def store_event_batch(self, events: Sequence[dg.EventLogEntry]) -> None:
        """Store ``events`` as :meth:`store_event` would: the :data:`BATCHED_EVENTS` in one
        transaction per run database and one in the index database (each asset's row updated
        once per kind of event, with the last one's values, which leaves it as all of them
        would); the check evaluations too, each then recorded as its check's execution (as
        :meth:`store_event` does); any other event on its own."""
        batched = [e for e in events if e.dagster_event_type in BATCHED_EVENTS | ASSET_CHECK_EVENTS]
        statements = [self.prepare_insert_event(event) for event in batched]
        runs: dict[str, list[Any]] = {}
        for event, statement in zip(batched, statements, strict=True):
            runs.setdefault(event.run_id, []).append(statement)
        for run_id, run_statements in runs.items():
            with self.run_connection(run_id) as conn:
                for statement in run_statements:
                    conn.execute(statement)
        ids: list[Any] = []
        if batched:
            with self.index_transaction() as conn:
                for statement in statements:
                    with db_result(conn, statement) as result:
                        ids.append(result.inserted_primary_key[0])
                assets = [
                    (event, event_id)
                    for event, event_id in zip(batched, ids, strict=True)
                    if event.dagster_event_type in BATCHED_EVENTS
                ]
                if assets:
                    self._store_asset_event_tags(conn, *zip(*assets, strict=True))
                last: dict[tuple[Any, Any], tuple[int, dg.EventLogEntry, Any]] = {}
                for position, (event, event_id) in enumerate(assets):
                    kind = (event.get_dagster_event().asset_key, event.dagster_event_type)
                    last[kind] = (position, event, event_id)
                for _, event, event_id in sorted(last.values(), key=lambda item: item[0]):
                    self._store_asset_event(conn, event, event_id)
        for event, event_id in zip(batched, ids, strict=True):
            if event.dagster_event_type in ASSET_CHECK_EVENTS:
                self.store_asset_check_event(event, event_id)
        for event in events:
            if event.dagster_event_type not in BATCHED_EVENTS | ASSET_CHECK_EVENTS:
                self.store_event(event)

    def wipe(self) -> None:
        self._close_engines(keep_index=True)
        super().wipe()

    def dispose(self) -> None:
        self._close_engines()
        super().dispose()


class PooledSqliteStorage(DagsterSqliteStorage):
    """``DagsterSqliteStorage`` (runs in ``history/``, event logs in ``history/runs/``,
    schedules in ``schedules/`` under ``base_dir``) whose event log is
    :class:`PooledSqliteEventLogStorage`."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        # DagsterSqliteStorage.__init__ with the pooled event log in place of Dagster's
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(runs_directory(base_dir))
        self._event_log_storage = PooledSqliteEventLogStorage(event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(schedule_directory(base_dir))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData, config_value: dict[str, Any]
    ) -> PooledSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


class SnapshotInstance(DagsterInstance):
    """Dagster's instance whose default storage is :class:`PooledSqliteStorage` in the
    instance's directory (module docstring), which stores every event with the database
    password hidden (:func:`corr_pipeline.defs.event_secrets.hide_event_secrets`), and whose
    storage has the snapshot pool from the moment it is opened
    (:func:`corr_pipeline.defs.pool.ensure_snapshot_pool`: the pool's limit holds from the
    daemon's first pass, however the daemon was started)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            ensure_snapshot_pool(self)
        except Exception as exc:  # noqa: BLE001 - reported; the instance still opens
            logging.getLogger(__name__).warning(
                "could not create the concurrency pool %s in the instance's storage (%s): "
                "until it exists, the daemon's first pass may start every queued snapshot run",
                SNAPSHOT_POOL,
                exc,
            )

    def handle_new_event(
        self, event: dg.EventLogEntry, *, batch_metadata: DagsterEventBatchMetadata | None = None
    ) -> None:
        super().handle_new_event(hide_event_secrets(event), batch_metadata=batch_metadata)

    def store_event(self, event: dg.EventLogEntry) -> None:
        super().store_event(hide_event_secrets(event))

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        return {}

    @staticmethod
    def config_defaults(base_dir: str) -> dict[str, ConfigurableClassData | None]:
        defaults = dict(InstanceRef.config_defaults(base_dir))
        defaults["storage"] = ConfigurableClassData(
            __name__, PooledSqliteStorage.__name__, yaml.dump({"base_dir": base_dir})
        )
        return defaults
