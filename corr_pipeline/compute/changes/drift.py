"""Drift and top moves of the correlations between two sessions (SPEC §10.1, §10.2):
:func:`correlation_changes` (see :mod:`corr_pipeline.compute.changes` for the method)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute.changes.drift_scan import (
    MAX_SLOTS,
    N_BINS,
    ScanCollect,
    ScanInputs,
    ScanRows,
    ScanTotals,
    column_runs,
    scan_rows,
)
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, row_blocks
from corr_pipeline.compute.validation import (
    check_array,
    check_positive_int,
    check_square_corr,
    check_working_memory,
)
from corr_pipeline.compute.workers import available_cores, worker_pool

#: Quantile levels of the market-level drift.
DEFAULT_QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)

#: The four distributions whose quantiles are reported, in this order.
DISTRIBUTIONS = ("corr_today", "corr_previous", "abs_corr_today", "abs_corr_previous")
#: At most this many interleaved row chunks (one task each on the worker threads).
_MAX_CHUNKS = 4
#: Fine bins per bin of the recorded histogram of ``Δ``: the scan counts ``change_bins × 1024``
#: equal bins over [−2, 2] (width 4.9e-5 at 80 bins), which the recorded bins sum exactly (a
#: power of two: ``(Δ + 2) · bins · 1024`` is ``(Δ + 2) · bins`` scaled, not rounded again), and
#: which the picture re-bins to fit the data (:mod:`corr_pipeline.viz.changes`).
FINE_PER_BIN = 1024


@dataclass(frozen=True)
class CorrelationChanges:
    """Result of :func:`correlation_changes` (SPEC §10.1, §10.2).

    n_pairs : compared pairs ``p < q``.
    means : ``{"corr_today", "corr_previous", "abs_corr_today", "abs_corr_previous", "change",
        "abs_change"}`` → mean over the compared pairs (NaN when there are none).
    quantile_levels : the levels ``q``.
    quantiles : ``{name in DISTRIBUTIONS: float64 array of len(quantile_levels)}`` (NaN when no pair).
    change_counts : int64 histogram of ``Δ`` over ``change_edges`` (float64, bins + 1 edges over
        [−2, 2]; the last bin includes 2).
    fine_change_counts, fine_change_edges : the same histogram at :data:`FINE_PER_BIN` times the
        resolution (``change_counts`` is the sum of each run of :data:`FINE_PER_BIN` of them).
    top_p, top_q : int64 positions (into the common symbols) of the top pairs, ``p < q``, by
        ``|Δ|`` descending then ``(p, q)`` ascending; at most ``top_m`` (fewer if fewer pairs).
    top_corr_today, top_corr_previous : float32 values; top_overlap_today, top_overlap_previous :
        int64 overlaps; top_change : float64 ``Δ`` (signed).
    """

    n_pairs: int
    means: dict[str, float]
    quantile_levels: tuple[float, ...]
    quantiles: dict[str, np.ndarray]
    change_counts: np.ndarray
    change_edges: np.ndarray
    fine_change_counts: np.ndarray
    fine_change_edges: np.ndarray
    top_p: np.ndarray
    top_q: np.ndarray
    top_corr_today: np.ndarray
    top_corr_previous: np.ndarray
    top_overlap_today: np.ndarray
    top_overlap_previous: np.ndarray
    top_change: np.ndarray


def _four_histograms(counts: np.ndarray) -> np.ndarray:
    """The top-16-bit histograms of ``DISTRIBUTIONS`` (4 x 2^16) from those of the signed
    correlations of both days (2 x 2^16): the key of ``|x|`` is the key of ``x`` for ``x >= 0``
    (bins ``>= 2^15``) and its mirror ``2^32 − 1 − key`` for ``x < 0``, so
    ``abs[b] = signed[b] + signed[2^16 − 1 − b]`` for ``b >= 2^15`` (0 below)."""
    folded = counts[:, N_BINS // 2 :] + counts[:, : N_BINS // 2][:, ::-1]
    absolute = np.concatenate((np.zeros_like(folded), folded), axis=1)
    return np.concatenate((counts, absolute))


def _signed_bins(bins: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The signed-histogram bins ``(day, bin)`` holding the values of the distribution bins
    ``(d, b)`` (for ``|corr|``, ``b`` and its mirror ``2^16 − 1 − b``)."""
    out = {(d, b) if d < 2 else (d - 2, b) for d, b in bins}
    out |= {(d - 2, N_BINS - 1 - b) for d, b in bins if d >= 2}
    return sorted(out)


def _counts_of(hist: np.ndarray, bins: Sequence[tuple[int, int]]) -> np.ndarray:
    """int64 (chunks x len(bins)): each chunk's count of each signed bin."""
    return np.array([[int(h[d, b]) for d, b in bins] for h in hist], np.int64).reshape(
        len(hist), len(bins)
    )


@dataclass
class _Collect:
    """Where the scan appends the keys of the signed bins ``bins``: chunk ``c``'s keys of bin
    ``bins[s]`` go to ``values[c][offsets[c, s] : offsets[c, s] + caps[c, s]]``, ``fill[c, s]``
    counts them (beyond ``caps``: dropped; the caller compares ``fill`` with ``caps``)."""

    bins: list[tuple[int, int]]
    lookup: np.ndarray
    offsets: np.ndarray
    caps: np.ndarray
    fill: np.ndarray
    values: list[np.ndarray]

    @classmethod
    def of(cls, bins: Sequence[tuple[int, int]], caps: np.ndarray) -> _Collect:
        if len(bins) > MAX_SLOTS:
            raise ValueError(f"at most {MAX_SLOTS} bins (int8 slots)")
        lookup = np.full((2, N_BINS + 1), -1, np.int8)  # the last: pairs not compared
        for slot, (d, b) in enumerate(bins):
            lookup[d, b] = slot
        offsets = np.zeros_like(caps)
        offsets[:, 1:] = np.cumsum(caps, axis=1)[:, :-1]
        return cls(
            list(bins),
            lookup,
            offsets,
            caps,
            np.zeros_like(caps),
            [np.empty(int(row.sum()), np.uint32) for row in caps],
        )

    def keys(self, bin_: tuple[int, int]) -> np.ndarray:
        """The keys of ``bin_`` (all chunks; every one held: ``fill <= caps``)."""
        s = self.bins.index(bin_)
        return np.concatenate(
            [
                v[o[s] : o[s] + f[s]]
                for v, o, f in zip(self.values, self.offsets, self.fill, strict=True)
            ]
        )


def _from_key(key: np.ndarray) -> np.ndarray:
    """float32 values of order-preserving uint32 keys (inverse of the scan's key: ``~bits``
    for a negative float32, ``bits | 2^31`` otherwise)."""
    key = np.asarray(key, dtype=np.uint32)
    bits = np.where(key & np.uint32(0x80000000), key & np.uint32(0x7FFFFFFF), ~key)
    return bits.astype(np.uint32).view(np.float32)


def _select(keys: np.ndarray, kth: Sequence[int]) -> np.ndarray:
    """``keys`` (uint32) with the values of ranks ``kth`` (ascending, distinct) at those
    positions, as in ``np.sort(keys)``: one ``np.partition`` with all of them (introselect,
    O(len(keys)) per rank instead of a full sort)."""
    return np.partition(keys, list(kth))


def _lerp(lower: float, upper: float, t: float) -> float:
    """numpy's interpolation of ``np.quantile(method="linear")``."""
    diff = upper - lower
    return upper - diff * (1 - t) if t >= 0.5 else lower + diff * t


def correlation_changes(
    corr_today: np.ndarray,
    overlap_today: np.ndarray,
    corr_previous: np.ndarray,
    overlap_previous: np.ndarray,
    today_index: np.ndarray,
    previous_index: np.ndarray,
    *,
    min_overlap: int,
    top_m: int = 100,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    change_bins: int = 80,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> CorrelationChanges:
    """Market-level drift and the largest correlation moves between two snapshots (module
    docstring; SPEC §10.1–10.2).

    ``today_index[p]`` / ``previous_index[p]`` are the positions of common symbol ``p`` in each
    universe (:func:`match_symbols`); they must be strictly increasing (both universes sorted by
    name), so a block of common symbols reads one contiguous range of rows of each matrix.
    ``top_m = 0`` skips the selection. The result does not depend on ``working_memory_mb``.

    Examples
    --------
    >>> import numpy as np
    >>> from corr_pipeline.synth import example_returns
    >>> R = example_returns()  # 1 moves with 0, 3 follows 2 a day later, 2 listed late
    >>> from corr_pipeline.compute import pairwise_correlation
    >>> before = pairwise_correlation(R, min_overlap=60)
    >>> R[:, 1] = np.random.default_rng(1).standard_normal(250)  # symbol 1 stops following 0
    >>> after = pairwise_correlation(R, min_overlap=60)
    >>> same = np.arange(4)  # the same four symbols, in the same order, both days
    >>> changes = correlation_changes(
    ...     after.corr, after.overlap, before.corr, before.overlap, same, same,
    ...     min_overlap=60, top_m=1,
    ... )
    >>> int(changes.top_p[0]), int(changes.top_q[0]), round(float(changes.top_change[0]), 2)
    (0, 1, -0.73)
    """
    check_square_corr(corr_today, "corr_today")
    check_square_corr(corr_previous, "corr_previous")
    check_array(overlap_today, "overlap_today", np.integer, shape=corr_today.shape)
    check_array(overlap_previous, "overlap_previous", np.integer, shape=corr_previous.shape)
    check_positive_int(min_overlap, "min_overlap")
    check_positive_int(top_m, "top_m", minimum=0)
    check_positive_int(change_bins, "change_bins")
    check_working_memory(working_memory_mb)
    ti = np.asarray(today_index, dtype=np.int64)
    pi = np.asarray(previous_index, dtype=np.int64)
    if ti.ndim != 1 or ti.shape != pi.shape:
        raise ValueError("today_index and previous_index must be 1-D of the same length")
    for name, idx, n_max in (
        ("today_index", ti, corr_today.shape[0]),
        ("previous_index", pi, corr_previous.shape[0]),
    ):
        if idx.size and (idx[0] < 0 or idx[-1] >= n_max or np.any(np.diff(idx) <= 0)):
            raise ValueError(f"{name} must be strictly increasing within [0, {n_max})")
    levels = tuple(float(q) for q in quantiles)
    if any(not 0.0 <= q <= 1.0 for q in levels):
        raise ValueError(f"quantiles must lie in [0, 1], got {levels}")
    n = int(ti.size)
    m = int(top_m)

    chunks = max(1, min(available_cores(), _MAX_CHUNKS))
    row_sums = np.zeros((n, 7), np.float64)
    # one more bin in each: the scan counts the pairs not compared there
    hist = np.zeros((chunks, 2, N_BINS + 1), np.uint32)
    scanned_total = np.zeros((chunks, 2, N_BINS + 1), np.int64)
    hist_total = scanned_total[:, :, :N_BINS]
    fine_bins = int(change_bins) * FINE_PER_BIN
    change_counts = np.zeros((chunks, fine_bins + 1), np.int64)
    runs = column_runs(ti, pi)
    top_scores = np.full((chunks, m), -np.inf, np.float64)
    top_keys = np.full((chunks, m), -1, np.int64)
    # a block row reads one row of each of the four matrices (views, no copies)
    row_bytes = sum(a.shape[1] * a.dtype.itemsize for a in (corr_today, overlap_today))
    row_bytes += sum(a.shape[1] * a.dtype.itemsize for a in (corr_previous, overlap_previous))
    blocks = row_blocks(n, row_bytes, working_memory_mb)

    def run(accumulate: bool, collect: _Collect) -> None:
        """Scan every row ``p`` of the common symbols: chunk ``c`` (the rows with
        ``p % chunks == c``, so that each chunk meets the same rows in every read, in block
        order) is one task on the worker threads, writing only its own outputs.
        ``accumulate``: the first-pass outputs; ``collect``: the keys of its bins."""

        def chunk(c: int) -> None:
            for p0, p1 in blocks:
                t0, t1 = int(ti[p0]), int(ti[p1 - 1]) + 1
                q0, q1 = int(pi[p0]), int(pi[p1 - 1]) + 1
                block_t = np.asarray(corr_today[t0:t1])  # views of the memory maps
                block_p = np.asarray(corr_previous[q0:q1])
                scan_rows(
                    ScanInputs(
                        block_t.view(np.uint32),
                        block_t,
                        np.asarray(overlap_today[t0:t1]),
                        block_p.view(np.uint32),
                        block_p,
                        np.asarray(overlap_previous[q0:q1]),
                    ),
                    ScanRows(
                        t0,
                        q0,
                        ti,
                        pi,
                        np.arange(p0 + (c - p0) % chunks, p1, chunks),
                        int(min_overlap),
                        *runs,
                    ),
                    ScanTotals(
                        row_sums,
                        hist[c],
                        scanned_total[c],
                        change_counts[c],
                        top_scores[c],
                        top_keys[c],
                    ),
                    ScanCollect(
                        collect.lookup,
                        collect.offsets[c],
                        collect.caps[c],
                        collect.fill[c],
                        collect.values[c],
                    ),
                    accumulate=accumulate,
                )

        if blocks:
            with worker_pool() as pool:
                list(pool.map(chunk, range(chunks)))

    # the first read: sums, histograms, Δ counts, top M
    run(True, _Collect.of([], np.zeros((chunks, 0), np.int64)))

    sums = row_sums.sum(axis=0)  # per-row sums, added in row order: independent of the chunks
    count = int(sums[0])
    names = ("corr_today", "corr_previous", "abs_corr_today", "abs_corr_previous")
    means = {
        name: (float(sums[i + 1] / count) if count else float("nan"))
        for i, name in enumerate(names)
    }
    means["change"] = float(sums[5] / count) if count else float("nan")
    means["abs_change"] = float(sums[6] / count) if count else float("nan")

    out_quantiles = {name: np.full(len(levels), np.nan) for name in DISTRIBUTIONS}
    if count and levels:
        # the order statistics wanted: lo and lo + 1 of h = q (n - 1); each lies in the top-16-bit
        # bin where the cumulative count first exceeds its rank
        lows = {int(np.floor(q * (count - 1))) for q in levels}
        ranks = sorted(lows | {min(r + 1, count - 1) for r in lows})
        signed_counts = hist_total.sum(axis=0)
        cum = np.cumsum(_four_histograms(signed_counts), axis=1)
        needed = _signed_bins(
            sorted({(d, int(np.searchsorted(cum[d], r, "right"))) for d in range(4) for r in ranks})
        )
        # the second read: the keys of exactly the needed bins (each chunk's room: its counts),
        # at most MAX_SLOTS bins per read
        collected: dict[tuple[int, int], np.ndarray] = {}
        for first in range(0, len(needed), MAX_SLOTS):
            group = needed[first : first + MAX_SLOTS]
            keys_of = _Collect.of(group, _counts_of(hist_total, group))
            run(False, keys_of)
            if np.any(keys_of.fill != keys_of.caps):  # the reads must have seen the same data
                raise RuntimeError("correlation_changes: the inputs changed between the reads")
            collected.update((bin_, keys_of.keys(bin_)) for bin_ in group)

        def bin_keys(d: int, b: int) -> np.ndarray:
            """Keys of bin ``b`` of distribution ``d``, unordered (for ``|corr|``: the keys of
            ``b`` and the mirrored keys ``2^32 − 1 − key`` of its mirror bin)."""
            if d < 2:
                return collected[(d, b)]
            mirror = collected[(d - 2, N_BINS - 1 - b)]
            return np.concatenate((collected[(d - 2, b)], ~mirror))

        # each order statistic of rank r is rank r − before of its bin (before: the values of
        # the lower bins); one selection per bin places all its wanted ranks at once
        by_bin: dict[tuple[int, int], dict[int, int]] = {}
        for d in range(4):
            for r in ranks:
                b = int(np.searchsorted(cum[d], r, "right"))
                by_bin.setdefault((d, b), {})[r] = r - (int(cum[d, b - 1]) if b else 0)
        value: dict[tuple[int, int], float] = {}
        for (d, b), in_bin in by_bin.items():
            kth = sorted(set(in_bin.values()))
            keys = _select(bin_keys(d, b), kth)
            for r, i in in_bin.items():
                value[(d, r)] = float(_from_key(keys[i : i + 1])[0])

        for d, name in enumerate(DISTRIBUTIONS):
            for i, q in enumerate(levels):
                h = q * (count - 1)
                lo = int(np.floor(h))
                hi = min(lo + 1, count - 1)
                out_quantiles[name][i] = _lerp(value[(d, lo)], value[(d, hi)], h - lo)

    fine_counts = change_counts[:, :-1].sum(axis=0)
    # the global top M is among the chunks' top M: |Δ| descending, then the pair key
    scores, all_keys = top_scores.ravel(), top_keys.ravel()
    kept = np.flatnonzero(all_keys >= 0)
    keys = all_keys[kept[np.lexsort((all_keys[kept], -scores[kept]))][:m]]
    tp, tq = keys // max(n, 1), keys % max(n, 1)
    rows_t, cols_t, rows_p, cols_p = ti[tp], ti[tq], pi[tp], pi[tq]
    top_corr_today = np.asarray(corr_today[rows_t, cols_t], dtype=np.float32)
    top_corr_previous = np.asarray(corr_previous[rows_p, cols_p], dtype=np.float32)
    return CorrelationChanges(
        n_pairs=count,
        means=means,
        quantile_levels=levels,
        quantiles=out_quantiles,
        change_counts=fine_counts.reshape(int(change_bins), FINE_PER_BIN).sum(axis=1),
        change_edges=np.linspace(-2.0, 2.0, int(change_bins) + 1),
        fine_change_counts=fine_counts,
        fine_change_edges=np.linspace(-2.0, 2.0, fine_bins + 1),
        top_p=tp,
        top_q=tq,
        top_corr_today=top_corr_today,
        top_corr_previous=top_corr_previous,
        top_overlap_today=np.asarray(overlap_today[rows_t, cols_t], dtype=np.int64),
        top_overlap_previous=np.asarray(overlap_previous[rows_p, cols_p], dtype=np.int64),
        top_change=top_corr_today.astype(np.float64) - top_corr_previous.astype(np.float64),
    )
