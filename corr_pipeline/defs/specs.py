"""The assets of the snapshot and their checks, as declared to Dagster (what the UI lists).

::

    prices ─► returns_matrix ─┬─► correlation_matrix + overlap_matrix ─┬─► top_k_neighbors ─┐
                              │                                        ├─► clusters ────────┤
                              └──────────(with the sync corr)──────────┴─► lead_lag_pairs ──┴─► snapshot_publication
                                                                                                         │
                                                                                 snapshot_changes ◄──────┘

One op computes them (:mod:`corr_pipeline.defs.assets`), session by session; each asset keeps
its own materializations, metadata and checks. The matrices are stored by the matrix store
(``matrix_io_manager`` loads them for any asset downstream); the publication and the changes
are rows in PostgreSQL.
"""

from __future__ import annotations

import warnings

import dagster as dg

from corr_pipeline.defs.step_options import MATRIX_IO_MANAGER, SNAPSHOT_GROUP

__all__ = [
    "CORRELATION_ASSETS",
    "INJECTED_PAIRS_CHECK",
    "MATRIX_ASSETS",
    "SNAPSHOT_ASSETS",
    "snapshot_check_specs",
    "snapshot_specs",
]

#: The assets in the order the op computes them for a session.
SNAPSHOT_ASSETS = (
    "returns_matrix",
    "correlation_matrix",
    "overlap_matrix",
    "top_k_neighbors",
    "clusters",
    "lead_lag_pairs",
    "snapshot_publication",
    "snapshot_changes",
)
#: The assets whose values are matrix-store bundles.
MATRIX_ASSETS = SNAPSHOT_ASSETS[:6]
#: Computed together by one kernel: selected together or not at all.
CORRELATION_ASSETS = ("correlation_matrix", "overlap_matrix")
#: The check that reads the synthetic ground truth (a warning, never blocking).
INJECTED_PAIRS_CHECK = dg.AssetCheckKey(dg.AssetKey("lead_lag_pairs"), "injected_pairs_found")

#: ``snapshot_changes`` of session ``D`` reads the publications of ``D`` and of the previous
#: session: the partitions ``[D - 1, D]`` of ``snapshot_publication`` (none before the first).
#: Which session is compared stays data-driven: the newest *published* one before ``D``
#: (SPEC §10). ``allow_nonexistent_upstream_partitions`` ("beta" in Dagster 1.13, relied on
#: deliberately: the first partition has no previous one) warns once here.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore",
        message="Parameter `allow_nonexistent_upstream_partitions`",
        category=dg.BetaWarning,
    )
    PREVIOUS_AND_THIS_PUBLICATION = dg.AssetDep(
        "snapshot_publication",
        partition_mapping=dg.TimeWindowPartitionMapping(
            start_offset=-1, end_offset=0, allow_nonexistent_upstream_partitions=True
        ),
    )

_DESCRIPTIONS = {
    "returns_matrix": "Returns matrix R (T x N float32, SPEC §2) of the window ending at the "
    "snapshot date, read from the price source (`prices` unless configured); labels: symbols, "
    "dates; dropped symbols with reasons; suspect prices (stale closes, price errors) with "
    "their zero-return share and largest |log return|.",
    "correlation_matrix": "Pairwise-complete Pearson correlation (N x N float32, exactly "
    "symmetric, SPEC §3), memory-mapped in the matrix store.",
    "overlap_matrix": "Common finite returns per pair (N x N, smallest integer type holding T, "
    "SPEC §3), memory-mapped in the matrix store.",
    "top_k_neighbors": "The k strongest |corr| neighbors of every symbol (index, signed corr, "
    "overlap; N x k, SPEC §4).",
    "clusters": "Hierarchical clusters on the Mantegna distance sqrt(2(1 - corr)) (int32 label "
    "per symbol, SPEC §5).",
    "lead_lag_pairs": "Lead-lag pairs (SPEC §6): exact best-lag scan over lags 1..max_lag, "
    "per-symbol top leaders/laggers by improvement over the synchronous correlation.",
    "snapshot_publication": "Publishes neighbors, clusters and lead-lag pairs of the partition "
    "to PostgreSQL (snapshots, peer_neighbors, symbol_clusters, lead_lag_pairs) in ONE "
    "transaction, replacing any earlier version of the same snapshot date (SPEC §7), with the "
    "matrix-store versions they were computed from (snapshots.matrix_versions, SPEC §8); then "
    "applies the store's retention (matrix_store.keep_matrices).",
    "snapshot_changes": "What changed since the previous published session (SPEC §10): "
    "market-level drift, the largest correlation moves, neighbor turnover, cluster migrations, "
    "lead-lag changes, symbols entered and left; published in one transaction (change_* "
    "tables), replacing an earlier version of the date. Records nothing when no earlier "
    "session is published, or the date itself is not (yet) published.",
}
_DEPS: dict[str, list] = {
    "returns_matrix": [],
    "correlation_matrix": ["returns_matrix"],
    "overlap_matrix": ["returns_matrix"],
    "top_k_neighbors": ["correlation_matrix", "overlap_matrix"],
    "clusters": ["correlation_matrix"],
    "lead_lag_pairs": ["returns_matrix", "correlation_matrix"],
    "snapshot_publication": ["returns_matrix", "top_k_neighbors", "clusters", "lead_lag_pairs"],
    "snapshot_changes": [PREVIOUS_AND_THIS_PUBLICATION],
}
_KINDS = {
    "returns_matrix": {"postgres", "numpy"},
    "correlation_matrix": {"numpy"},
    "overlap_matrix": {"numpy"},
    "top_k_neighbors": {"numpy"},
    "clusters": {"numpy", "scipy"},
    "lead_lag_pairs": {"numpy", "numba"},
    "snapshot_publication": {"postgres"},
    "snapshot_changes": {"postgres", "numpy"},
}


def snapshot_specs() -> list[dg.AssetSpec]:
    """The eight assets; each may be skipped (the op reports a session's assets as it
    finishes them, and only the sessions that succeed)."""
    specs = []
    for name in SNAPSHOT_ASSETS:
        spec = dg.AssetSpec(
            name,
            deps=_DEPS[name],
            group_name=SNAPSHOT_GROUP,
            kinds=_KINDS[name],
            description=_DESCRIPTIONS[name],
            skippable=True,
        )
        if name in MATRIX_ASSETS:
            spec = spec.with_io_manager_key(MATRIX_IO_MANAGER)
        specs.append(spec)
    return specs


#: ``(asset, check, blocking, description)`` of every check the op evaluates.
_CHECKS = (
    (
        "returns_matrix",
        "returns_contract",
        True,
        "SPEC §2: float32 T x N, no infinities, symbols ascending, every kept symbol with >= "
        "min_history_days finite returns and non-zero variance.",
    ),
    (
        "correlation_matrix",
        "corr_exactly_symmetric",
        True,
        "corr == corr.T bit for bit (and overlap == overlap.T), compared tile by tile from the "
        "memory maps.",
    ),
    (
        "correlation_matrix",
        "corr_unit_diagonal",
        True,
        "corr[i, i] == 1 for every kept symbol and overlap[i, i] equals its number of finite "
        "returns.",
    ),
    (
        "correlation_matrix",
        "corr_in_range",
        True,
        "finite values in [-1, 1]; NaN wherever overlap < min_overlap.",
    ),
    (
        "top_k_neighbors",
        "neighbors_rows_filled",
        True,
        "SPEC §4 against corr: every row filled with min(k, defined correlations) neighbors, "
        "values equal corr[i, j], ordered by |corr|, none stronger left out.",
    ),
    (
        "clusters",
        "every_symbol_labelled",
        True,
        "SPEC §5: one int32 label per symbol, 0..K-1 all used, numbered by first appearance; "
        "reports K and the largest cluster sizes.",
    ),
    (
        "lead_lag_pairs",
        "lead_lag_contract",
        True,
        "SPEC §6: lags in 1..max_lag, distinct in-range symbols, each ordered pair once, overlap "
        ">= min_overlap, improvement > min_improvement and consistent, SPEC order.",
    ),
    (
        "lead_lag_pairs",
        "injected_pairs_found",
        False,
        "Synthetic data only: every injected (leader, lagger, lag) of synthetic.lead_lag_truth "
        "whose symbols were kept is found with its lag (warns otherwise). Not evaluated when "
        "there is no synthetic ground truth (production data).",
    ),
    (
        "snapshot_publication",
        "published_rows_match",
        False,
        "Rows read back for the snapshot date equal what was published: one snapshots row, N x "
        "filled neighbors, N clusters, every pair (no duplicates, nothing missing).",
    ),
)


def snapshot_check_specs() -> list[dg.AssetCheckSpec]:
    """The checks the op evaluates, each per session (a failed blocking one stops its session
    before anything downstream of the checked asset)."""
    return [
        dg.AssetCheckSpec(name, asset=asset, blocking=blocking, description=text)
        for asset, name, blocking, text in _CHECKS
    ]


def is_blocking(check_name: str) -> bool:
    """Whether the check of that name stops its session when it fails."""
    return next(blocking for _, name, blocking, _ in _CHECKS if name == check_name)
