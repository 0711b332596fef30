"""What changed since the previous session: the ``snapshot_changes`` step (SPEC §10), no Dagster.

The *previous session* of a snapshot date ``D`` is the newest published ``snapshot_date < D``
(:func:`previous_session`); with none there is nothing to compare and nothing is recorded.
Both sides are read the same way, so the changes describe exactly what was published:

- the published rows of both dates (:func:`corr_pipeline.db.reads.published_rows`: symbols,
  neighbors, clusters, lead-lag pairs) give the symbols that entered or left, the neighbor
  turnover, the cluster migrations and the lead-lag changes;
- the correlation and overlap matrices of both dates, at the versions each publication pins
  (SPEC §8), read as memory maps while a shared hold keeps retention away, give the drift and
  the top moves. When the previous date's matrices are gone (retention removed them before a
  late backfill), those two parts are skipped and :attr:`ChangesResults.skipped` says why.

Memory at N = 24,000: the matrices are read in place (row blocks of
:func:`corr_pipeline.compute.changes.correlation_changes`); the rest is O(N·k + pairs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute.changes import (
    DEFAULT_QUANTILES,
    ClusterMigrations,
    CorrelationChanges,
    LeadLagChanges,
    SymbolMatch,
    cluster_migrations,
    correlation_changes,
    lead_lag_changes,
    match_symbols,
    neighbor_turnover,
)
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.db.reads import PublishedRows, published_dates, published_rows
from corr_pipeline.store.matrix_store import (
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    StoredArray,
)

__all__ = [
    "CORRELATION_PARTS",
    "ChangesResults",
    "compute_changes",
    "previous_session",
]

#: The parts that need both dates' matrices (skipped when the previous ones were pruned).
CORRELATION_PARTS = ("drift", "top_moves")

_MATRICES = (("correlation_matrix", "corr"), ("overlap_matrix", "overlap"))


@dataclass(frozen=True)
class ChangesResults:
    """The changes of ``snapshot_date`` against ``previous_date`` (SPEC §10).

    ``today`` / ``previous``: the published rows of each date; ``match``: their symbols matched
    by name; ``correlation``: drift and top moves (None when skipped); ``n_neighbors`` /
    ``new_neighbors``: the turnover per common symbol; ``clusters``, ``lead_lag``: the
    migrations and lead-lag changes; ``skipped``: ``{part: reason}`` for the parts not computed;
    ``params``: the parameters used (recorded with the publication).
    """

    snapshot_date: dt.date
    previous_date: dt.date
    today: PublishedRows
    previous: PublishedRows
    match: SymbolMatch
    correlation: CorrelationChanges | None
    n_neighbors: np.ndarray
    new_neighbors: np.ndarray
    clusters: ClusterMigrations
    lead_lag: LeadLagChanges
    skipped: dict[str, str] = field(default_factory=dict)
    params: dict = field(default_factory=dict)


def previous_session(engine: sa.Engine, day: dt.date) -> dt.date | None:
    """The newest published snapshot date before ``day``, or None."""
    earlier = published_dates(engine, before=day)
    return earlier[-1] if earlier else None


def _open_matrices(
    store: MatrixStore, rows: PublishedRows, stack: contextlib.ExitStack
) -> tuple[StoredArray, StoredArray] | str:
    """The pinned corr and overlap of a published date as memory maps, held against retention
    until ``stack`` closes; or the reason they cannot be read."""
    partition = rows.snapshot_date.isoformat()
    pins = rows.matrix_versions or {}
    opened: list[StoredArray] = []
    for asset, name in _MATRICES:
        hold = store.hold_existing_partition(asset, partition)
        if hold is not None:
            stack.callback(hold.release)
        version = (pins.get(asset) or {}).get(name)
        try:
            if hold is None:
                raise MatrixNotFoundError(f"{asset}/{partition} is not in the store")
            opened.append(store.load(asset, partition, name, version=version))
        except MatrixStoreError as exc:
            if store.pruned(partition) is not None:
                return (
                    f"the matrices of {partition} were removed by retention "
                    "(CORR_PIPELINE_KEEP_MATRICES)"
                )
            return f"{asset} of {partition} cannot be read: {exc}"
        if opened[-1].labels.get("symbols") != rows.symbols:
            return f"{asset} of {partition} holds other symbols than its publication"
    return opened[0], opened[1]


def compute_changes(
    engine: sa.Engine,
    store: MatrixStore,
    day: dt.date,
    *,
    previous: dt.date | None = None,
    top_m: int = 100,
    min_members: int = 2,
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    log: Callable[[str], None] | None = None,
) -> ChangesResults | None:
    """The changes of the published snapshot of ``day`` against ``previous`` (default: its
    :func:`previous_session`); None when there is no previous session.

    ``top_m``: pairs kept by |Δcorr| (SPEC §10.2); ``min_members``: the split/merge threshold
    (SPEC §10.4); ``min_overlap`` is today's snapshot parameter. Raises ``LookupError`` when
    ``day`` itself is not published.
    """
    say = log or (lambda _message: None)
    today = published_rows(engine, day)
    if today is None:
        raise LookupError(f"the snapshot of {day} is not published")
    if previous is None:
        previous = previous_session(engine, day)
    if previous is None:
        return None
    before = published_rows(engine, previous)
    if before is None:
        raise LookupError(f"the snapshot of {previous} is not published")
    min_overlap = int(today.params.get("min_overlap", 2))
    match = match_symbols(today.symbols, before.symbols)
    say(
        f"changes {day} vs {previous}: {len(match.common)} common symbols, "
        f"{match.entered.size} entered, {match.left.size} left"
    )
    skipped: dict[str, str] = {}
    correlation: CorrelationChanges | None = None
    with contextlib.ExitStack() as stack:
        opened_today = _open_matrices(store, today, stack)
        opened_before = _open_matrices(store, before, stack)
        reason = next((o for o in (opened_before, opened_today) if isinstance(o, str)), None)
        if reason is not None:
            skipped = dict.fromkeys(CORRELATION_PARTS, reason)
            say(f"skipped {', '.join(CORRELATION_PARTS)}: {reason}")
        else:
            assert not isinstance(opened_today, str) and not isinstance(opened_before, str)
            correlation = correlation_changes(
                opened_today[0].array,
                opened_today[1].array,
                opened_before[0].array,
                opened_before[1].array,
                match.today_index,
                match.previous_index,
                min_overlap=min_overlap,
                top_m=top_m,
                quantiles=quantiles,
                working_memory_mb=working_memory_mb,
            )
    n_neighbors, new_neighbors = neighbor_turnover(
        match, today.neighbor_index, before.neighbor_index, working_memory_mb=working_memory_mb
    )
    return ChangesResults(
        snapshot_date=day,
        previous_date=previous,
        today=today,
        previous=before,
        match=match,
        correlation=correlation,
        n_neighbors=n_neighbors,
        new_neighbors=new_neighbors,
        clusters=cluster_migrations(
            today.cluster_labels, before.cluster_labels, match, min_members=min_members
        ),
        lead_lag=lead_lag_changes(
            today.lead_lag_pairs, before.lead_lag_pairs, match, len(today.symbols)
        ),
        skipped=skipped,
        params={
            "top_m": int(top_m),
            "min_members": int(min_members),
            "min_overlap": min_overlap,
            "quantiles": list(quantiles),
        },
    )
