"""``python -m corr_pipeline.bench.cluster_cuts``: the adjusted Rand index against a brute-force
count over every pair of items, the singleton share, the within/across-sector correlations of
``C_m`` against ``numpy.linalg.eigh``, and the scores of a small run against the labels it
found and against the claims docs/user_guide.md makes from its table."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from corr_pipeline.bench.cluster_cuts import (
    adjusted_rand_index,
    format_report,
    main,
    run_cluster_cuts,
    sector_correlations,
    singleton_share,
)
from corr_pipeline.compute import hierarchical_clusters, pairwise_correlation
from corr_pipeline.compute.market_modes import market_modes
from corr_pipeline.synth import market_like_returns
from corr_pipeline_tests.compute import reference as ref


def _pair_counting_ari(a: np.ndarray, b: np.ndarray) -> float:
    """The adjusted Rand index from the four pair counts, visiting every pair ``i < j``:
    ``2 (n00 n11 − n01 n10) / ((n00 + n01)(n01 + n11) + (n00 + n10)(n10 + n11))`` (1 when the
    denominator is 0), in exact fractions."""
    n11 = n10 = n01 = n00 = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        same_a, same_b = a[i] == a[j], b[i] == b[j]
        if same_a and same_b:
            n11 += 1
        elif same_a:
            n10 += 1
        elif same_b:
            n01 += 1
        else:
            n00 += 1
    denominator = (n00 + n01) * (n01 + n11) + (n00 + n10) * (n10 + n11)
    if denominator == 0:
        return 1.0
    return float(Fraction(2 * (n00 * n11 - n01 * n10), denominator))


@pytest.mark.parametrize("seed", range(12))
def test_adjusted_rand_index_equals_the_pair_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    a = rng.integers(-3, int(rng.integers(1, n + 1)), n)
    b = rng.integers(0, int(rng.integers(1, n + 1)), n) * 7 + 100
    if seed % 3 == 0:  # b a noisy copy of a: an index well above 0
        b = np.where(rng.random(n) < 0.2, b, a)
    assert adjusted_rand_index(a, b) == pytest.approx(_pair_counting_ari(a, b), abs=1e-12)
    assert adjusted_rand_index(b, a) == pytest.approx(adjusted_rand_index(a, b), abs=1e-12)


def test_adjusted_rand_index_of_identical_trivial_and_independent_partitions() -> None:
    a = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    assert adjusted_rand_index(a, a * 5 - 9) == 1.0  # the labels' values do not matter
    for trivial in (np.zeros(8, int), np.arange(8)):
        assert adjusted_rand_index(trivial, trivial) == 1.0
        assert adjusted_rand_index(a, trivial) == pytest.approx(
            _pair_counting_ari(a, trivial), abs=1e-12
        )
    assert adjusted_rand_index(np.zeros(8, int), np.arange(8)) == pytest.approx(
        _pair_counting_ari(np.zeros(8, int), np.arange(8))
    )
    rng = np.random.default_rng(5)
    independent = [
        adjusted_rand_index(rng.integers(0, 10, 2000), rng.integers(0, 10, 2000)) for _ in range(5)
    ]
    assert max(abs(x) for x in independent) < 0.01
    with pytest.raises(ValueError, match="partitions of 3 and 2 items"):
        adjusted_rand_index(np.arange(3), np.arange(2))


def test_singleton_share_counts_the_items_alone() -> None:
    rng = np.random.default_rng(2)
    for _ in range(10):
        labels = rng.integers(0, 30, int(rng.integers(1, 50)))
        alone = sum(1 for x in labels if np.count_nonzero(labels == x) == 1)
        assert singleton_share(labels) == alone / len(labels)
    assert singleton_share(np.array([], dtype=int)) == 0.0


def test_sector_correlations_are_those_of_c_m() -> None:
    draw = market_like_returns(252, 120, seed=4, n_sectors=4, n_pairs=3)
    corr = pairwise_correlation(draw.returns, min_overlap=60).corr
    modes = market_modes(corr, 2)
    for m in (0, 1, 2):
        C_m = ref.market_modes_removed_reference(corr, m)[0] if m else np.nan_to_num(corr)
        keep = np.flatnonzero(draw.sector >= 0)
        inside, across = [], []
        for i, j in itertools.combinations(keep, 2):
            (inside if draw.sector[i] == draw.sector[j] else across).append(C_m[i, j])
        within, between = sector_correlations(corr, draw.sector, modes, m)
        assert within == pytest.approx(np.mean(inside), abs=1e-6)
        assert between == pytest.approx(np.mean(across), abs=1e-6)


def test_a_small_run_scores_its_labels_and_shows_what_the_guide_says() -> None:
    """N = 400, 5 sectors, one seed: every score is its partition's, the partitions are the
    clustering's, and, as the user guide's table says, with the market mode removed the cut at
    1.2 leaves many singletons and recovers the sectors far worse than a cut into the number of
    sectors, which finds them where the raw correlation (m = 0) does not."""
    report = run_cluster_cuts(n_symbols=400, n_sectors=5, seeds=[3], modes_removed=(0, 1))
    draw = market_like_returns(252, 400, seed=3, n_sectors=5)
    corr = pairwise_correlation(draw.returns, min_overlap=60).corr
    cuts = [s.cut for s in report.scores if s.market_modes_removed == 0]
    assert cuts == [
        "distance_threshold=1.2",
        "distance_threshold=1.3",
        "distance_threshold=1.35",
        "distance_threshold=1.4",
        "n_clusters=5",
        "n_clusters=10",
    ]
    scores = {(s.market_modes_removed, s.cut): s for s in report.scores}
    for (m, cut), score in scores.items():
        labels = report.labels[(3, m, cut)]
        assert score.n_clusters == [int(labels.max()) + 1]
        assert score.singleton_shares == [singleton_share(labels)]
        assert score.rand_indices == [adjusted_rand_index(labels, draw.sector)]
    direct = hierarchical_clusters(corr, n_clusters=5, market_modes_removed=1)
    np.testing.assert_array_equal(report.labels[(3, 1, "n_clusters=5")], direct)
    fixed, by_count = scores[(1, "distance_threshold=1.2")], scores[(1, "n_clusters=5")]
    assert fixed.singleton_shares[0] > 0.1
    assert by_count.rand_indices[0] > fixed.rand_indices[0] + 0.3
    assert by_count.rand_indices[0] > scores[(0, "n_clusters=5")].rand_indices[0] + 0.3
    assert report.within_sector[1] > report.across_sectors[1]
    text = format_report(report)
    assert "| 1 | n_clusters=5 | 5 |" in text
    assert text.startswith("N = 400, T = 252, 5 sectors, seeds 3;")


def test_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--n", "150", "--sectors", "3", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| m | cut | clusters | singleton share | adjusted Rand (min–max) |" in out
    assert sum(line.startswith("| 2 | ") for line in out.splitlines()) == 7  # 6 cuts + C_2 row
