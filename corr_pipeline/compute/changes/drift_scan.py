"""The scan behind :func:`corr_pipeline.compute.changes.drift.correlation_changes`: GIL-free
numba kernels over the pairs of common symbols, row by row, in runs of contiguous columns
(see :mod:`corr_pipeline.compute.changes`)."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from corr_pipeline.compute.top_k import offer

HIGH_SHIFT = 16  # 32-bit keys: histograms of their top 16 bits
N_BINS = 1 << HIGH_SHIFT
#: Bins whose keys one read collects (int8 slots of the lookup table).
MAX_SLOTS = 127


_STEP = 512
"""Pairs per step of a row's run: the vector passes write their keys and bins to buffers
(L1-resident) that the scalar pass then counts."""


@numba.njit(cache=True, nogil=True, inline="always")
def _step_keys(
    ct, ot, cp, op, min_overlap, keys_t, keys_p, bins_t, bins_p, compared
):  # pragma: no cover - compiled
    """Per pair of the step: compared or not, both keys, and the top-16-bit bins of the keys
    (bin ``N_BINS``, which counts nowhere, when not compared). Branch-free: vectorised."""
    exponent = np.uint32(0x7F800000)
    sign = np.uint32(0x80000000)
    trash = np.uint32(N_BINS)
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
        bins_t[i] = (k0 >> np.uint32(HIGH_SHIFT)) if ok else trash
        bins_p[i] = (k1 >> np.uint32(HIGH_SHIFT)) if ok else trash
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
def _scan_body(accumulate, refine, inputs, rows, outputs, collect):  # pragma: no cover - compiled
    """The loop of :func:`scan_rows` (its arguments grouped in four tuples), inlined into one
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
                            offer(top_scores, top_keys, m, scores[i], p * n + q0 + i)
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
                flush(hist, hist_total)
                rows_since_flush = 0
    if accumulate:
        flush(hist, hist_total)


@numba.njit(cache=True, nogil=True)
def _scan_accumulate(inputs, rows, outputs, collect):  # pragma: no cover - compiled
    _scan_body(True, False, inputs, rows, outputs, collect)


@numba.njit(cache=True, nogil=True)
def _scan_collect(inputs, rows, outputs, collect):  # pragma: no cover - compiled
    _scan_body(False, True, inputs, rows, outputs, collect)


def column_runs(ti: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


class ScanInputs(NamedTuple):
    """One block's rows of both days: ``ctf`` / ``cpf`` the corr rows (``ct`` / ``cp`` their
    uint32 views) and ``ot`` / ``op`` the overlap rows, of today / the previous session."""

    ct: np.ndarray
    ctf: np.ndarray
    ot: np.ndarray
    cp: np.ndarray
    cpf: np.ndarray
    op: np.ndarray


class ScanRows(NamedTuple):
    """Which pairs a chunk reads: the rows ``row_list`` (ascending) of the block whose first
    rows are ``row0_t`` / ``row0_p``, the pairs ``q > p`` of common symbols through the index
    maps ``ti`` / ``pi`` in the runs of :func:`column_runs`; ``min_overlap``."""

    row0_t: int
    row0_p: int
    ti: np.ndarray
    pi: np.ndarray
    row_list: np.ndarray
    min_overlap: int
    run_start: np.ndarray
    run_t: np.ndarray
    run_p: np.ndarray


class ScanTotals(NamedTuple):
    """What a chunk's first read accumulates (see :func:`scan_rows`)."""

    row_sums: np.ndarray
    hist: np.ndarray
    hist_total: np.ndarray
    change_counts: np.ndarray
    top_scores: np.ndarray
    top_keys: np.ndarray


class ScanCollect(NamedTuple):
    """Where a chunk's second read appends the keys of the wanted bins (see
    :func:`scan_rows`)."""

    lookup: np.ndarray
    offsets: np.ndarray
    caps: np.ndarray
    fill: np.ndarray
    values: np.ndarray


def scan_rows(
    inputs: ScanInputs,
    rows: ScanRows,
    totals: ScanTotals,
    collect: ScanCollect,
    *,
    accumulate: bool,
) -> None:
    """The pairs of ``rows`` (one chunk's rows of a block), values read from ``inputs``. All
    outputs are this chunk's own (no sharing between threads; GIL-free).

    ``accumulate`` (the first read) fills ``totals``: ``row_sums[p]`` (count, Σct, Σcp, Σ|ct|,
    Σ|cp|, ΣΔ, Σ|Δ| of row ``p``), the two histograms of the top 16 key bits (``hist``, uint32,
    2 x (2^16 + 1) ≈ 512 KiB: cache-resident, added into the int64 ``hist_total`` before it
    could overflow and at the end), the Δ counts and the running top-M ``top_scores`` /
    ``top_keys`` (pairs arrive in increasing key order). The last bin of ``hist`` and of
    ``change_counts`` counts the pairs not compared (the caller ignores it). Otherwise (the
    second read) each key of day ``d`` whose top-16-bit bin has ``lookup[d, bin] = slot >= 0``
    (``lookup[d, 2^16] = −1``) is appended to ``values[offsets[slot] : offsets[slot] +
    caps[slot]]`` (``fill[slot]`` counts them all, also those beyond the capacity, which are
    dropped: the caller sees the overflow).
    """
    kernel = _scan_accumulate if accumulate else _scan_collect
    kernel(tuple(inputs), tuple(rows), tuple(totals), tuple(collect))


@numba.njit(cache=True, nogil=True)
def flush(hist, hist_total):  # pragma: no cover - compiled
    """``hist_total += hist; hist = 0``."""
    for d in range(hist.shape[0]):
        for b in range(hist.shape[1]):
            hist_total[d, b] += hist[d, b]
            hist[d, b] = 0
