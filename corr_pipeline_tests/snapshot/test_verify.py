"""The verifications of each step (behind the asset checks): they pass on SPEC-conforming arrays built by
brute force here, and each corruption makes the right one fail. Tiles are forced small so the
blockwise code paths (several tiles, ragged edges) are exercised on small matrices."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.matrix_facts import row_counts_above, upper_triangle_facts
from corr_pipeline.snapshot import display, markdown, verify

TINY_MB = 0.02  # forces 64-wide tiles / a few rows per block


def _returns(n_rows: int = 90, n_cols: int = 150, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    factor = rng.standard_normal((n_rows, 1))
    R = (0.6 * factor + rng.standard_normal((n_rows, n_cols))).astype(np.float32)
    R[rng.random(R.shape) < 0.15] = np.nan  # ragged histories
    R[:70, 7] = np.nan  # a short column: overlap below min_overlap with everyone
    return R


def _reference(R: np.ndarray, min_overlap: int) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(R).astype(np.int64)
    overlap = (finite.T @ finite).astype(np.int16)
    corr = pd.DataFrame(R.astype(np.float64)).corr(min_periods=min_overlap).to_numpy()
    corr = corr.astype(np.float32)
    corr = np.triu(corr, 1)
    corr = corr + corr.T  # exact symmetry, NaN kept
    corr[overlap < min_overlap] = np.nan
    np.fill_diagonal(corr, 1.0)
    return corr, overlap


def _brute_top_k(corr: np.ndarray, overlap: np.ndarray, k: int):
    n = corr.shape[0]
    index = np.full((n, k), -1, dtype=np.int32)
    values = np.full((n, k), np.nan, dtype=np.float32)
    ov = np.zeros((n, k), dtype=overlap.dtype)
    for i in range(n):
        cands = [j for j in range(n) if j != i and np.isfinite(corr[i, j])]
        cands.sort(key=lambda j: (-abs(float(corr[i, j])), j))
        for r, j in enumerate(cands[:k]):
            index[i, r], values[i, r], ov[i, r] = j, corr[i, j], overlap[i, j]
    return index, values, ov


@pytest.fixture(scope="module")
def matrices():
    R = _returns()
    corr, overlap = _reference(R, min_overlap=30)
    return R, corr, overlap


def test_correlation_checks_pass_on_reference(matrices):
    R, corr, overlap = matrices
    stats = verify.correlation_stats(
        corr, overlap, min_overlap=30, finite_counts=np.isfinite(R).sum(axis=0)
    )
    verdicts = verify.verify_correlation(stats)
    assert all(v.passed for v in verdicts.values()), {k: v.problems for k, v in verdicts.items()}
    n = corr.shape[0]
    assert stats.pairs_total == n * (n - 1) // 2
    upper = corr[np.triu_indices(n, 1)]
    finite = upper[np.isfinite(upper)]
    assert stats.pairs_defined == finite.size
    assert stats.mean_abs_corr == pytest.approx(np.abs(finite.astype(np.float64)).mean(), rel=1e-9)


@pytest.mark.parametrize("tile", [1, 7, 64, 1000])
def test_tiling_does_not_change_the_statistics(matrices, tile):
    """Against plain numpy over the strict upper triangle; the float64 sum of |corr| bit for
    bit the same whatever the tile."""
    _, corr, overlap = matrices
    facts = upper_triangle_facts(corr, overlap, min_overlap=30, tile=tile)
    assert facts == upper_triangle_facts(corr, overlap, min_overlap=30)
    upper = np.triu_indices(corr.shape[0], 1)
    a, o = corr[upper], overlap[upper]
    finite = np.isfinite(a)
    assert facts.pairs_total == a.size and facts.pairs_defined == int(finite.sum())
    assert facts.asymmetric_corr == int(
        (corr.view(np.uint32)[upper] != corr.T.view(np.uint32)[upper]).sum()
    )
    assert facts.out_of_range == int((np.abs(a[finite]) > 1).sum())
    assert facts.finite_below_min_overlap == int((finite & (o < 30)).sum())
    assert facts.nan_at_or_above_min_overlap == int((~finite & (o >= 30)).sum())
    assert facts.sum_overlap == int(o.astype(np.int64).sum())
    assert facts.max_abs_offdiag == float(np.abs(a[finite]).max())
    assert facts.sum_abs_corr == pytest.approx(
        np.abs(a[finite].astype(np.float64)).sum(), rel=1e-12
    )


def test_row_counts_above_match_plain_numpy(matrices):
    """Per row, the finite off-diagonal entries and those with |corr| above the row's
    threshold, against plain numpy (NaN rows and thresholds of +inf included)."""
    _, corr, _ = matrices
    n = corr.shape[0]
    rng = np.random.default_rng(3)
    threshold = rng.uniform(0.0, 0.6, n).astype(np.float32)
    threshold[::5] = np.inf
    finite, above = row_counts_above(corr, threshold)
    off = ~np.eye(n, dtype=bool) & np.isfinite(corr)
    assert finite.tolist() == off.sum(axis=1).tolist()
    larger = off & (np.abs(np.where(off, corr, 0)) > threshold[:, None])
    assert above.tolist() == larger.sum(axis=1).tolist()


@pytest.mark.parametrize(
    ("corrupt", "failing"),
    [
        (lambda c, o: c.__setitem__((3, 120), np.nextafter(c[3, 120], np.float32(2))), "symmetry"),
        (lambda c, o: c.__setitem__((100, 2), np.nan), "symmetry"),
        (lambda c, o: o.__setitem__((5, 9), o[5, 9] - 1), "symmetry"),
        (lambda c, o: c.__setitem__((77, 77), np.float32(0.9999999)), "unit_diagonal"),
        (lambda c, o: o.__setitem__((10, 10), o[10, 10] + 1), "unit_diagonal"),
        (lambda c, o: (c.__setitem__((4, 130), 1.5), c.__setitem__((130, 4), 1.5)), "range"),
        (lambda c, o: (c.__setitem__((7, 20), 0.1), c.__setitem__((20, 7), 0.1)), "range"),
    ],
)
def test_correlation_checks_catch_corruption(matrices, corrupt, failing):
    R, corr, overlap = matrices
    corr, overlap = corr.copy(), overlap.copy()
    corrupt(corr, overlap)
    verdicts = verify.verify_correlation(
        verify.correlation_stats(
            corr, overlap, min_overlap=30, finite_counts=np.isfinite(R).sum(axis=0)
        )
    )
    assert not verdicts[failing].passed
    assert verdicts[failing].problems


def test_correlation_stats_read_memmaps(tmp_path, matrices):
    _, corr, overlap = matrices
    np.save(tmp_path / "corr.npy", corr)
    np.save(tmp_path / "overlap.npy", overlap)
    mc = np.load(tmp_path / "corr.npy", mmap_mode="r")
    mo = np.load(tmp_path / "overlap.npy", mmap_mode="r")
    stats = verify.correlation_stats(mc, mo, min_overlap=30)
    assert stats == verify.correlation_stats(corr, overlap, min_overlap=30)


def test_neighbor_check_passes_on_brute_force_and_catches_errors(matrices):
    _, corr, overlap = matrices
    k = 6
    index, values, ov = _brute_top_k(corr, overlap, k)
    ok = verify.verify_neighbors(index, values, corr, k=k, neighbor_overlap=ov, overlap=overlap)
    assert ok.passed, ok.problems
    assert ok.metadata["rows_short_of_k"] == 1  # column 7 has no defined correlation

    def broken(mutate):
        i, v, o = index.copy(), values.copy(), ov.copy()
        mutate(i, v, o)
        return verify.verify_neighbors(i, v, corr, k=k, neighbor_overlap=o, overlap=overlap)

    def swap_indices(i, v, o):
        i[0, [0, 1]] = i[0, [1, 0]]

    swap = broken(swap_indices)
    assert not swap.passed and swap.metadata["value_mismatch"] == 2

    def weaker(i, v, o):  # replace the strongest neighbor of row 4 by the weakest finite one
        row = np.abs(np.where(np.isfinite(corr[4]), corr[4], np.inf))
        row[4] = np.inf
        j = int(np.argmin(row))
        i[4, 0], v[4, 0], o[4, 0] = j, corr[4, j], overlap[4, j]

    result = broken(weaker)
    assert (
        not result.passed and result.metadata["not_sorted"] + result.metadata["missed_larger"] > 0
    )

    def weakest_last(i, v, o):  # the last neighbor of row 4 replaced by a weaker, sorted one
        row = np.abs(np.where(np.isfinite(corr[4]), corr[4], np.inf))
        row[4] = np.inf
        j = int(np.argmin(row))
        i[4, k - 1], v[4, k - 1], o[4, k - 1] = j, corr[4, j], overlap[4, j]

    missed = broken(weakest_last)
    assert not missed.passed and missed.metadata["not_sorted"] == 0
    assert missed.metadata["missed_larger"] >= 1
    assert not broken(lambda i, v, o: (i.__setitem__((9, 2), 9), v.__setitem__((9, 2), 1.0))).passed
    assert not broken(lambda i, v, o: o.__setitem__((3, 1), o[3, 1] + 1)).passed
    assert not broken(
        lambda i, v, o: (i.__setitem__((2, k - 1), -1), v.__setitem__((2, k - 1), np.nan))
    ).passed


def test_neighbor_check_accepts_legitimately_short_rows(matrices):
    _, corr, overlap = matrices
    k = 149  # = N - 1: the short column 7 and its partners cannot fill every slot
    index, values, ov = _brute_top_k(corr, overlap, k)
    verdict = verify.verify_neighbors(
        index, values, corr, k=k, neighbor_overlap=ov, overlap=overlap
    )
    assert verdict.passed, verdict.problems
    assert verdict.metadata["rows_short_of_k"] > 0
    assert verdict.metadata["fill_rate"] < 1.0


def test_cluster_check():
    good = np.array([0, 0, 1, 2, 1, 0, 3], dtype=np.int32)
    verdict = verify.verify_clusters(good, 7)
    assert verdict.passed
    assert verdict.metadata["n_clusters"] == 4
    assert verdict.metadata["largest_cluster_size"] == 3
    assert verdict.metadata["n_singletons"] == 2
    assert verdict.metadata["singleton_share"] == display.share(2 / 7)
    assert not verify.verify_clusters(good, 8).passed  # a symbol without a label
    assert not verify.verify_clusters(np.array([1, 1, 0], dtype=np.int32), 3).passed  # order
    assert not verify.verify_clusters(np.array([0, 2, 2], dtype=np.int32), 3).passed  # gap
    assert not verify.verify_clusters(np.array([0, -1, 1], dtype=np.int32), 3).passed
    md = markdown.largest_clusters(good, list("ABCDEFG"), top=2, members=2)
    assert "| 0 | 3 | A, B ... |" in md


def _pairs(rows):
    """Rows of the seven SPEC §6 columns (p_value 1e-3, q_value 1e-2 and no reverse pair
    added) or all twelve."""
    return np.array(
        [tuple(r) + ((1e-3, 1e-2, 0, np.nan, np.nan) if len(r) == 7 else ()) for r in rows],
        dtype=LEAD_LAG_DTYPE,
    )


def test_lead_lag_check():
    good = _pairs(
        [
            (0, 1, 2, 0.8, 0.0, 0.8, 80),
            (3, 2, 1, -0.5, np.nan, 0.5, 70),
            (1, 0, 1, 0.5, 0.2, 0.3, 80),
        ]
    )
    kwargs = dict(max_lag=3, min_overlap=60, min_improvement=0.0)
    assert verify.verify_lead_lag_pairs(good, 4, **kwargs).passed
    bad_lag = good.copy()
    bad_lag["lag"][0] = 4
    assert not verify.verify_lead_lag_pairs(bad_lag, 4, **kwargs).passed
    dup = _pairs([tuple(good[0]), tuple(good[0])])
    assert not verify.verify_lead_lag_pairs(dup, 4, **kwargs).passed
    unsorted = good[::-1].copy()
    assert not verify.verify_lead_lag_pairs(unsorted, 4, **kwargs).passed
    inconsistent = good.copy()
    inconsistent["improvement"][2] = 0.35
    assert not verify.verify_lead_lag_pairs(inconsistent, 4, **kwargs).passed
    low = good.copy()
    low["overlap"][1] = 59
    assert not verify.verify_lead_lag_pairs(low, 4, **kwargs).passed
    assert not verify.verify_lead_lag_pairs(good, 3, **kwargs).passed  # index 3 out of range
    above_q = verify.verify_lead_lag_pairs(good, 4, **kwargs, max_q_value=0.005)
    assert not above_q.passed and above_q.metadata["q_value_above_max_q_value"] == 3
    lowered = good.copy()
    lowered["q_value"][1] = 1e-4  # below its p-value: no Benjamini-Hochberg value is
    verdict = verify.verify_lead_lag_pairs(lowered, 4, **kwargs)
    assert not verdict.passed and verdict.metadata["p_value_not_in_[0,_q_value]"] == 1
    unset = good.copy()
    unset["p_value"][0] = np.nan
    assert not verify.verify_lead_lag_pairs(unset, 4, **kwargs).passed
    two_way = good.copy()
    two_way[["reverse_lag", "reverse_lagged_corr", "reverse_q_value"]][0] = (2, -0.4, 0.03)
    assert verify.verify_lead_lag_pairs(two_way, 4, **kwargs).passed
    for field, value in (
        ("reverse_lag", 4),
        ("reverse_lagged_corr", np.nan),
        ("reverse_q_value", 1.5),
    ):
        broken = two_way.copy()
        broken[field][0] = value
        verdict = verify.verify_lead_lag_pairs(broken, 4, **kwargs)
        assert not verdict.passed and verdict.metadata["reverse_direction_malformed"] == 1


def test_injected_pairs_check():
    symbols = ["A", "B", "C", "D"]
    pairs = _pairs([(0, 1, 2, 0.8, 0.0, 0.8, 80), (3, 2, 1, -0.5, np.nan, 0.5, 70)])
    found = verify.verify_injected_pairs(pairs, symbols, [("A", "B", 2), ("D", "C", 1)])
    assert found.passed and found.metadata["recall"] == 1.0
    wrong_lag = verify.verify_injected_pairs(pairs, symbols, [("A", "B", 3)])
    assert not wrong_lag.passed and wrong_lag.metadata["injected_pairs_found"] == 0
    absent = verify.verify_injected_pairs(pairs, symbols, [("B", "A", 2), ("A", "B", 2)])
    assert not absent.passed and absent.metadata["injected_pairs_found"] == 1
    assert "B->A (lag 2, got None)" in absent.problems[0]
    nothing = verify.verify_injected_pairs(pairs[:0], symbols, [("A", "B", 2)])
    assert not nothing.passed and nothing.metadata["injected_pairs_kept"] == 1
    dropped = verify.verify_injected_pairs(pairs, symbols, [("A", "Z", 1)])
    assert dropped.passed and dropped.metadata["injected_pairs_kept"] == 0
    real = verify.verify_injected_pairs(pairs, symbols, [])
    assert real.passed and "no synthetic truth" in real.metadata["note"]
    md = markdown.strongest_pairs(pairs, symbols, top=1)
    assert "| A | B | 2 | +0.8000 | +0.0000 | 0.8000 | 80 | 0.0100 |" in md


def test_returns_check():
    R = _returns()
    symbols = [f"S{j:04d}" for j in range(R.shape[1])]
    keep = np.isfinite(R).sum(axis=0) >= 60
    kept = R[:, keep]
    kept_symbols = [s for s, k in zip(symbols, keep, strict=True) if k]
    ok = verify.verify_returns(
        kept, kept_symbols, min_history_days=60, lookback_days=100, working_memory_mb=TINY_MB
    )
    assert ok.passed, ok.problems
    assert not verify.verify_returns(R, symbols, min_history_days=60, lookback_days=100).passed
    with_inf = kept.copy()
    with_inf[3, 3] = np.inf
    assert not verify.verify_returns(
        with_inf, kept_symbols, min_history_days=60, lookback_days=100
    ).passed
    flat = kept.copy()
    flat[:, 5] = np.where(np.isfinite(flat[:, 5]), 0.01, np.nan)
    assert not verify.verify_returns(
        flat, kept_symbols, min_history_days=60, lookback_days=100
    ).passed
    unsorted = list(reversed(kept_symbols))
    assert not verify.verify_returns(kept, unsorted, min_history_days=60, lookback_days=100).passed
    assert not verify.verify_returns(
        kept, kept_symbols, min_history_days=60, lookback_days=80
    ).passed


def test_published_counts_check_counts_the_suspect_prices():
    """``published_rows_match`` compares every published table, the suspect prices included:
    a missing ``suspect_prices`` row fails it, naming the table."""
    from corr_pipeline.compute.suspect import SuspectSymbol
    from corr_pipeline.snapshot.results import SnapshotResults

    results = SnapshotResults(
        snapshot_date="2024-03-01",
        as_of_trade_date="2024-03-01",
        symbols=["A", "B", "C"],
        n_dropped=0,
        lookback_days=60,
        params={},
        neighbor_index=np.array([[1], [0], [-1]]),
        neighbor_corr=np.zeros((3, 1)),
        neighbor_overlap=np.zeros((3, 1), dtype=np.int64),
        cluster_labels=np.array([1, 1, 2]),
        lead_lag_pairs=np.zeros(0, dtype=LEAD_LAG_DTYPE),
        suspects=[SuspectSymbol("C", 0.4, 0.1, "zero returns 40 % > 25 %", False)],
    )
    counts = {"snapshots": 1, "peer_neighbors": 2, "symbol_clusters": 3, "lead_lag_pairs": 0}
    assert verify.verify_published_counts(results, {**counts, "suspect_prices": 1}).passed
    verdict = verify.verify_published_counts(results, {**counts, "suspect_prices": 0})
    assert not verdict.passed
    assert "suspect_prices: 0 rows" in " ".join(verdict.problems)
