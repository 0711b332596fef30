"""Retention of the matrix store (SPEC §8): only the newest published partitions keep matrices.

What PostgreSQL knows (the published dates and the store versions each snapshot pins,
:func:`corr_pipeline.db.published_reads.published_matrix_versions`) meets what the store holds. Used by the
``snapshot_publication`` asset after every publication and by ``corr-pipeline store list`` /
``store prune``; no Dagster here.

:func:`apply_retention` with ``keep = K``:

1. takes every partition of the store exclusively, without waiting; a partition in use by another
   process (a step of a run in flight holds it, a writer holds one of its files) or named in
   ``in_flight`` (runs the caller knows are in progress) is left alone entirely;
2. only then reads the published dates and their pinned versions (``read_published``): no
   publication of a locked partition can commit meanwhile, so the pins are current;
3. keeps the newest ``K`` published dates: their superseded versions are garbage-collected (a
   version survives while a current manifest or the date's publication names it); and, when
   ``read_changed`` is given, the previous published date of every published date whose
   changes (SPEC §10) are not recorded yet, so that ``snapshot_changes`` can still read its
   matrices (kept the same way): a session backfilled below the newest ``K`` compares with
   its predecessor like any other;
4. removes the partitions of every other published date, and of unpublished dates older than the
   oldest kept one (a failed run's leftovers), recording what was removed in the store's
   ``.retention/`` so that ``query corr`` can say the matrices were pruned; the published rows
   stay in PostgreSQL;
5. never removes ``writing`` (the partition being published; it is only garbage-collected), nor
   an unpublished partition newer than the kept window (it may be about to be published).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich import filesize

from corr_pipeline.store.matrix_store import (
    GarbageReport,
    MatrixStore,
    PartitionBusyError,
    RemovalReport,
)

__all__ = [
    "PartitionEntry",
    "Published",
    "RetentionReport",
    "apply_retention",
    "format_bytes",
    "not_kept",
    "store_inventory",
]

#: ``{snapshot date: pinned versions {asset: {array: version}} or None}`` of every published date.
Published = Mapping[dt.date, Mapping[str, Mapping[str, str]] | None]


def _date(key: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(key)
    except ValueError:
        return None


def not_kept(
    sessions: Collection[dt.date], published: Collection[dt.date], keep: int
) -> set[dt.date]:
    """The sessions of a run that retention removes once the run has published them: those with
    at least ``keep`` newer dates among the ``published`` ones and the run's own. Their matrices
    go to the store's memory area (:mod:`corr_pipeline.store.memory`), never to disk; the run's
    later steps (the changes of each session against the one before it, and of the published
    session after the run) read them there."""
    kept = set(sorted(set(published) | set(sessions), reverse=True)[:keep])
    return {day for day in sessions if day not in kept}


def published_before(sessions: Collection[dt.date], published: Collection[dt.date]) -> set[dt.date]:
    """For each of ``sessions``, the newest ``published`` date before it (none for a session
    older than every published one): the sessions whose matrices the changes of a range read,
    so retention leaves them alone while the range runs."""
    ordered = sorted(published)
    return {ordered[i - 1] for day in sessions if (i := bisect.bisect_left(ordered, day))}


def retain_after_each_session(in_memory: int, session_bytes: int, area_budget_bytes: int) -> bool:
    """Whether a range applies retention after each session rather than after its last: when
    the matrices (``session_bytes`` each) of its ``in_memory`` sessions that retention will not
    keep would not all fit a quarter of the store's memory area. The area then holds at most
    two sessions' matrices (the session's and the one before, which its changes read)."""
    return in_memory > 0 and in_memory * session_bytes > area_budget_bytes // 4


def format_bytes(n: int) -> str:
    """``n`` bytes as a short human figure (``3.5 GB``, SI units: rich's ``filesize.decimal``)."""
    return filesize.decimal(n)


@dataclass
class RetentionReport:
    """What :func:`apply_retention` did (or, ``dry_run``, would do)."""

    keep: int
    dry_run: bool
    kept: list[str] = field(default_factory=list)
    removed: list[RemovalReport] = field(default_factory=list)
    collected: GarbageReport = field(default_factory=GarbageReport)
    busy: list[str] = field(default_factory=list)
    unpublished_kept: list[str] = field(default_factory=list)
    kept_for_changes: list[str] = field(default_factory=list)

    @property
    def removed_partitions(self) -> list[str]:
        return [r.partition for r in self.removed]

    @property
    def freed_bytes(self) -> int:
        return sum(r.bytes for r in self.removed) + self.collected.freed_bytes

    def lines(self) -> list[str]:
        """Human summary, one fact per line."""
        would = "would " if self.dry_run else ""
        out = [
            f"retention: keep the matrices of the newest {self.keep} published partition(s): "
            + (", ".join(self.kept) or "none published")
        ]
        for r in self.removed:
            out.append(
                f"  {would}remove {r.partition}: {', '.join(r.assets)} "
                f"({len(r.versions)} version(s), {format_bytes(r.bytes)})"
            )
        deleted = self.collected.deleted
        if deleted:
            out.append(
                f"  {would}delete {len(deleted)} superseded version(s) "
                f"({format_bytes(self.collected.freed_bytes)}) in "
                + ", ".join(sorted({v.partition for v in deleted}))
            )
        if self.collected.temps_removed:
            out.append(f"  {would}delete {len(self.collected.temps_removed)} stale temp file(s)")
        if self.busy:
            out.append(f"  left alone (in use, a run in flight): {', '.join(sorted(self.busy))}")
        if self.kept_for_changes:
            out.append(
                "  kept until the changes of the next session are computed: "
                + ", ".join(self.kept_for_changes)
            )
        if self.unpublished_kept:
            out.append(
                "  kept, not published (newer than the kept window): "
                + ", ".join(self.unpublished_kept)
            )
        out.append(
            f"  {'would free' if self.dry_run else 'freed'} {format_bytes(self.freed_bytes)}"
        )
        return out


def apply_retention(
    store: MatrixStore,
    read_published: Callable[[], Published],
    keep: int,
    *,
    writing: str | None = None,
    in_flight: Collection[str] = (),
    dry_run: bool = False,
    read_changed: Callable[[], Collection[dt.date]] | None = None,
) -> RetentionReport:
    """Keep the matrices of the newest ``keep`` published partitions, remove the others (see the
    module docstring); ``read_published`` (and ``read_changed``, the snapshot dates whose
    changes are recorded) are called once, after the partitions are locked."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    report = RetentionReport(keep=keep, dry_run=dry_run)
    keys = [k for k in store.files.partition_keys() if _date(k) is not None]
    with contextlib.ExitStack() as stack:
        locked: list[str] = []
        for key in keys:
            if key in in_flight and key != writing:
                report.busy.append(key)
                continue
            held = stack.enter_context(
                store.collector.exclusive_partition(key, allow_upgrade=key == writing)
            )
            if held:
                locked.append(key)
            else:
                report.busy.append(key)
        published = read_published()
        published_keys = sorted(d.isoformat() for d in published)
        kept = published_keys[-keep:]
        report.kept = kept
        if read_changed is not None:
            changed = {d.isoformat() for d in read_changed()}
            position = {key: i for i, key in enumerate(published_keys)}
            report.kept_for_changes = sorted(
                {
                    published_keys[position[key] - 1]
                    for key in published_keys
                    if key not in changed and position[key] > 0
                }
                - set(kept)
            )
            kept = sorted(set(kept) | set(report.kept_for_changes))
        oldest_kept = kept[0] if kept else None
        for key in locked:
            pins: Any = published.get(dt.date.fromisoformat(key))
            remove = (
                key != writing
                and key not in kept
                and (key in published_keys or (oldest_kept is not None and key < oldest_kept))
            )
            if remove:
                try:
                    report.removed.append(
                        store.collector.remove_partition(
                            key,
                            reason=f"retention: the newest {keep} published partitions keep "
                            f"their matrices ({', '.join(kept)})",
                            dry_run=dry_run,
                        )
                    )
                except PartitionBusyError:
                    report.busy.append(key)
                continue
            if key not in published_keys and key != writing:
                report.unpublished_kept.append(key)
            report.collected.merge(
                store.collector.collect_garbage(
                    {key: pins or {}},
                    partitions=[key],
                    dry_run=dry_run,
                    allow_upgrade=[key] if key == writing else (),
                )
            )
    return report


@dataclass(frozen=True)
class PartitionEntry:
    """One partition of the store as ``corr-pipeline store list`` shows it.

    ``pinned``: ``"yes"`` (every version its publication pins is on disk), ``"partly"``,
    ``"no"``, ``"unrecorded"`` (published without recorded versions) or ``"-"`` (not published).
    ``in_use``: another process holds it (a run in flight, a writer).
    """

    partition: str
    assets: list[str]
    bytes: int
    versions: int
    published: bool
    pinned: str
    in_use: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "assets": self.assets,
            "bytes": self.bytes,
            "versions": self.versions,
            "published": self.published,
            "pinned": self.pinned,
            "in_use": self.in_use,
        }


def store_inventory(store: MatrixStore, published: Published) -> list[PartitionEntry]:
    """Every partition of the store (oldest first): assets, bytes on disk, versions, published
    or not, whether its pinned versions are there, whether it is in use."""
    out: list[PartitionEntry] = []
    for key in store.files.partition_keys():
        usage = store.files.disk_usage(key)
        versions = {
            (asset, v.name, v.version)
            for asset in usage
            for v in store.files.versions(asset, key)
            if v.complete
        }
        day = _date(key)
        is_published = day is not None and day in published
        pins = published.get(day) if is_published and day is not None else None
        if not is_published:
            pinned = "-"
        elif pins is None:
            pinned = "unrecorded"
        else:
            wanted = {(a, n, v) for a, arrays in pins.items() for n, v in arrays.items()}
            present = len(wanted & versions)
            pinned = "yes" if present == len(wanted) else "partly" if present else "no"
        with store.collector.exclusive_partition(key) as free:
            in_use = not free
        out.append(
            PartitionEntry(
                partition=key,
                assets=sorted(usage),
                bytes=sum(usage.values()),
                versions=len(versions),
                published=is_published,
                pinned=pinned,
                in_use=in_use,
            )
        )
    return out
