"""Verifications of each step's contract: each one re-derives a SPEC property from the stored
arrays, blockwise, so it works on memory-mapped N x N matrices without N x N temporaries.

Every function returns a :class:`Verdict` (passed, plain numeric/text facts, problems in words);
the Dagster layer turns a verdict into an asset check result. Memory per function is stated in
its docstring (``b`` = tile/block size derived from ``working_memory_mb``, see
:mod:`corr_pipeline.compute.tiling`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corr_pipeline.compute.matrix_facts import row_counts_above, upper_triangle_facts
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, row_blocks
from corr_pipeline.snapshot import display
from corr_pipeline.snapshot.params import LeadLagParameters
from corr_pipeline.snapshot.results import SnapshotResults


@dataclass
class Verdict:
    """Outcome of one verification: ``passed``, facts for the UI, and problems in words."""

    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.passed = False
        self.problems.append(problem)


# --------------------------------------------------------------------------------------------
# Returns (SPEC §2)
# --------------------------------------------------------------------------------------------


def verify_returns(
    R: np.ndarray,
    symbols: Sequence[str],
    *,
    min_history_days: int,
    lookback_days: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> Verdict:
    """SPEC §2 on the stored returns matrix.

    ``R`` is float32 ``T x N`` with ``min_history_days <= T <= lookback_days``; no infinities
    (bad prices became NaN); one column per symbol, symbols strictly ascending in code-point
    order; every kept column has ``>= min_history_days`` finite returns and non-zero variance.
    Memory: one column block of ``T x b`` in float64.
    """
    verdict = Verdict(passed=True)
    if R.ndim != 2:
        verdict.fail(f"returns matrix must be 2-D, got shape {R.shape}")
        return verdict
    n_rows, n_cols = R.shape
    verdict.metadata.update({"n_returns": int(n_rows), "n_symbols": int(n_cols)})
    if R.dtype != np.float32:
        verdict.fail(f"returns matrix dtype is {R.dtype}, expected float32")
    if len(symbols) != n_cols:
        verdict.fail(f"{len(symbols)} symbols for {n_cols} columns")
    elif any(a >= b for a, b in zip(symbols, symbols[1:], strict=False)):
        verdict.fail("symbols are not strictly ascending (code-point order)")
    if n_rows < min_history_days:
        verdict.fail(f"window has {n_rows} returns < min_history_days ({min_history_days})")
    if n_rows > lookback_days:
        verdict.fail(f"window has {n_rows} returns > lookback_days ({lookback_days})")
    if n_cols < 2:
        verdict.fail(f"only {n_cols} symbol(s) kept: nothing to correlate")

    n_infinite = 0
    short_columns: list[int] = []
    flat_columns: list[int] = []
    finite_total = 0
    for start, stop in row_blocks(n_cols, n_rows * 8 * 3, working_memory_mb):
        block = np.asarray(R[:, start:stop], dtype=np.float64)
        finite = np.isfinite(block)
        n_infinite += int(np.isinf(block).sum())
        counts = finite.sum(axis=0)
        finite_total += int(counts.sum())
        short_columns.extend((start + np.flatnonzero(counts < min_history_days)).tolist())
        filled = np.where(finite, block, 0.0)
        safe = np.maximum(counts, 1)
        mean = filled.sum(axis=0) / safe
        spread = np.where(finite, block - mean, 0.0)
        var = (spread * spread).sum(axis=0)
        flat_columns.extend((start + np.flatnonzero(var <= 0.0)).tolist())
    if n_infinite:
        verdict.fail(f"{n_infinite} infinite returns (bad prices must give NaN, SPEC §1)")
    if short_columns:
        names = ", ".join(symbols[j] for j in short_columns[:10]) if symbols else ""
        verdict.fail(
            f"{len(short_columns)} kept symbols have < {min_history_days} finite returns: {names}"
        )
    if flat_columns:
        names = ", ".join(symbols[j] for j in flat_columns[:10]) if symbols else ""
        verdict.fail(f"{len(flat_columns)} kept symbols have zero variance: {names}")
    cells = n_rows * n_cols
    verdict.metadata["missing_return_share"] = (
        display.share(1.0 - finite_total / cells) if cells else 0.0
    )
    return verdict


# --------------------------------------------------------------------------------------------
# Correlation and overlap (SPEC §3)
# --------------------------------------------------------------------------------------------


@dataclass
class CorrelationStats:
    """Facts gathered in one tiled pass over ``corr`` and ``overlap`` (strict upper triangle)."""

    n: int
    asymmetric_corr: int = 0
    asymmetric_overlap: int = 0
    diagonal_not_one: int = 0
    out_of_range: int = 0
    finite_below_min_overlap: int = 0
    nan_at_or_above_min_overlap: int = 0
    overlap_diagonal_mismatch: int = 0
    pairs_total: int = 0
    pairs_defined: int = 0
    sum_abs_corr: float = 0.0
    max_abs_offdiag: float = 0.0
    mean_overlap: float = 0.0

    @property
    def mean_abs_corr(self) -> float:
        return self.sum_abs_corr / self.pairs_defined if self.pairs_defined else float("nan")


def correlation_stats(
    corr: np.ndarray,
    overlap: np.ndarray,
    *,
    min_overlap: int,
    finite_counts: np.ndarray | None = None,
) -> CorrelationStats:
    """One pass over the strict upper triangle of ``corr``/``overlap``
    (:func:`corr_pipeline.compute.matrix_facts.upper_triangle_facts`).

    Each ``corr[i, j]`` is compared bit for bit (as uint32) with ``corr[j, i]`` (SPEC §3:
    exactly symmetric, NaN patterns included), likewise ``overlap``. On the strict upper
    triangle: finite values must lie in ``[-1, 1]``; ``overlap < min_overlap`` must give NaN;
    ``overlap >= min_overlap`` with NaN is counted (legitimate only for zero variance on the
    overlap, reported, not failed). Diagonal: ``corr[i, i] == 1`` and, when ``finite_counts``
    (finite returns per column) is given, ``overlap[i, i] == finite_counts[i]``. Also the mean
    ``|corr|`` over defined pairs (float64) and the mean overlap. Memory: O(N).
    """
    n = int(corr.shape[0])
    stats = CorrelationStats(n=n)
    if n == 0:
        return stats
    diagonal = np.arange(n)
    stats.diagonal_not_one = int(np.count_nonzero(corr[diagonal, diagonal] != np.float32(1.0)))
    if finite_counts is not None:
        stats.overlap_diagonal_mismatch = int(
            np.count_nonzero(overlap[diagonal, diagonal].astype(np.int64) != finite_counts)
        )
    facts = upper_triangle_facts(corr, overlap, min_overlap=min_overlap)
    stats.asymmetric_corr = facts.asymmetric_corr
    stats.asymmetric_overlap = facts.asymmetric_overlap
    stats.out_of_range = facts.out_of_range
    stats.finite_below_min_overlap = facts.finite_below_min_overlap
    stats.nan_at_or_above_min_overlap = facts.nan_at_or_above_min_overlap
    stats.pairs_total = facts.pairs_total
    stats.pairs_defined = facts.pairs_defined
    stats.sum_abs_corr = facts.sum_abs_corr
    stats.max_abs_offdiag = facts.max_abs_offdiag
    stats.mean_overlap = facts.sum_overlap / facts.pairs_total if facts.pairs_total else 0.0
    return stats


def verify_correlation(stats: CorrelationStats) -> dict[str, Verdict]:
    """Verdicts for the three correlation checks from one :func:`correlation_stats` pass."""
    symmetry = Verdict(
        passed=True,
        metadata={
            "asymmetric_corr_entries": stats.asymmetric_corr,
            "asymmetric_overlap_entries": stats.asymmetric_overlap,
        },
    )
    if stats.asymmetric_corr:
        symmetry.fail(f"{stats.asymmetric_corr} entries differ from their transpose (bitwise)")
    if stats.asymmetric_overlap:
        symmetry.fail(f"{stats.asymmetric_overlap} overlap entries differ from their transpose")

    diagonal = Verdict(
        passed=True,
        metadata={
            "diagonal_not_one": stats.diagonal_not_one,
            "overlap_diagonal_mismatch": stats.overlap_diagonal_mismatch,
        },
    )
    if stats.diagonal_not_one:
        diagonal.fail(f"{stats.diagonal_not_one} diagonal entries are not exactly 1")
    if stats.overlap_diagonal_mismatch:
        diagonal.fail(
            f"{stats.overlap_diagonal_mismatch} overlap diagonal entries differ from the "
            "symbol's finite-return count"
        )

    value_range = Verdict(
        passed=True,
        metadata={
            "out_of_range": stats.out_of_range,
            "finite_below_min_overlap": stats.finite_below_min_overlap,
            "nan_at_or_above_min_overlap": stats.nan_at_or_above_min_overlap,
            "pairs_defined": stats.pairs_defined,
            "pairs_total": stats.pairs_total,
            "max_abs_offdiag_corr": display.corr(stats.max_abs_offdiag),
        },
    )
    if stats.out_of_range:
        value_range.fail(f"{stats.out_of_range} finite correlations outside [-1, 1]")
    if stats.finite_below_min_overlap:
        value_range.fail(
            f"{stats.finite_below_min_overlap} correlations are finite although their overlap "
            "is below min_overlap (SPEC §3 requires NaN)"
        )
    return {"symmetry": symmetry, "unit_diagonal": diagonal, "range": value_range}


# --------------------------------------------------------------------------------------------
# Top-k neighbors (SPEC §4)
# --------------------------------------------------------------------------------------------


def verify_neighbors(
    index: np.ndarray,
    neighbor_corr: np.ndarray,
    corr: np.ndarray,
    *,
    k: int,
    neighbor_overlap: np.ndarray | None = None,
    overlap: np.ndarray | None = None,
) -> Verdict:
    """SPEC §4 against the correlation matrix.

    For each row ``i``: filled entries form a prefix of length ``min(k, #finite corr[i, j != i])``
    (rows are "filled" exactly as far as the data allows; the rest is ``-1`` / NaN); indices are
    distinct, in ``[0, N)``, never ``i``; each ``neighbor_corr`` equals ``corr[i, index]`` bit for
    bit (and ``neighbor_overlap`` equals ``overlap[i, index]``); ``|corr|`` is non-increasing;
    and no unselected finite entry has a strictly larger ``|corr|`` than the last selected one
    (in a full row: the entries above the weakest selected ``|corr|`` are exactly the selected
    ones above it). The finite and larger entries of every row are counted in one pass over
    ``corr`` (:func:`corr_pipeline.compute.matrix_facts.row_counts_above`); the rest reads the
    ``N x k`` arrays and the entries they name. Memory: O(N·k).
    """
    n = int(corr.shape[0])
    verdict = Verdict(passed=True)
    if index.shape != (n, k) or neighbor_corr.shape != (n, k):
        verdict.fail(
            f"neighbor arrays have shapes {index.shape}/{neighbor_corr.shape}, expected ({n}, {k})"
        )
        return verdict
    counts = dict.fromkeys(
        (
            "rows_short_of_k",
            "bad_padding",
            "bad_index",
            "self_or_duplicate",
            "value_mismatch",
            "overlap_mismatch",
            "not_sorted",
            "missed_larger",
        ),
        0,
    )
    rows = np.arange(n)
    idx = np.asarray(index, dtype=np.int64)
    vals = np.asarray(neighbor_corr)
    filled_mask = idx >= 0
    filled = filled_mask.sum(axis=1)
    in_range = ~filled_mask | ((idx >= 0) & (idx < n))
    counts["bad_index"] = int(np.count_nonzero(~in_range))
    safe = np.where(filled_mask & in_range, idx, 0)
    is_self = filled_mask & (safe == rows[:, None])
    sorted_idx = np.sort(np.where(filled_mask, safe, -1 - np.arange(k)[None, :]), axis=1)
    dup = (sorted_idx[:, 1:] == sorted_idx[:, :-1]).sum(axis=1)
    counts["self_or_duplicate"] = int(np.count_nonzero(is_self)) + int(dup.sum())
    gathered = np.asarray(corr[rows[:, None], safe]) if n else np.empty((0, k), np.float32)
    mismatch = filled_mask & (gathered.view(np.uint32) != vals.view(np.uint32))
    counts["value_mismatch"] = int(np.count_nonzero(mismatch))
    if overlap is not None and neighbor_overlap is not None and n:
        ov_gathered = np.asarray(overlap[rows[:, None], safe])
        counts["overlap_mismatch"] = int(
            np.count_nonzero(filled_mask & (ov_gathered.astype(np.int64) != neighbor_overlap))
        )
    abs_vals = np.where(filled_mask, np.abs(gathered), -np.inf)
    counts["not_sorted"] = int(
        np.count_nonzero(filled_mask[:, 1:] & (abs_vals[:, 1:] > abs_vals[:, :-1]))
    )
    # the weakest selected |corr| of each row (+inf where none is): the finite entries above it
    # must all be selected ones, in a full row; a row not full must have selected every finite
    # entry (its prefix length is checked against them below)
    weakest = np.where(filled > 0, np.min(np.where(filled_mask, abs_vals, np.inf), axis=1), np.inf)
    available, above = row_counts_above(corr, weakest.astype(np.float32))
    selected_above = (
        filled_mask & ~is_self & np.isfinite(gathered) & (abs_vals > weakest[:, None])
    ).sum(axis=1)
    full_rows = filled == k
    counts["missed_larger"] = int(np.maximum(above - selected_above, 0)[full_rows].sum())
    expected = np.minimum(k, available)
    counts["rows_short_of_k"] = int(np.count_nonzero(expected < min(k, n - 1)))
    prefix_ok = (filled_mask == (np.arange(k)[None, :] < filled[:, None])).all(axis=1)
    pad_ok = np.where(filled_mask, True, (idx == -1) & np.isnan(vals)).all(axis=1)
    counts["bad_padding"] = int(np.count_nonzero(~prefix_ok | ~pad_ok | (filled != expected)))
    filled_total = int(filled.sum())
    verdict.metadata.update(counts)
    verdict.metadata["neighbors_published"] = filled_total
    verdict.metadata["fill_rate"] = display.share(filled_total / (n * k)) if n * k else 1.0
    labels = {
        "bad_padding": "rows whose filled prefix is not min(k, finite entries) or padding is not -1/NaN",
        "bad_index": "indices outside [0, N)",
        "self_or_duplicate": "self or duplicate neighbors",
        "value_mismatch": "neighbor correlations that differ from corr[i, j]",
        "overlap_mismatch": "neighbor overlaps that differ from overlap[i, j]",
        "not_sorted": "rows not ordered by |corr| descending",
        "missed_larger": "unselected entries with a larger |corr| than a selected one",
    }
    for key, label in labels.items():
        if counts[key]:
            verdict.fail(f"{counts[key]} {label}")
    return verdict


# --------------------------------------------------------------------------------------------
# Clusters (SPEC §5)
# --------------------------------------------------------------------------------------------


def verify_clusters(labels: np.ndarray, n_symbols: int, *, top: int = 10) -> Verdict:
    """SPEC §5 labelling: one int32 label per symbol, ``0..K-1`` all used, numbered by first
    appearance in column order. Facts: K, the ``top`` largest sizes, singletons (clusters of
    one symbol) and their share of the symbols, the largest cluster's share."""
    verdict = Verdict(passed=True)
    labels = np.asarray(labels)
    if labels.shape != (n_symbols,):
        verdict.fail(f"{labels.shape[0] if labels.ndim else 0} labels for {n_symbols} symbols")
        return verdict
    if labels.dtype != np.int32:
        verdict.fail(f"labels dtype is {labels.dtype}, expected int32")
    if n_symbols == 0:
        verdict.metadata["n_clusters"] = 0
        return verdict
    if labels.min() < 0:
        verdict.fail(f"{int(np.count_nonzero(labels < 0))} symbols have a negative label")
        return verdict
    uniques, first = np.unique(labels, return_index=True)
    n_clusters = int(uniques.size)
    if uniques[-1] != n_clusters - 1:
        verdict.fail(f"labels are not 0..K-1 (K = {n_clusters}, max = {int(uniques[-1])})")
    elif not np.all(np.diff(first) > 0):
        verdict.fail("labels are not numbered by first appearance in column order")
    sizes = np.bincount(labels.astype(np.int64))
    largest = np.sort(sizes)[::-1][:top]
    n_singletons = int(np.count_nonzero(sizes == 1))
    verdict.metadata.update(
        {
            "n_clusters": n_clusters,
            "n_singletons": n_singletons,
            "singleton_share": display.share(n_singletons / n_symbols),
            "largest_cluster_size": int(largest[0]),
            "largest_cluster_share": display.share(float(largest[0]) / n_symbols),
            "largest_sizes": ", ".join(str(int(s)) for s in largest),
        }
    )
    return verdict


# --------------------------------------------------------------------------------------------
# Lead-lag pairs (SPEC §6)
# --------------------------------------------------------------------------------------------


def verify_lead_lag_pairs(
    pairs: np.ndarray,
    n_symbols: int,
    *,
    max_lag: int,
    min_overlap: int,
    min_improvement: float,
    max_q_value: float = 1.0,
) -> Verdict:
    """SPEC §6 on the selected pairs: ``1 <= lag <= max_lag``; leader and lagger distinct
    indices in ``[0, N)``; each ordered pair once; ``|lagged_corr| <= 1``; ``overlap >=
    min_overlap``; ``improvement > min_improvement`` and equal to ``|lagged_corr| - |sync_corr|``
    (NaN sync as 0) within 1e-6; ``0 <= p_value <= q_value <= max_q_value`` (Benjamini–Hochberg
    never lowers a p-value); the reverse direction either absent (``reverse_lag`` 0, its
    correlation and q-value NaN) or a lag in ``1..max_lag`` with ``|reverse_lagged_corr| <= 1``
    and ``0 <= reverse_q_value <= 1``; rows sorted by improvement descending, then leader,
    lagger."""
    verdict = Verdict(passed=True)
    n_pairs = int(pairs.shape[0])
    verdict.metadata["n_pairs"] = n_pairs
    if n_pairs == 0:
        return verdict
    leader = pairs["leader"].astype(np.int64)
    lagger = pairs["lagger"].astype(np.int64)
    lag = pairs["lag"].astype(np.int64)
    lagged = pairs["lagged_corr"].astype(np.float64)
    sync = pairs["sync_corr"].astype(np.float64)
    improvement = pairs["improvement"].astype(np.float64)
    overlap = pairs["overlap"].astype(np.int64)

    def count(mask: np.ndarray, label: str) -> None:
        bad = int(np.count_nonzero(mask))
        verdict.metadata[label.replace(" ", "_")] = bad
        if bad:
            verdict.fail(f"{bad} pairs: {label}")

    count((lag < 1) | (lag > max_lag), "lag out of range")
    count(
        (leader < 0) | (leader >= n_symbols) | (lagger < 0) | (lagger >= n_symbols),
        "index out of range",
    )
    count(leader == lagger, "leader equals lagger")
    keys = leader * max(1, n_symbols) + lagger
    count(np.r_[False, np.diff(np.sort(keys)) == 0], "duplicate pair")
    count(~np.isfinite(lagged) | (np.abs(lagged) > 1.0), "lagged corr not in [-1, 1]")
    count(overlap < min_overlap, "overlap below min_overlap")
    count(~(improvement > min_improvement), "improvement not above min_improvement")
    p_value, q_value = pairs["p_value"], pairs["q_value"]
    count(~((p_value >= 0.0) & (p_value <= q_value)), "p_value not in [0, q_value]")
    count(~(q_value <= max_q_value), "q_value above max_q_value")
    back, back_corr, back_q = (
        pairs["reverse_lag"],
        pairs["reverse_lagged_corr"],
        pairs["reverse_q_value"],
    )
    absent = (back == 0) & np.isnan(back_corr) & np.isnan(back_q)
    present = (back >= 1) & (back <= max_lag) & (np.abs(back_corr) <= 1.0)
    present &= (back_q >= 0.0) & (back_q <= 1.0)
    count(~(absent | present), "reverse direction malformed")
    expected = np.abs(lagged) - np.abs(np.nan_to_num(sync, nan=0.0))
    count(np.abs(expected - improvement) > 1e-6, "improvement inconsistent")
    order = np.lexsort((lagger, leader, -improvement))
    count(order != np.arange(n_pairs), "not in SPEC order")
    verdict.metadata["lags_seen"] = ", ".join(
        f"{int(v)}: {int(c)}" for v, c in zip(*np.unique(lag, return_counts=True), strict=True)
    )
    verdict.metadata["max_improvement"] = display.corr(improvement.max())
    return verdict


#: The bounds of the lead-lag step's parameters that :func:`verify_lead_lag_pairs` checks.
LEAD_LAG_BOUNDS = ("max_lag", "min_overlap", "min_improvement", "max_q_value")


def verify_lead_lag_step(pairs: np.ndarray, n_symbols: int, params: LeadLagParameters) -> Verdict:
    """:func:`verify_lead_lag_pairs` with the bounds of the lead-lag step's ``params``."""
    bounds = {name: getattr(params, name) for name in LEAD_LAG_BOUNDS}
    return verify_lead_lag_pairs(pairs, n_symbols, **bounds)


def verify_injected_pairs(
    pairs: np.ndarray, symbols: Sequence[str], truth: Iterable[tuple[str, str, int]]
) -> Verdict:
    """Recall of the synthetic injected pairs (``synthetic.lead_lag_truth``): every injected
    ``(leader, lagger, lag)`` whose two symbols were kept must appear with that exact lag.
    Passes trivially (and says so) when the database holds no synthetic truth."""
    truth = list(truth)
    verdict = Verdict(passed=True, metadata={"injected_pairs": len(truth)})
    if not truth:
        verdict.metadata["note"] = "no synthetic truth in the database (real data)"
        return verdict
    column = {s: j for j, s in enumerate(symbols)}
    kept = [(a, b, int(lag)) for a, b, lag in truth if a in column and b in column]
    # each pair as one number leader * N + lagger, sorted once: the injected ones looked up
    n = max(len(symbols), 1)
    keys = pairs["leader"].astype(np.int64) * n + pairs["lagger"].astype(np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    wanted = np.array([column[a] * n + column[b] for a, b, _ in kept], dtype=np.int64)
    at = np.searchsorted(sorted_keys, wanted)
    present = at < sorted_keys.size
    present[present] = sorted_keys[at[present]] == wanted[present]
    eligible, found = len(kept), 0
    missed: list[str] = []
    for (leader, lagger, lag), hit, i in zip(kept, present, at, strict=True):
        got = int(pairs["lag"][order[i]]) if hit else None
        if got == lag:
            found += 1
        else:
            missed.append(f"{leader}->{lagger} (lag {lag}, got {got})")
    verdict.metadata.update(
        {
            "injected_pairs_kept": eligible,
            "injected_pairs_found": found,
            "recall": display.share(found / eligible) if eligible else 1.0,
        }
    )
    if missed:
        verdict.fail(f"{len(missed)} injected pairs not found: " + ", ".join(missed[:10]))
    return verdict


# --------------------------------------------------------------------------------------------
# Publication (SPEC §7)
# --------------------------------------------------------------------------------------------


def verify_published_counts(results: SnapshotResults, counts: dict[str, int]) -> Verdict:
    """The rows read back for the snapshot date (``counts`` per table) equal what ``results``
    publishes: one ``snapshots`` row, one ``peer_neighbors`` row per filled neighbor, one
    ``symbol_clusters`` row per symbol, one ``lead_lag_pairs`` row per pair, one
    ``suspect_prices`` row per suspect symbol (when ``counts`` has that table)."""
    expected = {
        "snapshots": 1,
        "peer_neighbors": int(np.count_nonzero(np.asarray(results.neighbor_index) >= 0)),
        "symbol_clusters": len(results.symbols),
        "lead_lag_pairs": int(np.asarray(results.lead_lag_pairs).shape[0]),
    }
    if "suspect_prices" in counts:
        expected["suspect_prices"] = len(results.suspects)
    verdict = Verdict(passed=True, metadata={f"{k}_rows": v for k, v in counts.items()})
    for table, want in expected.items():
        if counts.get(table) != want:
            verdict.fail(
                f"{table}: {counts.get(table)} rows for {results.snapshot_date}, expected {want}"
            )
    return verdict
