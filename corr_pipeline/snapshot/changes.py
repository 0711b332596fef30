"""What changed since the previous session: the ``snapshot_changes`` step (SPEC §10), no Dagster.

The *previous session* of a snapshot date ``D`` is the newest published ``snapshot_date < D``
(:func:`previous_session`); with none there is nothing to compare and nothing is recorded.
When the session before ``D`` is not published (a gap in the history), the previous session is
an older one: :attr:`ChangesResults.sessions_between` counts the calendar's sessions strictly
between the two (0: overnight changes), recorded with the changes so that every place showing
them can say they are not overnight (SPEC §7 "Ranges").
Both sides are read the same way, so the changes describe exactly what was published:

- the published rows of both dates (:func:`corr_pipeline.db.published_reads.published_rows`: symbols,
  neighbors, clusters, lead-lag pairs) give the symbols that entered or left, the neighbor
  turnover, the cluster migrations and the lead-lag changes;
- the correlation and overlap matrices of both dates, at the versions each publication pins
  (SPEC §8), read as memory maps while a shared hold keeps retention away, give the drift and
  the top moves. When the previous date's matrices are gone (retention removed them before a
  late backfill), those two parts are skipped and :attr:`ChangesResults.skipped` says why.

The heads of both dates (:func:`corr_pipeline.db.published_reads.published_head`: symbols and pinned
versions, two small queries) are read first; the scan of the matrices then runs while two
connections read the rest of the rows and the parts that need only the rows (turnover,
clusters, lead-lag) are computed (the numba kernels release the GIL), instead of after them. Should a date be published again between the two reads (its rows' head differs from the
one scanned by), the matrices of the rows read are scanned again: the result always describes
one publication of each date.

Memory at N = 24,000: the matrices are read in place (row blocks of
:func:`corr_pipeline.compute.changes.correlation_changes`); the rest is O(N·k + pairs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

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
from corr_pipeline.db.publish_changes import (
    ChangesPublication,
    ChangesReport,
    StaleChangesError,
    publish_changes,
)
from corr_pipeline.db.published_reads import (
    PublishedHead,
    PublishedRows,
    published_before,
    published_head,
    published_rows,
)
from corr_pipeline.sessions import SessionCalendar, configured_calendar
from corr_pipeline.store.matrix_store import (
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    StoredArray,
)

__all__ = [
    "CORRELATION_PARTS",
    "ChangesResults",
    "compute_and_publish",
    "compute_changes",
    "previous_session",
    "publication",
    "sessions_between",
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
    ``params``: the parameters used (recorded with the publication); ``sessions_between``: the
    calendar's sessions strictly between ``previous_date`` and ``snapshot_date`` (0: consecutive
    sessions, overnight changes; None: the calendar cannot cover that range).
    """

    snapshot_date: dt.date
    previous_date: dt.date
    sessions_between: int | None
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
    return published_before(engine, day)


def _open_matrices(
    store: MatrixStore, rows: PublishedHead, stack: contextlib.ExitStack
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


def _correlation(
    store: MatrixStore,
    today: PublishedHead,
    before: PublishedHead,
    match: SymbolMatch,
    *,
    top_m: int,
    quantiles: tuple[float, ...],
    working_memory_mb: float,
    say: Callable[[str], None],
) -> tuple[CorrelationChanges | None, dict[str, str]]:
    """Drift and top moves (SPEC §10.1, 10.2) over the matrices the two heads pin (``match``:
    their symbols matched), with today's ``min_overlap``; or None and ``{part: reason}`` when
    they cannot be read."""
    say(
        f"changes {today.snapshot_date} vs {before.snapshot_date}: {len(match.common)} common "
        f"symbols, {match.entered.size} entered, {match.left.size} left"
    )
    with contextlib.ExitStack() as stack:
        opened_today = _open_matrices(store, today, stack)
        opened_before = _open_matrices(store, before, stack)
        reason = next((o for o in (opened_before, opened_today) if isinstance(o, str)), None)
        if reason is not None:
            say(f"skipped {', '.join(CORRELATION_PARTS)}: {reason}")
            return None, dict.fromkeys(CORRELATION_PARTS, reason)
        assert not isinstance(opened_today, str) and not isinstance(opened_before, str)
        return (
            correlation_changes(
                opened_today[0].array,
                opened_today[1].array,
                opened_before[0].array,
                opened_before[1].array,
                match.today_index,
                match.previous_index,
                min_overlap=int(today.params.get("min_overlap", 2)),
                top_m=top_m,
                quantiles=quantiles,
                working_memory_mb=working_memory_mb,
            ),
            {},
        )


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
    calendar: SessionCalendar | None = None,
    log: Callable[[str], None] | None = None,
) -> ChangesResults | None:
    """The changes of the published snapshot of ``day`` against ``previous`` (default: its
    :func:`previous_session`); None when there is no previous session.

    ``top_m``: pairs kept by |Δcorr| (SPEC §10.2); ``min_members``: the split/merge threshold
    (SPEC §10.4); ``min_overlap`` is today's snapshot parameter; ``calendar``: the sessions
    that count the gap between the two dates (:func:`sessions_between`; default
    :func:`corr_pipeline.sessions.configured_calendar`, the partitions' calendar). Raises
    ``LookupError`` when ``day`` itself is not published.
    """
    say = log or (lambda _message: None)
    if previous is None:
        previous = previous_session(engine, day)
    days = [day, previous] if previous is not None else [day]
    with ThreadPoolExecutor(2) as pool:
        head_today, *others = pool.map(partial(published_head, engine), days)
        if head_today is None:
            raise LookupError(f"the snapshot of {day} is not published")
        if previous is None:
            return None
        head_before = others[0]
        if head_before is None:
            raise LookupError(f"the snapshot of {previous} is not published")
        match = match_symbols(head_today.symbols, head_before.symbols)
        # the rest of both days' rows (neighbors, clusters, lead-lag pairs) is read on two
        # connections, and the parts that need only them computed, while the matrices the heads
        # pin are scanned (GIL-free numba kernels on the worker threads)
        reads = [pool.submit(published_rows, engine, d) for d in days]

        parts = pool.submit(
            _from_rows,
            reads,
            (day, previous),
            (head_today, head_before),
            match,
            working_memory_mb,
            min_members,
        )
        scan = partial(
            _correlation,
            store,
            top_m=top_m,
            quantiles=quantiles,
            working_memory_mb=working_memory_mb,
            say=say,
        )
        correlation, skipped = scan(head_today, head_before, match)
        today, before, match, (n_neighbors, new_neighbors), clusters, lead_lag = parts.result()
    if (today.head, before.head) != (head_today, head_before):
        # a date published again between the two reads: scan the matrices of the rows read
        say("a date was published again during the scan: scanning its new matrices")
        correlation, skipped = scan(today.head, before.head, match)
    return ChangesResults(
        snapshot_date=day,
        previous_date=previous,
        sessions_between=sessions_between(calendar or configured_calendar(), previous, day, say),
        today=today,
        previous=before,
        match=match,
        correlation=correlation,
        n_neighbors=n_neighbors,
        new_neighbors=new_neighbors,
        clusters=clusters,
        lead_lag=lead_lag,
        skipped=skipped,
        params={
            "top_m": int(top_m),
            "min_members": int(min_members),
            "min_overlap": int(today.params.get("min_overlap", 2)),
            "quantiles": list(quantiles),
        },
    )


def sessions_between(
    calendar: SessionCalendar, previous: dt.date, day: dt.date, say: Callable[[str], None]
) -> int | None:
    """The sessions of ``calendar`` strictly between ``previous`` and ``day``
    (:meth:`corr_pipeline.sessions.SessionCalendar.sessions_between`: outside the calendar's
    range, counted with the same calendar built for that range); None, said through ``say``,
    when the calendar cannot cover it (the changes are still recorded, their gap unknown)."""
    try:
        between = calendar.sessions_between(previous, day)
    except ValueError as exc:
        say(f"the sessions between {previous} and {day} cannot be counted: {exc}")
        return None
    if between:
        say(
            f"the previous published session of {day} is {previous}: {between:,} sessions "
            "between the two were not published, these are NOT overnight changes"
        )
    return between


def _from_rows(
    reads: list[Future],
    days: tuple[dt.date, dt.date],
    heads: tuple[PublishedHead, PublishedHead],
    match: SymbolMatch,
    working_memory_mb: float,
    min_members: int,
) -> tuple[
    PublishedRows,
    PublishedRows,
    SymbolMatch,
    tuple[np.ndarray, np.ndarray],
    ClusterMigrations,
    LeadLagChanges,
]:
    """Both days' rows (``reads``: their pending reads), their symbols matched (``match`` when
    the rows hold the ``heads``' symbols), neighbor turnover, cluster migrations and lead-lag
    changes (SPEC §10.3–10.5)."""
    today, before = (read.result() for read in reads)
    for rows, d in ((today, days[0]), (before, days[1])):
        if rows is None:
            raise LookupError(f"the snapshot of {d} is not published")
    assert today is not None and before is not None
    same = (today.symbols, before.symbols) == (heads[0].symbols, heads[1].symbols)
    matched = match if same else match_symbols(today.symbols, before.symbols)
    return (
        today,
        before,
        matched,
        neighbor_turnover(
            matched,
            today.neighbor_index,
            before.neighbor_index,
            working_memory_mb=working_memory_mb,
        ),
        cluster_migrations(
            today.cluster_labels, before.cluster_labels, matched, min_members=min_members
        ),
        lead_lag_changes(today.lead_lag_pairs, before.lead_lag_pairs, matched, len(today.symbols)),
    )


def _number(value: float) -> float | None:
    """A finite float, or None (NULL) for NaN."""
    return float(value) if np.isfinite(value) else None


def publication(results: ChangesResults) -> ChangesPublication:
    """The rows :func:`corr_pipeline.db.publish_changes.publish_changes` writes for ``results``
    (SPEC §10): NaN (no compared pair, a skipped part) becomes NULL."""
    return ChangesPublication(
        snapshot_date=results.snapshot_date,
        summary=_summary_row(results),
        rows={
            "change_pairs": _pair_rows(results),
            "change_symbols": _symbol_rows(results),
            "change_clusters": _cluster_rows(results),
            "change_lead_lag": _lead_lag_rows(results),
        },
    )


def _summary_row(results: ChangesResults) -> dict[str, Any]:
    """The ``change_summaries`` row (SPEC §10.1): counts, means, quantiles, the Δ histogram."""
    today, before, match, corr = results.today, results.previous, results.match, results.correlation
    means = corr.means if corr is not None else {}
    return {
        "previous_date": results.previous_date,
        "sessions_between": results.sessions_between,
        "n_symbols": len(today.symbols),
        "n_previous_symbols": len(before.symbols),
        "n_common": len(match.common),
        "n_entered": int(match.entered.size),
        "n_left": int(match.left.size),
        "n_pairs": None if corr is None else int(corr.n_pairs),
        "mean_corr": _number(means.get("corr_today", np.nan)),
        "previous_mean_corr": _number(means.get("corr_previous", np.nan)),
        "mean_abs_corr": _number(means.get("abs_corr_today", np.nan)),
        "previous_mean_abs_corr": _number(means.get("abs_corr_previous", np.nan)),
        "mean_change": _number(means.get("change", np.nan)),
        "mean_abs_change": _number(means.get("abs_change", np.nan)),
        "quantiles": None
        if corr is None or corr.n_pairs == 0
        else {
            "levels": list(corr.quantile_levels),
            **{name: [float(v) for v in values] for name, values in corr.quantiles.items()},
        },
        "change_histogram": None
        if corr is None
        else {
            "edges": [float(corr.change_edges[0]), float(corr.change_edges[-1])],
            "counts": [int(c) for c in corr.change_counts],
        },
        "skipped": dict(results.skipped),
        "params": dict(results.params),
        # which publications were compared: stale when either date is re-published (SPEC §10.7)
        "snapshot_published_at": results.today.published_at,
        "previous_published_at": results.previous.published_at,
    }


def _pair_rows(results: ChangesResults) -> list[tuple[Any, ...]]:
    """``change_pairs`` (SPEC §10.2): the top pairs by ``|Δcorr|``, ranked from 1."""
    corr, common = results.correlation, results.match.common
    if corr is None:
        return []
    return [
        (
            rank + 1,
            common[p],
            common[q],
            float(corr.top_corr_today[rank]),
            float(corr.top_corr_previous[rank]),
            int(corr.top_overlap_today[rank]),
            int(corr.top_overlap_previous[rank]),
            float(corr.top_change[rank]),
        )
        for rank, (p, q) in enumerate(zip(corr.top_p, corr.top_q, strict=True))
    ]


def _symbol_rows(results: ChangesResults) -> list[tuple[Any, ...]]:
    """``change_symbols`` (SPEC §10.3, 10.4): kept symbols with their clusters and neighbor
    turnover, then the entered and the left ones."""
    today, before, match = results.today, results.previous, results.match
    moved = results.clusters.moved
    symbols: list[tuple[Any, ...]] = [
        (
            name,
            "kept",
            int(today.cluster_labels[match.today_index[p]]),
            int(before.cluster_labels[match.previous_index[p]]),
            bool(moved[p]),
            int(results.n_neighbors[p]),
            int(results.new_neighbors[p]),
        )
        for p, name in enumerate(match.common)
    ]
    symbols += [
        (today.symbols[i], "entered", int(today.cluster_labels[i]), None, None, None, None)
        for i in match.entered
    ]
    symbols += [
        (before.symbols[i], "left", None, int(before.cluster_labels[i]), None, None, None)
        for i in match.left
    ]
    return symbols


def _cluster_rows(results: ChangesResults) -> list[tuple[Any, ...]]:
    """``change_clusters`` (SPEC §10.4): today's clusters matched or appeared, then the
    vanished previous ones, numbered in that order."""
    migrations = results.clusters
    clusters: list[tuple[Any, ...]] = []
    for a, b in enumerate(migrations.match_today):
        matched = b >= 0
        clusters.append(
            (
                len(clusters),
                a,
                int(b) if matched else None,
                int(migrations.size_today[a]),
                int(migrations.size_previous[b]) if matched else 0,
                int(migrations.shared[a]),
                "matched" if matched else "appeared",
                bool(migrations.split[b]) if matched else False,
                bool(migrations.merged[a]),
            )
        )
    for b in np.flatnonzero(migrations.match_previous < 0):
        clusters.append(
            (
                len(clusters),
                None,
                int(b),
                0,
                int(migrations.size_previous[b]),
                0,
                "vanished",
                bool(migrations.split[b]),
                False,
            )
        )
    return clusters


def _lead_lag_rows(results: ChangesResults) -> list[tuple[Any, ...]]:
    """``change_lead_lag`` (SPEC §10.5): pairs that appeared, vanished or changed lag."""
    today, before = results.today, results.previous
    ll, pt, pp = results.lead_lag, today.lead_lag_pairs, before.lead_lag_pairs

    def names(day: Any, pairs: Any, r: int) -> tuple[str, str]:
        return day.symbols[pairs["leader"][r]], day.symbols[pairs["lagger"][r]]

    rows: list[tuple[Any, ...]] = [
        (
            *names(today, pt, r),
            "appeared",
            int(pt["lag"][r]),
            None,
            float(pt["improvement"][r]),
            None,
        )
        for r in ll.appeared
    ]
    rows += [
        (
            *names(before, pp, r),
            "vanished",
            None,
            int(pp["lag"][r]),
            None,
            float(pp["improvement"][r]),
        )
        for r in ll.vanished
    ]
    rows += [
        (
            *names(today, pt, r),
            "lag_changed",
            int(pt["lag"][r]),
            int(pp["lag"][s]),
            float(pt["improvement"][r]),
            float(pp["improvement"][s]),
        )
        for r, s in zip(ll.changed_today, ll.changed_previous, strict=True)
    ]
    return rows


#: Computations of one date's changes before giving up when each is stale at publication.
PUBLISH_ATTEMPTS = 3


def compute_and_publish(
    engine: sa.Engine,
    store: MatrixStore,
    day: dt.date,
    *,
    log: Callable[[str], None] | None = None,
    attempts: int = PUBLISH_ATTEMPTS,
    **options: Any,
) -> tuple[ChangesResults, ChangesPublication, ChangesReport] | None:
    """:func:`compute_changes` of ``day`` (``options`` are its keywords) published with
    :func:`corr_pipeline.db.publish_changes.publish_changes`; None when there is no previous
    session. A change set that became stale while it was computed (a run of a parallel backfill
    published the previous session meanwhile: :class:`StaleChangesError`) is computed again
    against the sessions published now, up to ``attempts`` times, then the error is raised."""
    say = log or (lambda _message: None)
    for attempt in range(1, attempts + 1):
        results = compute_changes(engine, store, day, log=log, **options)
        if results is None:
            return None
        rows = publication(results)
        try:
            return results, rows, publish_changes(engine, rows)
        except StaleChangesError as exc:
            if attempt == attempts:
                raise
            say(f"{exc}: computing them again (attempt {attempt + 1} of {attempts})")
    raise AssertionError("unreachable")  # pragma: no cover
