"""Cluster migrations between two sessions (SPEC §10.4)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from corr_pipeline.compute.changes.matching import SymbolMatch
from corr_pipeline.compute.validation import check_array, check_positive_int


@dataclass(frozen=True)
class ClusterMigrations:
    """Result of :func:`cluster_migrations` (SPEC §10.4); cluster ids are each day's labels.

    match_today : int64 (K_today,), the previous cluster matched to each today cluster, −1 if
        none (the cluster *appeared*).
    match_previous : int64 (K_previous,), the inverse; −1: the previous cluster *vanished*.
    shared : int64 (K_today,), common members of each today cluster and its match (0 if none).
    size_today, size_previous : int64, members of each cluster (all symbols of that day).
    moved : bool (len(common),), common symbol ``p`` whose today cluster is not the match of its
        previous cluster.
    split : bool (K_previous,), previous clusters that split; merged : bool (K_today,), today
        clusters that merged several previous ones.
    main_source : int64 (K_today,), the previous cluster that gave a today cluster most of its
        common members (ties to the smaller id; −1 when it has none); main_destination : int64
        (K_previous,), the inverse.
    """

    match_today: np.ndarray
    match_previous: np.ndarray
    shared: np.ndarray
    size_today: np.ndarray
    size_previous: np.ndarray
    moved: np.ndarray
    split: np.ndarray
    merged: np.ndarray
    main_source: np.ndarray
    main_destination: np.ndarray


def _argmax_ties_smaller(rows: np.ndarray, cols: np.ndarray, weight: np.ndarray, n_rows: int):
    """Per row: the column with the largest weight, ties to the smaller column; −1 if none."""
    out = np.full(n_rows, -1, np.int64)
    if rows.size:
        order = np.lexsort((cols, -weight, rows))
        first = np.ones(order.size, bool)
        first[1:] = rows[order][1:] != rows[order][:-1]
        out[rows[order][first]] = cols[order][first]
    return out


def cluster_migrations(
    labels_today: np.ndarray,
    labels_previous: np.ndarray,
    match: SymbolMatch,
    *,
    min_members: int = 2,
) -> ClusterMigrations:
    """Today's clusters matched to the previous ones (SPEC §10.4).

    ``O[a, b]`` = number of common symbols in today's cluster ``a`` and previous cluster ``b``.
    The matching is a set of one-to-one pairs ``(a, b)`` with ``O[a, b] > 0`` of maximum total
    ``O`` (``linear_sum_assignment`` on each connected component of the graph of the ``O > 0``
    pairs, which is the same optimum as on the whole table); pairs with zero overlap are not
    matches. ``moved``: common symbols whose today cluster is not the match of their previous
    cluster. ``main_source[a] = argmax_b O[a, b]``, ``main_destination[b] = argmax_a O[a, b]``
    (ties to the smaller id). Previous cluster ``b`` *split* iff at least two today clusters
    ``a`` have ``main_source[a] == b`` and ``O[a, b] >= min_members``; today cluster ``a``
    *merged* iff at least two previous clusters ``b`` have ``main_destination[b] == a`` and
    ``O[a, b] >= min_members``.
    """
    lt_all = check_array(np.asarray(labels_today), "labels_today", np.integer, ndim=1)
    lp_all = check_array(np.asarray(labels_previous), "labels_previous", np.integer, ndim=1)
    check_positive_int(min_members, "min_members")
    for name, labels in (("labels_today", lt_all), ("labels_previous", lp_all)):
        if labels.size and labels.min() < 0:
            raise ValueError(f"{name} must be >= 0")
    k_t = int(lt_all.max()) + 1 if lt_all.size else 0
    k_p = int(lp_all.max()) + 1 if lp_all.size else 0
    lt = lt_all[match.today_index].astype(np.int64)
    lp = lp_all[match.previous_index].astype(np.int64)
    table = coo_matrix((np.ones(lt.size, np.int64), (lt, lp)), shape=(k_t, k_p)).tocsr()
    table.sum_duplicates()
    edges = table.tocoo()
    ea, eb, ew = edges.row.astype(np.int64), edges.col.astype(np.int64), edges.data.astype(np.int64)

    match_today = np.full(k_t, -1, np.int64)
    match_previous = np.full(k_p, -1, np.int64)
    shared = np.zeros(k_t, np.int64)
    graph = coo_matrix((np.ones(ea.size), (ea, k_t + eb)), shape=(k_t + k_p, k_t + k_p))
    _, component = connected_components(graph, directed=False)
    edge_component = component[ea]
    order = np.argsort(edge_component, kind="stable")
    bounds = np.flatnonzero(np.diff(edge_component[order])) + 1
    for group in np.split(order, bounds) if order.size else []:
        rows, row_pos = np.unique(ea[group], return_inverse=True)
        cols, col_pos = np.unique(eb[group], return_inverse=True)
        dense = np.zeros((rows.size, cols.size), np.int64)
        dense[row_pos, col_pos] = ew[group]
        r, c = linear_sum_assignment(dense, maximize=True)
        keep = dense[r, c] > 0
        a, b = rows[r[keep]], cols[c[keep]]
        match_today[a] = b
        match_previous[b] = a
        shared[a] = dense[r[keep], c[keep]]

    main_source = _argmax_ties_smaller(ea, eb, ew, k_t)
    main_destination = _argmax_ties_smaller(eb, ea, ew, k_p)
    big = ew >= min_members
    split_count = np.bincount(eb[big & (main_source[ea] == eb)], minlength=k_p)
    merge_count = np.bincount(ea[big & (main_destination[eb] == ea)], minlength=k_t)
    return ClusterMigrations(
        match_today=match_today,
        match_previous=match_previous,
        shared=shared,
        size_today=np.bincount(lt_all, minlength=k_t).astype(np.int64),
        size_previous=np.bincount(lp_all, minlength=k_p).astype(np.int64),
        moved=match_today[lt] != lp,
        split=split_count >= 2,
        merged=merge_count >= 2,
        main_source=main_source,
        main_destination=main_destination,
    )
