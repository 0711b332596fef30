"""corr_pipeline.compute.changes (SPEC §10) against brute-force references built with pandas and
plain loops, on small universes whose symbol sets differ between the two days."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from corr_pipeline.compute import pairwise_correlation, top_k_neighbors
from corr_pipeline.compute.changes import (
    DISTRIBUTIONS,
    cluster_migrations,
    correlation_changes,
    lead_lag_changes,
    match_symbols,
    neighbor_turnover,
)
from corr_pipeline.compute.changes.drift import FINE_PER_BIN
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE

LEVELS = (0.0, 0.01, 0.25, 0.5, 0.9, 1.0)


def _distribution_columns(f):
    """The reference frame's columns of the four distributions of SPEC §10.1."""
    return {
        "corr_today": f.ct,
        "corr_previous": f.cp,
        "abs_corr_today": f.ct.abs(),
        "abs_corr_previous": f.cp.abs(),
    }


def _names(rng: np.random.Generator, n: int, pool: int) -> list[str]:
    """``n`` distinct names drawn from a pool of ``pool``, sorted (code points, as SPEC §2)."""
    return sorted(f"S{i:03d}" for i in rng.choice(pool, n, replace=False))


def _day(rng: np.random.Generator, symbols: list[str], *, ties: bool = False):
    """corr and overlap of a random ragged universe (the pipeline's own correlation)."""
    T, n = 60, len(symbols)
    R = rng.standard_normal((T, n)).astype(np.float32) + rng.standard_normal((T, 1)).astype(
        np.float32
    )
    R[rng.random((T, n)) < 0.15] = np.nan
    R[: int(rng.integers(0, 40)), rng.integers(0, n)] = np.nan  # a late listing
    out = pairwise_correlation(R, min_overlap=20)
    corr, overlap = out.corr, out.overlap
    if ties:  # coarse values: many equal |Δ|, +x / -x
        corr = np.round(corr * 4) / 4
        corr = np.where(np.isfinite(corr), corr, np.nan).astype(np.float32)
    return corr, overlap


def _pairs_frame(symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p) -> pd.DataFrame:
    """Every pair of common symbols (a < b by name), by plain loops over names."""
    pos_t = {s: i for i, s in enumerate(symbols_t)}
    pos_p = {s: i for i, s in enumerate(symbols_p)}
    common = sorted(set(symbols_t) & set(symbols_p))
    rows = []
    for x, a in enumerate(common):
        for b in common[x + 1 :]:
            i, j, k, m = pos_t[a], pos_t[b], pos_p[a], pos_p[b]
            rows.append(
                (a, b, float(corr_t[i, j]), float(corr_p[k, m]), int(ov_t[i, j]), int(ov_p[k, m]))
            )
    frame = pd.DataFrame(rows, columns=["a", "b", "ct", "cp", "ot", "op"])
    return frame.astype({"ct": float, "cp": float, "ot": int, "op": int})


def _reference(frame: pd.DataFrame, min_overlap: int, top_m: int, bins: int):
    ok = (
        np.isfinite(frame.ct)
        & np.isfinite(frame.cp)
        & (frame.ot >= min_overlap)
        & (frame.op >= min_overlap)
    )
    f = frame[ok].copy()
    f["d"] = f.ct - f.cp
    f["ad"] = f.d.abs()
    top = f.sort_values(["ad", "a", "b"], ascending=[False, True, True], kind="mergesort")
    counts = np.zeros(bins, np.int64)
    for d in f.d:
        counts[min(bins - 1, max(0, math.floor((d + 2.0) * bins / 4.0)))] += 1
    return f, top.head(top_m), counts


def _check(symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p, *, min_overlap, top_m, budget):
    match = match_symbols(symbols_t, symbols_p)
    got = correlation_changes(
        corr_t,
        ov_t,
        corr_p,
        ov_p,
        match.today_index,
        match.previous_index,
        min_overlap=min_overlap,
        top_m=top_m,
        quantiles=LEVELS,
        change_bins=16,
        working_memory_mb=budget,
    )
    frame = _pairs_frame(symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p)
    f, top, counts = _reference(frame, min_overlap, top_m, 16)
    assert got.n_pairs == len(f)
    np.testing.assert_array_equal(got.change_counts, counts)
    fine = _reference(frame, min_overlap, top_m, 16 * FINE_PER_BIN)[2]
    np.testing.assert_array_equal(got.fine_change_counts, fine)
    np.testing.assert_array_equal(got.fine_change_edges, np.linspace(-2, 2, fine.size + 1))
    columns = _distribution_columns(f)
    for name in DISTRIBUTIONS:
        if len(f):
            np.testing.assert_allclose(
                got.quantiles[name], np.quantile(columns[name], LEVELS), rtol=0, atol=1e-12
            )
            assert got.means[name] == pytest.approx(columns[name].mean(), abs=1e-12)
        else:
            assert np.isnan(got.quantiles[name]).all() and math.isnan(got.means[name])
    if len(f):
        assert got.means["abs_change"] == pytest.approx(f.ad.mean(), abs=1e-12)
        assert got.means["change"] == pytest.approx(f.d.mean(), abs=1e-12)
    names = [(match.common[p], match.common[q]) for p, q in zip(got.top_p, got.top_q, strict=True)]
    assert names == list(zip(top.a, top.b, strict=True))
    np.testing.assert_array_equal(got.top_corr_today, top.ct.to_numpy(np.float32))
    np.testing.assert_array_equal(got.top_corr_previous, top.cp.to_numpy(np.float32))
    np.testing.assert_array_equal(got.top_overlap_today, top.ot.to_numpy())
    np.testing.assert_array_equal(got.top_overlap_previous, top.op.to_numpy())
    np.testing.assert_array_equal(got.top_change, top.d.to_numpy())
    return got


@pytest.mark.parametrize("seed", range(6))
def test_correlation_changes_match_pandas(seed):
    rng = np.random.default_rng(seed)
    symbols_t, symbols_p = _names(rng, 40, 55), _names(rng, 38, 55)  # differing sets
    corr_t, ov_t = _day(rng, symbols_t, ties=seed % 2 == 1)
    corr_p, ov_p = _day(rng, symbols_p, ties=seed % 2 == 1)
    budget = float(rng.choice([1e-4, 0.01, 64]))  # 1 row per block up to all rows
    got = _check(
        symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p, min_overlap=25, top_m=30, budget=budget
    )
    assert got.n_pairs > 100


def test_ties_go_to_the_smaller_pair_by_name():
    # every pair moves by exactly 0.5: the top M are the first M pairs in name order
    symbols = ["A", "B", "C", "D", "E"]
    today = np.full((5, 5), 0.75, np.float32)
    prev = np.full((5, 5), 0.25, np.float32)
    prev[1, 3] = prev[3, 1] = 1.0  # (B, D) moves by -0.25, ranks last
    np.fill_diagonal(today, 1.0)
    np.fill_diagonal(prev, 1.0)
    ov = np.full((5, 5), 50, np.int16)
    got = _check(symbols, today, ov, symbols, prev, ov, min_overlap=30, top_m=4, budget=64)
    assert [(got.top_p[i], got.top_q[i]) for i in range(4)] == [(0, 1), (0, 2), (0, 3), (0, 4)]


def test_no_common_pairs_and_empty_top():
    rng = np.random.default_rng(7)
    corr_t, ov_t = _day(rng, ["A", "B", "C"])
    corr_p, ov_p = _day(rng, ["C", "D", "E"])
    got = _check(
        ["A", "B", "C"],
        corr_t,
        ov_t,
        ["C", "D", "E"],
        corr_p,
        ov_p,
        min_overlap=20,
        top_m=5,
        budget=1,
    )
    assert got.n_pairs == 0 and got.top_p.size == 0


def test_min_overlap_applies_to_both_days():
    symbols = ["A", "B", "C"]
    corr = np.array([[1, 0.5, 0.2], [0.5, 1, -0.3], [0.2, -0.3, 1]], np.float32)
    ov_t = np.full((3, 3), 40, np.int16)
    ov_p = ov_t.copy()
    ov_p[0, 1] = ov_p[1, 0] = 29  # (A, B) fails on the previous day only
    got = _check(symbols, corr, ov_t, symbols, -corr, ov_p, min_overlap=30, top_m=10, budget=1)
    assert got.n_pairs == 2


def test_match_symbols_by_name():
    m = match_symbols(["B", "C", "E", "F"], ["A", "B", "C", "D", "F"])
    assert m.common == ["B", "C", "F"]
    assert m.today_index.tolist() == [0, 1, 3] and m.previous_index.tolist() == [1, 2, 4]
    assert m.entered.tolist() == [2] and m.left.tolist() == [0, 3]
    assert m.previous_to_today.tolist() == [-1, 0, 1, -1, 3]
    with pytest.raises(ValueError, match="duplicates"):
        match_symbols(["A", "A"], ["A"])


def test_unsorted_index_maps_are_refused():
    corr = np.eye(3, dtype=np.float32)
    ov = np.full((3, 3), 40, np.int16)
    with pytest.raises(ValueError, match="strictly increasing"):
        correlation_changes(corr, ov, corr, ov, np.array([1, 0]), np.array([0, 1]), min_overlap=2)
    with pytest.raises(TypeError, match="float32"):
        correlation_changes(corr.astype(np.float64), ov, corr, ov, [0], [0], min_overlap=2)


# --------------------------------------------------------------------------------------------
# neighbor turnover
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_neighbor_turnover_matches_sets_of_names(seed):
    rng = np.random.default_rng(100 + seed)
    symbols_t, symbols_p = _names(rng, 30, 40), _names(rng, 33, 40)
    corr_t, _ = _day(rng, symbols_t, ties=True)
    corr_p, _ = _day(rng, symbols_p, ties=True)
    k_t, k_p = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    nt = top_k_neighbors(corr_t, k=k_t).index
    np_ = top_k_neighbors(corr_p, k=k_p).index
    match = match_symbols(symbols_t, symbols_p)
    n_today, n_new = neighbor_turnover(match, nt, np_, working_memory_mb=1e-4)
    for p, name in enumerate(match.common):
        today = {symbols_t[j] for j in nt[symbols_t.index(name)] if j >= 0}
        before = {symbols_p[j] for j in np_[symbols_p.index(name)] if j >= 0}
        assert n_today[p] == len(today)
        assert n_new[p] == len(today - before)


# --------------------------------------------------------------------------------------------
# cluster migrations
# --------------------------------------------------------------------------------------------


def _brute_force_matching(table: np.ndarray) -> tuple[int, list[dict[int, int]]]:
    """The best total overlap over every one-to-one matching of rows to columns, and every
    matching (as {row: column} of its positive pairs) that reaches it."""
    k_t, k_p = table.shape
    best, winners = -1, []
    size = min(k_t, k_p)
    for rows in itertools.combinations(range(k_t), size):
        for cols in itertools.permutations(range(k_p), size):
            total = sum(table[r, c] for r, c in zip(rows, cols, strict=True))
            pairs = {r: c for r, c in zip(rows, cols, strict=True) if table[r, c] > 0}
            if total > best:
                best, winners = total, [pairs]
            elif total == best and pairs not in winners:
                winners.append(pairs)
    return best, winners


def _reference_migrations(lt, lp, match, min_members):
    frame = pd.DataFrame(
        {"symbol": match.common, "a": lt[match.today_index], "b": lp[match.previous_index]}
    )
    k_t, k_p = int(lt.max()) + 1, int(lp.max()) + 1
    table = pd.crosstab(frame.a, frame.b).reindex(
        index=range(k_t), columns=range(k_p), fill_value=0
    )
    table_o = table.to_numpy()
    main_source = [
        int(np.argmax(table_o[a])) if table_o[a].any() else -1 for a in range(k_t)
    ]  # argmax: first maximum = smaller id
    main_dest = [int(np.argmax(table_o[:, b])) if table_o[:, b].any() else -1 for b in range(k_p)]
    split = [
        sum(1 for a in range(k_t) if main_source[a] == b and table_o[a, b] >= min_members) >= 2
        for b in range(k_p)
    ]
    merged = [
        sum(1 for b in range(k_p) if main_dest[b] == a and table_o[a, b] >= min_members) >= 2
        for a in range(k_t)
    ]
    return table_o, main_source, main_dest, split, merged


def _check_migrations(lt, lp, symbols_t, symbols_p, min_members=2):
    match = match_symbols(symbols_t, symbols_p)
    got = cluster_migrations(lt, lp, match, min_members=min_members)
    table_o, main_source, main_dest, split, merged = _reference_migrations(
        lt, lp, match, min_members
    )
    best, winners = _brute_force_matching(table_o)
    ours = {a: int(b) for a, b in enumerate(got.match_today) if b >= 0}
    assert sum(table_o[a, b] for a, b in ours.items()) == best
    assert ours in winners
    for a, b in ours.items():
        assert got.match_previous[b] == a and got.shared[a] == table_o[a, b]
    assert all(
        got.match_previous[b] == -1 for b in range(table_o.shape[1]) if b not in ours.values()
    )
    assert got.main_source.tolist() == main_source
    assert got.main_destination.tolist() == main_dest
    assert got.split.tolist() == split and got.merged.tolist() == merged
    assert got.size_today.tolist() == np.bincount(lt).tolist()
    assert got.size_previous.tolist() == np.bincount(lp).tolist()
    moved = [
        ours.get(int(lt[symbols_t.index(s)]), -1) != lp[symbols_p.index(s)] for s in match.common
    ]
    assert got.moved.tolist() == moved
    return got, winners


def test_clusters_split_and_merge_by_construction():
    symbols = [f"S{i:02d}" for i in range(20)]
    # previous: {0..9} one cluster (0), {10..15} (1), {16..19} (2)
    lp = np.array([0] * 10 + [1] * 6 + [2] * 4)
    # today: {0..5} (0) and {6..9} (1) split from 0; {10..19} (2) merges 1 and 2
    lt = np.array([0] * 6 + [1] * 4 + [2] * 10)
    got, winners = _check_migrations(lt, lp, symbols, symbols)
    assert len(winners) == 1
    assert got.match_today.tolist() == [0, -1, 1]  # 0 keeps its identity, 1 appeared
    assert got.match_previous.tolist() == [0, 2, -1]  # previous 2 vanished (merged into 2)
    assert got.shared.tolist() == [6, 0, 6]
    assert got.split.tolist() == [True, False, False]
    assert got.merged.tolist() == [False, False, True]
    assert [s for s, m in zip(symbols, got.moved, strict=True) if m] == symbols[6:10] + symbols[16:]


def test_clusters_with_entering_and_leaving_symbols():
    symbols_p = ["A", "B", "C", "D", "E", "F"]
    symbols_t = ["B", "C", "D", "E", "G", "H"]
    lp = np.array([0, 0, 1, 1, 2, 2])  # cluster 2 = {E, F}; F leaves
    lt = np.array([0, 0, 1, 2, 3, 3])  # {G, H} entered: cluster 3 has no common member
    got, _ = _check_migrations(lt, lp, symbols_t, symbols_p)
    assert got.match_today[3] == -1 and got.size_today[3] == 2


@pytest.mark.parametrize("seed", range(25))
def test_cluster_migrations_random_against_brute_force(seed):
    rng = np.random.default_rng(200 + seed)
    symbols_t, symbols_p = _names(rng, 14, 18), _names(rng, 13, 18)

    def labels(n: int) -> np.ndarray:
        raw = rng.integers(0, int(rng.integers(1, 6)), n)
        _, first = np.unique(raw, return_index=True)
        order = np.argsort(first)  # 0..K-1 by first appearance, all used
        return np.argsort(order)[np.unique(raw, return_inverse=True)[1]]

    _check_migrations(
        labels(len(symbols_t)),
        labels(len(symbols_p)),
        symbols_t,
        symbols_p,
        int(rng.integers(1, 3)),
    )


# --------------------------------------------------------------------------------------------
# lead-lag changes
# --------------------------------------------------------------------------------------------


def _pairs(rows: list[tuple[int, int, int]]) -> np.ndarray:
    out = np.zeros(len(rows), LEAD_LAG_DTYPE)
    for i, (a, b, lag) in enumerate(rows):
        out[i]["leader"], out[i]["lagger"], out[i]["lag"] = a, b, lag
    return out


@pytest.mark.parametrize("seed", range(10))
def test_lead_lag_changes_match_dicts_of_names(seed):
    rng = np.random.default_rng(300 + seed)
    symbols_t, symbols_p = _names(rng, 12, 16), _names(rng, 11, 16)

    def random_pairs(n: int) -> np.ndarray:
        seen: dict[tuple[int, int], int] = {}
        for _ in range(40):
            a, b = rng.choice(n, 2, replace=False)
            seen.setdefault((int(a), int(b)), int(rng.integers(1, 4)))
        return _pairs([(a, b, lag) for (a, b), lag in seen.items()])

    pt, pp = random_pairs(len(symbols_t)), random_pairs(len(symbols_p))
    match = match_symbols(symbols_t, symbols_p)
    got = lead_lag_changes(pt, pp, match, len(symbols_t))
    common = set(match.common)
    today = {
        (symbols_t[r["leader"]], symbols_t[r["lagger"]]): (i, int(r["lag"]))
        for i, r in enumerate(pt)
        if symbols_t[r["leader"]] in common and symbols_t[r["lagger"]] in common
    }
    before = {
        (symbols_p[r["leader"]], symbols_p[r["lagger"]]): (i, int(r["lag"]))
        for i, r in enumerate(pp)
        if symbols_p[r["leader"]] in common and symbols_p[r["lagger"]] in common
    }
    assert got.appeared.tolist() == sorted(today[k][0] for k in today.keys() - before.keys())
    assert got.vanished.tolist() == sorted(before[k][0] for k in before.keys() - today.keys())
    changed = sorted(
        (today[k][0], before[k][0])
        for k in today.keys() & before.keys()
        if today[k][1] != before[k][1]
    )
    assert (
        list(zip(got.changed_today.tolist(), got.changed_previous.tolist(), strict=True)) == changed
    )


def test_results_do_not_depend_on_the_chunks_or_the_blocks(monkeypatch):
    import corr_pipeline.compute.changes.drift as module

    rng = np.random.default_rng(42)
    symbols_t, symbols_p = _names(rng, 60, 70), _names(rng, 62, 70)
    corr_t, ov_t = _day(rng, symbols_t, ties=True)
    corr_p, ov_p = _day(rng, symbols_p, ties=True)
    match = match_symbols(symbols_t, symbols_p)
    runs = []
    for chunks, budget in ((1, 64), (4, 64), (4, 1e-4), (1, 1e-3)):
        monkeypatch.setattr(module, "_MAX_CHUNKS", chunks)
        args = (corr_t, ov_t, corr_p, ov_p, match.today_index, match.previous_index)
        runs.append(correlation_changes(*args, min_overlap=25, top_m=40, working_memory_mb=budget))
    for other in runs[1:]:
        assert other.means == runs[0].means  # bit for bit
        for name in DISTRIBUTIONS:
            np.testing.assert_array_equal(other.quantiles[name], runs[0].quantiles[name])
        np.testing.assert_array_equal(other.change_counts, runs[0].change_counts)
        np.testing.assert_array_equal(other.top_p, runs[0].top_p)
        np.testing.assert_array_equal(other.top_q, runs[0].top_q)


@pytest.mark.parametrize("many_levels", [False, True])
def test_quantiles_are_numpys_from_the_two_reads(monkeypatch, many_levels):
    """The first read counts, the second collects the keys of exactly the needed bins (one
    more read per 127 bins when many levels need more): exactly numpy's quantiles, every row
    read once per read."""
    import corr_pipeline.compute.changes.drift as module

    rng = np.random.default_rng(5)
    symbols_t, symbols_p = _names(rng, 150, 170), _names(rng, 155, 170)
    corr_t, ov_t = _day(rng, symbols_t)
    corr_p, ov_p = _day(rng, symbols_p)
    if not many_levels:
        # values on a 1/32 grid: few, densely filled bins (as in a large universe), many ties
        corr_t, corr_p = (
            np.round(c * 32).astype(np.float32) / np.float32(32) for c in (corr_t, corr_p)
        )
    corr_t[3, :] = corr_t[:, 3] = -0.0  # negative zeros: |x| of -0.0 is the key of +0.0
    calls: list[tuple[bool, bool, int]] = []  # accumulate, refine, rows
    scan = module.scan_rows

    def spy(inputs, rows, totals, collect, *, accumulate):
        # refine: the read collects keys (its collect record has bins)
        calls.append((accumulate, collect.offsets.size > 0, len(rows.row_list)))
        return scan(inputs, rows, totals, collect, accumulate=accumulate)

    monkeypatch.setattr(module, "scan_rows", spy)
    levels = (0.003, 0.01, 0.25, 0.5, 0.77, 0.99)  # the extremes: the other tests
    if many_levels:  # hundreds of needed bins: more than one read collects
        levels = tuple(np.linspace(0.0, 1.0, 201)[1:-1])
    match = match_symbols(symbols_t, symbols_p)
    got = correlation_changes(
        corr_t, ov_t, corr_p, ov_p, match.today_index, match.previous_index,
        min_overlap=25, top_m=5, quantiles=levels, working_memory_mb=0.05,
    )  # fmt: skip
    f, _, _ = _reference(_pairs_frame(symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p), 25, 5, 80)
    assert got.n_pairs == len(f) > 5000
    columns = _distribution_columns(f)
    for name in DISTRIBUTIONS:
        np.testing.assert_array_equal(got.quantiles[name], np.quantile(columns[name], levels))
    n = len(match.common)
    assert sum(rows for accumulate, _, rows in calls if accumulate) == n
    collect_reads = sum(rows for accumulate, _, rows in calls if not accumulate) / n
    assert (collect_reads > 1) == many_levels and collect_reads == int(collect_reads)
    assert all(refine != accumulate for accumulate, refine, _ in calls)


def _adversarial_values(rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 values with many ties, ±0, ±1, subnormals, the smallest steps around them."""
    pool = np.array([-1.0, -0.0, 0.0, 1.0, 0.5, -0.5, 1e-45, -1e-45, 1.2e-38, -1.2e-38], np.float32)
    pool = np.concatenate(
        (pool, np.nextafter(pool, np.float32(2)), np.nextafter(pool, np.float32(-2)))
    )
    values = rng.choice(pool, size)
    spread = rng.random(size) < 0.2  # and some distinct values in between
    values[spread] = rng.uniform(-1, 1, int(spread.sum()))
    return values.astype(np.float32)


@pytest.mark.parametrize("seed", range(4))
def test_select_places_the_wanted_ranks_as_a_sort(seed):
    """The one-partition selection of a bin's ranks gives exactly the sorted keys there, on
    adversarial values (ties, ±0, ±1, subnormals) and rank sets (first, last, neighbours)."""
    from corr_pipeline.compute.changes.drift import _from_key, _select

    rng = np.random.default_rng(seed)
    values = _adversarial_values(rng, int(rng.integers(1, 3000)))
    keys = values.view(np.uint32)
    keys = np.where(keys & np.uint32(0x80000000), ~keys, keys | np.uint32(0x80000000))
    keys = keys.astype(np.uint32)
    np.testing.assert_array_equal(_from_key(keys).view(np.uint32), values.view(np.uint32))
    n = keys.size
    reference = np.sort(keys)
    for kth in ([0], [n - 1], sorted({0, n - 1}), sorted(set(rng.integers(0, n, 9).tolist()))):
        kth = sorted({int(k) for k in kth} | {min(k + 1, n - 1) for k in kth})
        got = _select(keys.copy(), kth)
        np.testing.assert_array_equal(got[kth], reference[kth])
        np.testing.assert_array_equal(np.sort(got), reference)  # a permutation of the keys


def test_quantiles_of_adversarial_values_are_numpys():
    """Quantiles (by the partition of the needed bins) exactly numpy's when the values are
    ties, ±0, ±1, subnormals and NaN: every level, including 0 and 1."""
    rng = np.random.default_rng(17)
    symbols_t, symbols_p = _names(rng, 90, 100), _names(rng, 95, 100)
    days = []
    for symbols in (symbols_t, symbols_p):
        n = len(symbols)
        upper = np.triu(np.ones((n, n), bool), 1)
        corr = np.zeros((n, n), np.float32)
        corr[upper] = _adversarial_values(rng, int(upper.sum()))
        corr[upper & (rng.random((n, n)) < 0.05)] = np.nan
        corr.T[upper] = corr[upper]  # symmetric, -0.0 kept
        overlap = rng.integers(15, 60, (n, n)).astype(np.int16)
        overlap = np.minimum(overlap, overlap.T)
        days.append((corr.astype(np.float32), overlap))
    (corr_t, ov_t), (corr_p, ov_p) = days
    match = match_symbols(symbols_t, symbols_p)
    levels = (0.0, 0.001, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999, 1.0)
    got = correlation_changes(
        corr_t, ov_t, corr_p, ov_p, match.today_index, match.previous_index,
        min_overlap=20, top_m=3, quantiles=levels,
    )  # fmt: skip
    f, _, _ = _reference(_pairs_frame(symbols_t, corr_t, ov_t, symbols_p, corr_p, ov_p), 20, 3, 80)
    assert got.n_pairs == len(f) > 2000
    for name, column in _distribution_columns(f).items():
        np.testing.assert_array_equal(got.quantiles[name], np.quantile(column, levels))


@pytest.mark.parametrize(
    "today, previous",
    [
        (["A", "B", "C", "D"], ["E", "F", "G"]),  # a re-keyed universe: nothing in common
        (["A", "B", "C", "D"], ["D", "E", "F"]),  # one symbol in common
        (["B", "D"], ["A", "B", "C", "D", "E", "F"]),  # shrunk to a handful
        ([], ["A", "B"]),  # nothing left at all
    ],
    ids=["disjoint", "one-common", "shrunk", "empty"],
)
def test_universes_with_few_or_no_common_symbols(today, previous):
    """What can be compared is: entered and left by name, the pairs of common symbols (the
    pandas reference of ``_check``), turnover and migrations of the common symbols; nothing
    raises where nothing is common."""
    rng = np.random.default_rng(3)
    corr_t, ov_t = _day(rng, today) if len(today) > 1 else _eye(len(today))
    corr_p, ov_p = _day(rng, previous)
    _check(today, corr_t, ov_t, previous, corr_p, ov_p, min_overlap=20, top_m=5, budget=1)
    common = sorted(set(today) & set(previous))
    match = match_symbols(today, previous)
    assert match.common == common
    assert [today[i] for i in match.entered] == sorted(set(today) - set(previous))
    assert [previous[i] for i in match.left] == sorted(set(previous) - set(today))

    # every symbol's neighbors: the next two symbols of its own day (by position, cyclic)
    def ring(n: int) -> np.ndarray:
        return (np.arange(n)[:, None] + np.array([1, 2])[None, :]) % max(n, 1)

    kept, new = neighbor_turnover(match, ring(len(today)), ring(len(previous)))
    for x, name in enumerate(common):
        mine = [today[j] for j in ring(len(today))[today.index(name)]]
        before = {previous[j] for j in ring(len(previous))[previous.index(name)]}
        assert (kept[x], new[x]) == (len(mine), sum(m not in before for m in mine))
    assert kept.shape == new.shape == (len(common),)

    migrations = cluster_migrations(
        np.zeros(len(today), np.int64), np.zeros(len(previous), np.int64), match
    )
    assert int(np.sum(migrations.moved)) == 0  # one cluster each day: nobody moves

    pairs_t = np.zeros(0, LEAD_LAG_DTYPE)
    pairs_p = np.zeros(1, LEAD_LAG_DTYPE)
    pairs_p["leader"], pairs_p["lagger"] = 0, 1
    lead_lag_changes(pairs_t, pairs_p, match, len(today))


def _eye(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.eye(n, dtype=np.float32), np.full((n, n), 60, np.int16)
