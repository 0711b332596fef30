"""Published snapshots with matrices in a store, for the tests of the changes (SPEC §10):
each day's own symbols, correlation from a random ragged universe, SPEC-shaped results."""

from __future__ import annotations

import datetime as dt

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute import pairwise_correlation, top_k_neighbors
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore

MIN_OVERLAP = 20


def symbols_of(rng: np.random.Generator, n: int, pool: int) -> list[str]:
    return sorted(f"S{i:03d}" for i in rng.choice(pool, n, replace=False))


def publish_day(
    engine: sa.Engine,
    store: MatrixStore | None,
    day: dt.date,
    symbols: list[str],
    seed: int,
    *,
    labels: np.ndarray | None = None,
    pairs: list[tuple[str, str, int]] = (),  # type: ignore[assignment]
    k: int = 4,
) -> dict[str, np.ndarray]:
    """Store (when ``store``) and publish a snapshot of ``day`` over ``symbols``; returns its
    corr, overlap, neighbor index and labels."""
    rng = np.random.default_rng(seed)
    n = len(symbols)
    R = (rng.standard_normal((50, n)) + rng.standard_normal((50, 1))).astype(np.float32)
    R[rng.random(R.shape) < 0.1] = np.nan
    found = pairwise_correlation(R, min_overlap=MIN_OVERLAP)
    neighbors = top_k_neighbors(found.corr, k=k, overlap=found.overlap)
    if labels is None:
        labels = (np.arange(n) % 3).astype(np.int32)
    position = {s: i for i, s in enumerate(symbols)}
    ll = np.zeros(len(pairs), LEAD_LAG_DTYPE)
    for i, (a, b, lag) in enumerate(pairs):
        ll[i] = (position[a], position[b], lag, 0.5, 0.1, 0.4, 40, 1e-6, 1e-4, 0, np.nan, np.nan)
    versions = None
    if store is not None:
        key = day.isoformat()
        corr = store.save_bundle(
            "correlation_matrix",
            key,
            MatrixBundle({"corr": found.corr}, labels={"symbols": symbols}),
        ).bundle
        overlap = store.save_bundle(
            "overlap_matrix",
            key,
            MatrixBundle({"overlap": found.overlap}, labels={"symbols": symbols}),
        ).bundle
        versions = {"correlation_matrix": corr.versions, "overlap_matrix": overlap.versions}
    publish_snapshot(
        engine,
        SnapshotResults(
            snapshot_date=day,
            as_of_trade_date=day,
            symbols=symbols,
            n_dropped=0,
            lookback_days=50,
            params={"min_overlap": MIN_OVERLAP, "k_neighbors": k},
            neighbor_index=neighbors.index,
            neighbor_corr=neighbors.corr,
            neighbor_overlap=neighbors.overlap,
            cluster_labels=np.asarray(labels, np.int32),
            lead_lag_pairs=ll,
            matrix_versions=versions,
        ),
    )
    return {
        "corr": found.corr,
        "overlap": found.overlap,
        "index": neighbors.index,
        "labels": np.asarray(labels),
    }
