"""Lead-lag pairs that appeared, vanished or changed lag between two sessions (SPEC §10.5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute.changes.matching import SymbolMatch


@dataclass(frozen=True)
class LeadLagChanges:
    """Result of :func:`lead_lag_changes` (SPEC §10.5): row indices into each day's pairs.

    appeared : today's pairs with no previous pair of the same (leader, lagger) names.
    vanished : previous pairs with no today pair of the same names.
    changed_today, changed_previous : the pairs present on both days with a different lag
        (aligned: ``changed_today[i]`` and ``changed_previous[i]`` are the same names).
    Only pairs whose two symbols are in both universes are compared (a pair of a symbol that
    entered or left is reported with the symbol). All sorted by row index.
    """

    appeared: np.ndarray
    vanished: np.ndarray
    changed_today: np.ndarray
    changed_previous: np.ndarray


def lead_lag_changes(
    pairs_today: np.ndarray, pairs_previous: np.ndarray, match: SymbolMatch, n_today: int
) -> LeadLagChanges:
    """Compare two days' lead-lag pairs (structured arrays with ``leader``, ``lagger``, ``lag``,
    indices into each day's symbols, SPEC §6) by the names of leader and lagger."""
    common_today = np.zeros(n_today, bool)
    common_today[match.today_index] = True

    def keys(leader: np.ndarray, lagger: np.ndarray) -> np.ndarray:
        return leader.astype(np.int64) * n_today + lagger.astype(np.int64)

    t_lead, t_lag = np.asarray(pairs_today["leader"]), np.asarray(pairs_today["lagger"])
    p_lead = match.previous_to_today[np.asarray(pairs_previous["leader"], dtype=np.int64)]
    p_lag = match.previous_to_today[np.asarray(pairs_previous["lagger"], dtype=np.int64)]
    t_rows = np.flatnonzero(common_today[t_lead] & common_today[t_lag])
    p_rows = np.flatnonzero((p_lead >= 0) & (p_lag >= 0))
    t_keys = keys(t_lead[t_rows], t_lag[t_rows])
    p_keys = keys(p_lead[p_rows], p_lag[p_rows])
    _, in_t, in_p = np.intersect1d(t_keys, p_keys, assume_unique=True, return_indices=True)
    both_t, both_p = t_rows[in_t], p_rows[in_p]
    lag_differs = (
        np.asarray(pairs_today["lag"])[both_t] != np.asarray(pairs_previous["lag"])[both_p]
    )
    order = np.argsort(both_t[lag_differs], kind="stable")
    # the rows not on both days, in row order (a mask: O(pairs), no sorting)
    only_t = np.ones(len(t_lead), bool)
    only_t[both_t] = False
    only_p = np.ones(len(p_lead), bool)
    only_p[both_p] = False
    return LeadLagChanges(
        appeared=t_rows[only_t[t_rows]],
        vanished=p_rows[only_p[p_rows]],
        changed_today=both_t[lag_differs][order],
        changed_previous=both_p[lag_differs][order],
    )
