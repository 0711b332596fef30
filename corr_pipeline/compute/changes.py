"""What changed between two snapshots: the previous session's and today's (SPEC §10).

Symbols are matched by name, never by index: the two universes differ (symbols enter and leave).
:func:`match_symbols` builds the index maps of the common symbols, in name order (code points, the
order of SPEC §2, so the maps are increasing in both universes when each is sorted by name).
Every function here works on those maps; "pair ``(p, q)``" means common symbols ``p < q``.

``correlation_changes`` (SPEC §10.1, 10.2) — one scan of the pairs ``p < q`` of common symbols,
row block by row block (:func:`corr_pipeline.compute.tiling.row_blocks`), reading the four N x N
inputs (corr and overlap of both days, typically read-only memory maps) in place: no N x N
temporary. A pair is *compared* iff both correlations are finite and both overlaps are
``>= min_overlap``. Over the compared pairs:

- sums for the means of ``corr``, ``|corr|`` of each day and of ``Δ = corr_today − corr_previous``
  and ``|Δ|`` (float64 accumulators, ``Δ`` in float64 from the float32 values);
- the exact quantiles of ``corr`` and ``|corr|`` of each day (numpy's default "linear" rule:
  ``x[lo] + (h − lo)(x[lo+1] − x[lo])`` with ``h = q (n − 1)``), by a radix select on the
  order-preserving 32-bit keys of the float32 values, in two reads of the matrices: the
  histograms of the top 16 key bits of ``corr`` of each day (2 x 2^16 uint32 per chunk,
  cache-resident; those of ``|corr|`` are the same counts folded, since the key of ``|x|`` is the
  key of ``x`` for ``x >= 0`` and its mirror ``2^32 − 1 − key`` for ``x < 0``), counted in the
  first read, tell which bin holds each wanted order statistic (rank ``r``, rank ``r − before``
  inside the bin, ``before`` the count of the lower bins); the second read collects the keys of
  exactly those bins (their counts known, so each chunk's buffers are sized exactly), and one
  ``np.partition`` of a bin's keys with all its wanted in-bin ranks selects them (exactly the
  values a sort would put there). Two reads, not one that guesses the bins from a sample of
  rows: the rows of a sector are alike, so a sample of rows places a quantile only to about
  1 % of rank, wider than the bins one read could afford to collect;
- a histogram of ``Δ`` (``change_bins`` equal bins over [−2, 2]);
- the top ``top_m`` pairs by ``|Δ|`` descending, ties to the smaller pair ``(p, q)``
  (lexicographic, i.e. by name): a running selection in that total order (:func:`_offer`), so
  the order the rows are scanned in does not matter.

Each row is read in runs of columns over which both index maps advance by one (:func:`_runs`:
contiguous values in all four matrices), 512 pairs at a time: vectorised passes over the values
(validity, keys, bins, the sums), then a scalar pass over their buffers (the histogram counts,
the keys collected, the top-M offers). The rows are split into at most 4 interleaved chunks
(the selected rows of a block taken in turn), one task each on the worker threads of
:mod:`corr_pipeline.compute.workers` (a GIL-free numba kernel per chunk and row block); the
results do not depend on the number of chunks or the blocks: the counts are integers, the top M
of each chunk is exact and merged in the same order, and the sums are accumulated per row (in a
fixed order: :func:`_step_sums`) and added in row order.

``neighbor_turnover`` (10.3): for a common symbol, how many of today's top-k neighbors were not
among its previous top-k (by name).

``cluster_migrations`` (10.4): today's clusters matched one-to-one to the previous ones by a
maximum total member overlap (``scipy.optimize.linear_sum_assignment``).

``lead_lag_changes`` (10.5): the pairs (by name) that appeared, vanished or changed lag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, row_blocks
from corr_pipeline.compute.validation import (
    check_array,
    check_positive_int,
    check_square_corr,
    check_working_memory,
)
from corr_pipeline.compute.workers import available_cores, worker_pool

__all__ = [
    "DEFAULT_QUANTILES",
    "ClusterMigrations",
    "CorrelationChanges",
    "LeadLagChanges",
    "SymbolMatch",
    "cluster_migrations",
    "correlation_changes",
    "lead_lag_changes",
    "match_symbols",
    "neighbor_turnover",
]

#: Quantile levels of the market-level drift.
DEFAULT_QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)

#: The four distributions whose quantiles are reported, in this order.
DISTRIBUTIONS = ("corr_today", "corr_previous", "abs_corr_today", "abs_corr_previous")

_HIGH_SHIFT = 16  # 32-bit keys: histograms of their top 16 bits
_N_BINS = 1 << _HIGH_SHIFT
#: Bins whose keys one read collects (int8 slots of the lookup table).
_MAX_SLOTS = 127
#: At most this many interleaved row chunks (one task each on the worker threads).
_MAX_CHUNKS = 4


# ------------------------------------------------------------------------------------------------
# symbols matched by name
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SymbolMatch:
    """The two universes matched by name.

    common : the common symbols, ascending (code points).
    today_index, previous_index : int64, their positions in today's / the previous universe.
    entered : int64 positions in today's universe of the symbols not in the previous one.
    left : int64 positions in the previous universe of the symbols not in today's.
    previous_to_today : int64 (N_previous,), today's position of each previous symbol, −1 if it left.
    """

    common: list[str]
    today_index: np.ndarray
    previous_index: np.ndarray
    entered: np.ndarray
    left: np.ndarray
    previous_to_today: np.ndarray


def match_symbols(today: Sequence[str], previous: Sequence[str]) -> SymbolMatch:
    """Match two symbol lists by name (duplicates in either list raise ``ValueError``)."""
    pos_today = {s: i for i, s in enumerate(today)}
    pos_prev = {s: i for i, s in enumerate(previous)}
    if len(pos_today) != len(today) or len(pos_prev) != len(previous):
        raise ValueError("symbol lists must not contain duplicates")
    common = sorted(pos_today.keys() & pos_prev.keys())
    prev_to_today = np.array([pos_today.get(s, -1) for s in previous], dtype=np.int64)
    return SymbolMatch(
        common=common,
        today_index=np.array([pos_today[s] for s in common], dtype=np.int64),
        previous_index=np.array([pos_prev[s] for s in common], dtype=np.int64),
        entered=np.array(
            sorted((i for s, i in pos_today.items() if s not in pos_prev), key=today.__getitem__),
            dtype=np.int64,
        ),
        left=np.flatnonzero(prev_to_today < 0).astype(np.int64),
        previous_to_today=prev_to_today,
    )


# ------------------------------------------------------------------------------------------------
# correlation changes: drift and top-M pairs
# ------------------------------------------------------------------------------------------------


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
    top_p: np.ndarray
    top_q: np.ndarray
    top_corr_today: np.ndarray
    top_corr_previous: np.ndarray
    top_overlap_today: np.ndarray
    top_overlap_previous: np.ndarray
    top_change: np.ndarray


_STEP = 512
"""Pairs per step of a row's run: the vector passes write their keys and bins to buffers
(L1-resident) that the scalar pass then counts."""


@numba.njit(cache=True, nogil=True, inline="always")
def _step_keys(
    ct, ot, cp, op, min_overlap, keys_t, keys_p, bins_t, bins_p, compared
):  # pragma: no cover - compiled
    """Per pair of the step: compared or not, both keys, and the top-16-bit bins of the keys
    (bin ``_N_BINS``, which counts nowhere, when not compared). Branch-free: vectorised."""
    exponent = np.uint32(0x7F800000)
    sign = np.uint32(0x80000000)
    trash = np.uint32(_N_BINS)
    for i in range(ct.shape[0]):
        bt = ct[i]
        bp = cp[i]
        ok = (
            (ot[i] >= min_overlap)
            & (op[i] >= min_overlap)
            & ((bt & exponent) != exponent)  # finite float32
            & ((bp & exponent) != exponent)
        )
        # order-preserving key: ~bits when negative, bits | sign otherwise (the casts: numba
        # widens the intermediate integers)
        k0 = np.uint32(bt ^ (((bt >> 31) * np.uint32(0x7FFFFFFF)) | sign))
        k1 = np.uint32(bp ^ (((bp >> 31) * np.uint32(0x7FFFFFFF)) | sign))
        keys_t[i] = k0
        keys_p[i] = k1
        bins_t[i] = (k0 >> np.uint32(_HIGH_SHIFT)) if ok else trash
        bins_p[i] = (k1 >> np.uint32(_HIGH_SHIFT)) if ok else trash
        compared[i] = ok


@numba.njit(cache=True, nogil=True, inline="always")
def _step_changes(ctf, cpf, compared, n_change, bins_d, scores):  # pragma: no cover - compiled
    """Per pair of the step: the bin of ``Δ`` (``n_change`` when not compared) and ``|Δ|``
    (−inf when not compared), exactly as SPEC §10.1 states them. Vectorised."""
    for i in range(ctf.shape[0]):
        d = np.float64(ctf[i]) - np.float64(cpf[i])
        ok = compared[i]
        b = min(max(int((d + 2.0) * n_change / 4.0), 0), n_change - 1)
        bins_d[i] = b if ok else n_change
        scores[i] = abs(d) if ok else -np.inf


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _step_sums(ctf, cpf, compared, sums):  # pragma: no cover - compiled
    """``sums += (count, Σct, Σcp, Σ|ct|, Σ|cp|, ΣΔ, Σ|Δ|)`` over the step's compared pairs,
    float64 from the float32 values. A function of its own: only these sums may be reordered
    (``reassoc``: vector lanes), deterministically for given inputs, so a row's sums do not
    depend on the chunks or the blocks (its steps are fixed by the runs)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = 0.0
    for i in range(ctf.shape[0]):
        ok = compared[i]
        vt = np.float64(ctf[i]) if ok else 0.0
        vp = np.float64(cpf[i]) if ok else 0.0
        d = vt - vp
        s0 += 1.0 if ok else 0.0
        s1 += vt
        s2 += vp
        s3 += abs(vt)
        s4 += abs(vp)
        s5 += d
        s6 += abs(d)
    sums[0] += s0
    sums[1] += s1
    sums[2] += s2
    sums[3] += s3
    sums[4] += s4
    sums[5] += s5
    sums[6] += s6


@numba.njit(cache=True, nogil=True, inline="always")
def _before(score, key, other_score, other_key):  # pragma: no cover - compiled
    """The order of the top M: ``|Δ|`` descending, then the pair key ascending (a total order:
    the top M does not depend on the order the pairs are offered in)."""
    return score > other_score or (score == other_score and key < other_key)


@numba.njit(cache=True, nogil=True, inline="always")
def _offer(scores, keys, m, score, key):  # pragma: no cover - compiled
    """Insert ``(score, key)`` into the top ``m`` (``scores[:m]`` / ``keys[:m]``, in
    :func:`_before` order) if it comes before the last. Empty places hold (−inf, −1), before
    every pair not compared (−inf, its key ≥ 0) and after every compared one."""
    if not _before(score, key, scores[m - 1], keys[m - 1]):
        return
    pos = m - 1
    while pos > 0 and _before(score, key, scores[pos - 1], keys[pos - 1]):
        scores[pos] = scores[pos - 1]
        keys[pos] = keys[pos - 1]
        pos -= 1
    scores[pos] = score
    keys[pos] = key


@numba.njit(cache=True, nogil=True, inline="always")
def _scan_body(accumulate, refine, inputs, rows, outputs, collect):  # pragma: no cover - compiled
    """The loop of :func:`_scan_rows` (its arguments grouped in four tuples), inlined into one
    kernel per pair of flags so that the flags are constants there: no test of them per pair.

    Each row ``p`` is read as runs of columns ``q`` over which both index maps advance by one
    (``jt = q + off_t``, ``jp = q + off_p``: contiguous in all four matrices), ``_STEP`` pairs
    at a time: the vectorised passes (:func:`_step_keys`, :func:`_step_changes`,
    :func:`_step_sums`) over the step's values, then a scalar pass over their buffers that
    counts the bins (a pair not compared counts in the extra last bins only), collects the keys
    (slot −1 there) and offers the pairs beating the top-M threshold."""
    ct, ctf, ot, cp, cpf, op = inputs
    row0_t, row0_p, ti, pi, row_list, min_overlap, run_start, run_t, run_p = rows
    row_sums, hist, hist_total, change_counts, top_scores, top_keys = outputs
    lookup, offsets, caps, fill, values = collect
    n = ti.shape[0]
    n_change = change_counts.shape[0] - 1
    m = top_scores.shape[0]
    keys_t = np.empty(_STEP, np.uint32)
    keys_p = np.empty(_STEP, np.uint32)
    bins_t = np.empty(_STEP, np.uint32)
    bins_p = np.empty(_STEP, np.uint32)
    compared = np.empty(_STEP, np.bool_)
    bins_d = np.empty(_STEP, np.int64)
    scores = np.empty(_STEP, np.float64)
    sums = np.zeros(7, np.float64)
    # the running top M's admission threshold in a register: a pair is inserted only when it
    # beats the current M-th (rare after the first rows)
    threshold = top_scores[m - 1] if m > 0 else np.inf
    flush_every = max(1, (2**31 - 1) // max(n, 1))  # rows before a uint32 count could overflow
    rows_since_flush = 0
    for p in row_list:
        rt = ti[p] - row0_t
        rp = pi[p] - row0_p
        sums[:] = 0.0
        for r in range(run_start.shape[0] - 1):
            q_end = run_start[r + 1]
            if q_end <= p + 1:
                continue
            for q0 in range(max(run_start[r], p + 1), q_end, _STEP):
                width = min(_STEP, q_end - q0)
                a_t = q0 + run_t[r]
                a_p = q0 + run_p[r]
                _step_keys(
                    ct[rt, a_t : a_t + width],
                    ot[rt, a_t : a_t + width],
                    cp[rp, a_p : a_p + width],
                    op[rp, a_p : a_p + width],
                    min_overlap,
                    keys_t,
                    keys_p,
                    bins_t,
                    bins_p,
                    compared,
                )
                if accumulate:
                    step_ct = ctf[rt, a_t : a_t + width]
                    step_cp = cpf[rp, a_p : a_p + width]
                    _step_changes(step_ct, step_cp, compared, n_change, bins_d, scores)
                    _step_sums(step_ct, step_cp, compared[:width], sums)
                for i in range(width):
                    if accumulate:
                        hist[0, bins_t[i]] += np.uint32(1)
                        hist[1, bins_p[i]] += np.uint32(1)
                        change_counts[bins_d[i]] += 1
                        if scores[i] >= threshold:
                            _offer(top_scores, top_keys, m, scores[i], p * n + q0 + i)
                            threshold = top_scores[m - 1]
                    if refine:
                        # written out for each day: the same code as a helper (inline="always")
                        # makes the whole scan several times slower
                        slot = lookup[0, bins_t[i]]
                        if slot >= 0:
                            j = fill[slot]
                            if j < caps[slot]:
                                values[offsets[slot] + j] = keys_t[i]
                            fill[slot] = j + 1
                        slot = lookup[1, bins_p[i]]
                        if slot >= 0:
                            j = fill[slot]
                            if j < caps[slot]:
                                values[offsets[slot] + j] = keys_p[i]
                            fill[slot] = j + 1
        if accumulate:
            row_sums[p, :] = sums
            rows_since_flush += 1
            if rows_since_flush >= flush_every:
                _flush(hist, hist_total)
                rows_since_flush = 0
    if accumulate:
        _flush(hist, hist_total)


@numba.njit(cache=True, nogil=True)
def _scan_accumulate(inputs, rows, outputs, collect):  # pragma: no cover - compiled
    _scan_body(True, False, inputs, rows, outputs, collect)


@numba.njit(cache=True, nogil=True)
def _scan_collect(inputs, rows, outputs, collect):  # pragma: no cover - compiled
    _scan_body(False, True, inputs, rows, outputs, collect)


def _runs(ti: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of common symbols over which both index maps advance by one: ``(start, off_t,
    off_p)``, run ``r`` is ``q`` in ``[start[r], start[r + 1])`` with ``ti[q] = q + off_t[r]``
    and ``pi[q] = q + off_p[r]`` (one run when neither day has a symbol the other lacks; a few
    more per symbol that entered or left; none when no symbol is common)."""
    if ti.size == 0:
        empty = np.zeros(0, np.int64)
        return np.zeros(1, np.int64), empty, empty.copy()
    q = np.arange(ti.size, dtype=np.int64)
    off_t, off_p = ti - q, pi - q
    bounds = np.flatnonzero((np.diff(off_t) != 0) | (np.diff(off_p) != 0)) + 1
    start = np.concatenate(([0], bounds, [ti.size])).astype(np.int64)
    return start, off_t[start[:-1]].copy(), off_p[start[:-1]].copy()


def _scan_rows(
    ct: np.ndarray,
    ctf: np.ndarray,
    ot: np.ndarray,
    cp: np.ndarray,
    cpf: np.ndarray,
    op: np.ndarray,
    row0_t: int,
    row0_p: int,
    ti: np.ndarray,
    pi: np.ndarray,
    runs: tuple[np.ndarray, np.ndarray, np.ndarray],
    row_list: np.ndarray,
    min_overlap: int,
    accumulate: bool,
    refine: bool,
    row_sums: np.ndarray,
    hist: np.ndarray,
    hist_total: np.ndarray,
    change_counts: np.ndarray,
    top_scores: np.ndarray,
    top_keys: np.ndarray,
    lookup: np.ndarray,
    offsets: np.ndarray,
    caps: np.ndarray,
    fill: np.ndarray,
    values: np.ndarray,
) -> None:
    """Rows ``p`` in ``row_list`` (one chunk's rows of a block, ascending), pairs ``q > p``
    of common symbols; ``ctf``/``cpf`` the corr rows ``row0_t ..`` / ``row0_p ..`` (``ct``/``cp``
    their uint32 views) and ``ot``/``op`` the overlap rows, values gathered through ``ti`` /
    ``pi`` as the ``runs`` (:func:`_runs`) give them. All outputs are this chunk's own (no
    sharing between threads; GIL-free).

    ``accumulate``: ``row_sums[p]`` (count, Σct, Σcp, Σ|ct|, Σ|cp|, ΣΔ, Σ|Δ| of row ``p``), the
    two histograms of the top 16 key bits (``hist``, uint32, 2 x (2^16 + 1) ≈ 512 KiB:
    cache-resident, added into the int64 ``hist_total`` before it could overflow and at the
    end), the Δ counts and the running top-M ``top_scores`` / ``top_keys`` (pairs arrive in
    increasing key order). The last bin of ``hist`` and of ``change_counts`` counts the pairs
    not compared (the caller ignores it). ``refine``: each key of day ``d`` whose top-16-bit
    bin has ``lookup[d, bin] = slot >= 0`` (``lookup[d, 2^16] = −1``) is appended to ``values[offsets[slot] : offsets[slot] + caps[slot]]`` (``fill[slot]`` counts
    them all, also those beyond the capacity, which are dropped: the caller sees the overflow).
    """
    if accumulate == refine:
        raise ValueError("a read either accumulates or collects")
    kernel = _scan_accumulate if accumulate else _scan_collect
    kernel(
        (ct, ctf, ot, cp, cpf, op),
        (row0_t, row0_p, ti, pi, row_list, min_overlap, *runs),
        (row_sums, hist, hist_total, change_counts, top_scores, top_keys),
        (lookup, offsets, caps, fill, values),
    )


@numba.njit(cache=True, nogil=True)
def _flush(hist, hist_total):  # pragma: no cover - compiled
    """``hist_total += hist; hist = 0``."""
    for d in range(hist.shape[0]):
        for b in range(hist.shape[1]):
            hist_total[d, b] += hist[d, b]
            hist[d, b] = 0


def _four_histograms(counts: np.ndarray) -> np.ndarray:
    """The top-16-bit histograms of ``DISTRIBUTIONS`` (4 x 2^16) from those of the signed
    correlations of both days (2 x 2^16): the key of ``|x|`` is the key of ``x`` for ``x >= 0``
    (bins ``>= 2^15``) and its mirror ``2^32 − 1 − key`` for ``x < 0``, so
    ``abs[b] = signed[b] + signed[2^16 − 1 − b]`` for ``b >= 2^15`` (0 below)."""
    folded = counts[:, _N_BINS // 2 :] + counts[:, : _N_BINS // 2][:, ::-1]
    absolute = np.concatenate((np.zeros_like(folded), folded), axis=1)
    return np.concatenate((counts, absolute))


def _signed_bins(bins: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The signed-histogram bins ``(day, bin)`` holding the values of the distribution bins
    ``(d, b)`` (for ``|corr|``, ``b`` and its mirror ``2^16 − 1 − b``)."""
    out = {(d, b) if d < 2 else (d - 2, b) for d, b in bins}
    out |= {(d - 2, _N_BINS - 1 - b) for d, b in bins if d >= 2}
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
        if len(bins) > _MAX_SLOTS:
            raise ValueError(f"at most {_MAX_SLOTS} bins (int8 slots)")
        lookup = np.full((2, _N_BINS + 1), -1, np.int8)  # the last: pairs not compared
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
    hist = np.zeros((chunks, 2, _N_BINS + 1), np.uint32)
    scanned_total = np.zeros((chunks, 2, _N_BINS + 1), np.int64)
    hist_total = scanned_total[:, :, :_N_BINS]
    change_counts = np.zeros((chunks, int(change_bins) + 1), np.int64)
    runs = _runs(ti, pi)
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
                _scan_rows(
                    block_t.view(np.uint32),
                    block_t,
                    np.asarray(overlap_today[t0:t1]),
                    block_p.view(np.uint32),
                    block_p,
                    np.asarray(overlap_previous[q0:q1]),
                    t0,
                    q0,
                    ti,
                    pi,
                    runs,
                    np.arange(p0 + (c - p0) % chunks, p1, chunks),
                    int(min_overlap),
                    accumulate,
                    len(collect.bins) > 0,
                    row_sums,
                    hist[c],
                    scanned_total[c],
                    change_counts[c],
                    top_scores[c],
                    top_keys[c],
                    collect.lookup,
                    collect.offsets[c],
                    collect.caps[c],
                    collect.fill[c],
                    collect.values[c],
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
        # at most _MAX_SLOTS bins per read
        collected: dict[tuple[int, int], np.ndarray] = {}
        for first in range(0, len(needed), _MAX_SLOTS):
            group = needed[first : first + _MAX_SLOTS]
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
            mirror = collected[(d - 2, _N_BINS - 1 - b)]
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
        change_counts=change_counts[:, :-1].sum(axis=0),
        change_edges=np.linspace(-2.0, 2.0, int(change_bins) + 1),
        top_p=tp,
        top_q=tq,
        top_corr_today=top_corr_today,
        top_corr_previous=top_corr_previous,
        top_overlap_today=np.asarray(overlap_today[rows_t, cols_t], dtype=np.int64),
        top_overlap_previous=np.asarray(overlap_previous[rows_p, cols_p], dtype=np.int64),
        top_change=top_corr_today.astype(np.float64) - top_corr_previous.astype(np.float64),
    )


# ------------------------------------------------------------------------------------------------
# neighbor turnover
# ------------------------------------------------------------------------------------------------


def neighbor_turnover(
    match: SymbolMatch,
    index_today: np.ndarray,
    index_previous: np.ndarray,
    *,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
) -> tuple[np.ndarray, np.ndarray]:
    """Per common symbol ``p``: ``(n_today[p], n_new[p])``, the number of its neighbors today
    (``index_today`` row, −1 padding excluded) and how many of them were not among its previous
    neighbors (``index_previous`` row), compared by name. Both int64 of ``len(match.common)``.

    ``index_today`` (N_today × k) and ``index_previous`` (N_previous × k') are the top-k arrays of
    SPEC §4 (−1 = padding); k and k' may differ.
    """
    it = check_array(np.asarray(index_today), "index_today", np.integer, ndim=2)
    ip = check_array(np.asarray(index_previous), "index_previous", np.integer, ndim=2)
    check_working_memory(working_memory_mb)
    n = len(match.common)
    n_today = np.zeros(n, np.int64)
    n_new = np.zeros(n, np.int64)
    k_t, k_p = it.shape[1], ip.shape[1]
    # previous neighbors in today's index space (a symbol that left: −1, never equal to a
    # today neighbor, which is >= 0)
    to_today = np.append(match.previous_to_today, -1)  # index −1 (padding) → −1
    for p0, p1 in row_blocks(n, max(1, k_t * k_p) * 2 + 16 * (k_t + k_p), working_memory_mb):
        t = it[match.today_index[p0:p1]].astype(np.int64)
        prev = to_today[ip[match.previous_index[p0:p1]]]
        valid = t >= 0
        seen = (t[:, :, None] == prev[:, None, :]).any(axis=2)
        n_today[p0:p1] = valid.sum(axis=1)
        n_new[p0:p1] = (valid & ~seen).sum(axis=1)
    return n_today, n_new


# ------------------------------------------------------------------------------------------------
# cluster migrations
# ------------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------
# lead-lag changes
# ------------------------------------------------------------------------------------------------


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
