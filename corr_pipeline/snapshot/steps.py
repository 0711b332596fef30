"""The steps of one snapshot, written once: the Dagster assets and the benchmark call these.

::

    prices ─► load_returns ─┬─► correlation (corr + overlap) ─┬─► neighbors ─┐
                            │                                 ├─► clusters ──┼─► results_for_publication
                            └────────(with the sync corr)─────┴─► lead_lag ──┘

Each step maps the :class:`~corr_pipeline.snapshot.params.SnapshotParameters` onto one function
of :mod:`corr_pipeline.compute` (or the window query of :mod:`corr_pipeline.db.window`) and
returns its arrays; where the result goes (matrix store, memory, database) is the caller's
choice. Memory at N = 24,000 (T = 252, int16 overlap) per step:

- load_returns: the COPY buffer (~180 MB) and the close/returns pivots (~120 MB), then R 24 MB.
- correlation: R standardised plus one block of tiles (``working_memory_mb``); the outputs
  (2.3 GB float32 + 1.15 GB int16) are the caller's arrays, memory-mapped in the store.
- neighbors: row blocks of corr (``working_memory_mb``) + the N x k results (~2 MB).
- clusters: the condensed float64 distances N(N-1)/2 (2.3 GB, anonymous) + the linkage.
- lead_lag: R standardised, one block per lag (``working_memory_mb``), the running per-symbol
  top-k (N x k), corr read as a map.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute import (
    find_lead_lag_pairs,
    hierarchical_clusters,
    pairwise_correlation,
    top_k_neighbors,
)
from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource
from corr_pipeline.db.publish import SnapshotResults
from corr_pipeline.db.window import ReturnsWindow, load_returns_window
from corr_pipeline.snapshot.params import SnapshotParameters

Progress = Callable[[int, int], None]


def load_returns(
    engine: sa.Engine,
    day: dt.date,
    params: SnapshotParameters,
    *,
    source: PriceSource = NATIVE_PRICES,
) -> ReturnsWindow:
    """The returns matrix of the window ending at ``day`` (SPEC §2), read from ``source``
    (default the project's ``prices`` table; checked against the catalog first)."""
    return load_returns_window(
        engine,
        day,
        lookback_days=params.lookback_days,
        min_history_days=params.min_history_days,
        source=source,
    )


def correlation(
    R: np.ndarray,
    params: SnapshotParameters,
    *,
    out_corr: np.ndarray,
    out_overlap: np.ndarray,
    progress: Progress | None = None,
) -> None:
    """Pairwise-complete correlation and overlap of the columns of ``R`` (SPEC §3), written
    into ``out_corr`` (N x N float32) and ``out_overlap`` (N x N,
    :func:`~corr_pipeline.compute.tiling.overlap_dtype` of T)."""
    pairwise_correlation(
        R,
        min_overlap=params.min_overlap,
        working_memory_mb=params.working_memory_mb,
        out_corr=out_corr,
        out_overlap=out_overlap,
        progress=progress,
    )


def neighbors(
    corr: np.ndarray, overlap: np.ndarray | None, params: SnapshotParameters
) -> Neighbors:
    """The ``k_neighbors`` strongest |corr| neighbors of every symbol (SPEC §4)."""
    return top_k_neighbors(
        corr, k=params.k_neighbors, overlap=overlap, working_memory_mb=params.working_memory_mb
    )


def clusters(corr: np.ndarray, params: SnapshotParameters) -> np.ndarray:
    """Cluster labels, int32 ``0..K-1`` by first appearance (SPEC §5)."""
    return hierarchical_clusters(
        corr,
        method=params.linkage_method,
        distance_threshold=params.distance_threshold,
        n_clusters=params.n_clusters,
        working_memory_mb=params.working_memory_mb,
    )


def lead_lag(
    R: np.ndarray,
    corr: np.ndarray,
    params: SnapshotParameters,
    *,
    progress: Progress | None = None,
) -> np.ndarray:
    """The lead-lag pairs of SPEC §6 (structured array, leader/lagger as column indices)."""
    return find_lead_lag_pairs(
        R,
        max_lag=params.max_lag,
        k_leaders=params.k_leaders,
        k_laggers=params.k_laggers,
        min_overlap=params.min_overlap,
        min_improvement=params.min_improvement,
        corr=corr,
        working_memory_mb=params.working_memory_mb,
        progress=progress,
    )


def results_for_publication(
    snapshot_date: dt.date,
    *,
    as_of_trade_date: dt.date | str,
    symbols: Sequence[str],
    n_dropped: int,
    params: SnapshotParameters,
    found: Neighbors,
    labels: np.ndarray,
    pairs: np.ndarray,
    recorded: Mapping[str, Any],
) -> SnapshotResults:
    """The value :func:`corr_pipeline.db.publish.publish_snapshot` writes (SPEC §7):
    ``snapshots.params`` holds every parameter plus ``recorded`` (window facts, run id)."""
    return SnapshotResults(
        snapshot_date=snapshot_date,
        as_of_trade_date=as_of_trade_date,
        symbols=symbols,
        n_dropped=int(n_dropped),
        lookback_days=params.lookback_days,
        params={**params.as_dict(), **recorded},
        neighbor_index=np.asarray(found.index),
        neighbor_corr=np.asarray(found.corr),
        neighbor_overlap=np.asarray(found.overlap),
        cluster_labels=np.asarray(labels),
        lead_lag_pairs=np.asarray(pairs),
    )
