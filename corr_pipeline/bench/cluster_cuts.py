"""Which dendrogram cut recovers the sectors, with and without the market modes (SPEC §5).

    python -m corr_pipeline.bench.cluster_cuts                      # N = 1000, 10 sectors, 3 seeds
    python -m corr_pipeline.bench.cluster_cuts --n 2000 --seeds 1 2

A universe with a known answer, :func:`corr_pipeline.synth.market_like_returns` (a market
factor with common GARCH volatility, ``n_sectors`` sector factors, Student-t(4) innovations,
15 % ragged listings), ``T = 252`` returns. For each seed the snapshot's own steps run on it:
the pairwise-complete ``corr`` (:func:`corr_pipeline.snapshot.steps.correlation`, SPEC §3, with
the default parameters), its
strongest eigenmodes found once (:func:`corr_pipeline.snapshot.steps.market_modes`), then the
clusters (:func:`corr_pipeline.snapshot.steps.clusters`, average linkage) for every
``market_modes_removed`` ``m`` and every cut: the distance thresholds of
:data:`DISTANCE_THRESHOLDS` (1.2 is the default) and ``n_clusters`` = 1× and 2× the number of
sectors. Each partition is scored against the true sectors:

* ``singleton_share``: clusters of one symbol / N (what the clusters asset reports);
* the adjusted Rand index (:func:`adjusted_rand_index`; 1 = the sectors exactly, about 0 = no
  better than chance, e.g. one cluster holding everything).

It also prints, for each ``m``, the mean correlation within a sector and across sectors of
``C_m`` (the correlation the clusters cut, SPEC §5): a cut at distance ``d`` joins groups
whose average correlation is at least ``1 − d² / 2`` (0.28 at 1.2, 0.155 at 1.3, 0.089 at
1.35, 0.02 at 1.4).

The printed table is the one in docs/user_guide.md ("Which cut with the market modes
removed"). Memory: a few N × N float32/float64 arrays (N = 2000: about 100 MB).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import comb

from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.snapshot import steps
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.synth import market_like_returns

__all__ = [
    "DISTANCE_THRESHOLDS",
    "CutScore",
    "CutsReport",
    "adjusted_rand_index",
    "format_report",
    "main",
    "run_cluster_cuts",
    "sector_correlations",
    "singleton_share",
]

DISTANCE_THRESHOLDS = (1.2, 1.3, 1.35, 1.4)
"""The distance cuts scored (1.2, the default, ⇔ correlation 0.28; 1.4 ⇔ 0.02)."""


def adjusted_rand_index(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Adjusted Rand index of two partitions of the same items (Hubert and Arabie, 1985).

    From the contingency table ``n_ij`` (items in cluster ``i`` of ``a`` and ``j`` of ``b``),
    its row sums ``a_i`` and column sums ``b_j``, with ``C(x) = x (x − 1) / 2`` pairs::

        index = Σ C(n_ij),  expected = Σ C(a_i) · Σ C(b_j) / C(n),
        ARI = (index − expected) / ((Σ C(a_i) + Σ C(b_j)) / 2 − expected)

    1 for identical partitions (whatever the label values), about 0 for independent ones,
    negative below chance. When the denominator is 0 (both partitions all singletons, or both
    one cluster) the partitions are identical and the index is 1. Labels may be any integers;
    ``ValueError`` when the two arrays differ in length.
    """
    a = np.asarray(labels_a).ravel()
    b = np.asarray(labels_b).ravel()
    if a.shape != b.shape:
        raise ValueError(f"partitions of {a.size} and {b.size} items")
    n = a.size
    if n < 2:
        return 1.0
    _, rows = np.unique(a, return_inverse=True)
    _, cols = np.unique(b, return_inverse=True)
    n_cols = int(cols.max()) + 1
    table = np.bincount(rows * n_cols + cols, minlength=(int(rows.max()) + 1) * n_cols)
    index = float(comb(table, 2).sum())
    sum_a = float(comb(np.bincount(rows), 2).sum())
    sum_b = float(comb(np.bincount(cols), 2).sum())
    expected = sum_a * sum_b / float(comb(n, 2))
    maximum = (sum_a + sum_b) / 2.0
    if maximum == expected:
        return 1.0
    return (index - expected) / (maximum - expected)


def singleton_share(labels: np.ndarray) -> float:
    """Items alone in their cluster / all items (0 for no items)."""
    labels = np.asarray(labels).ravel()
    if labels.size == 0:
        return 0.0
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return float(np.count_nonzero(counts[inverse] == 1)) / labels.size


def sector_correlations(
    corr: np.ndarray, sector: np.ndarray, modes: MarketModes, m: int
) -> tuple[float, float]:
    """Mean off-diagonal correlation of ``C_m`` (SPEC §5: ``corr`` less its ``m`` strongest
    eigenmodes, renormalised to a unit diagonal; ``m = 0``: ``corr``, NaN as 0) over the pairs
    in one sector and over the pairs across sectors; symbols without a sector (``-1``) left
    out. Dense float64: for the benchmark's N, not the pipeline's."""
    c = np.nan_to_num(np.asarray(corr, dtype=np.float64), nan=0.0)
    np.fill_diagonal(c, 1.0)
    if m:
        vectors, values = modes.vectors[:, :m], modes.eigenvalues[:m]
        c -= (vectors * values) @ vectors.T
        residual = np.diag(c).copy()
        scale = np.full(residual.shape, np.nan)
        scale[residual > 0] = 1.0 / np.sqrt(residual[residual > 0])
        c *= scale[:, None] * scale[None, :]
        c = np.nan_to_num(c, nan=0.0)  # no residual variance: NaN, taken as 0
    keep = sector >= 0
    c = c[np.ix_(keep, keep)]
    same = sector[keep][:, None] == sector[keep][None, :]
    off = ~np.eye(c.shape[0], dtype=bool)
    return float(c[same & off].mean()), float(c[~same].mean())


@dataclass
class CutScore:
    """One ``(m, cut)`` over the seeds: clusters, singleton shares and adjusted Rand indices
    (one entry per seed, in the order of the seeds)."""

    market_modes_removed: int
    cut: str
    n_clusters: list[int] = field(default_factory=list)
    singleton_shares: list[float] = field(default_factory=list)
    rand_indices: list[float] = field(default_factory=list)


@dataclass
class CutsReport:
    """What :func:`run_cluster_cuts` measured: the universe's shape, per ``m`` the mean
    ``λ_m / N`` and the mean within- and across-sector correlations of ``C_m`` over the seeds,
    and the scores in the order ``m``, then cut. ``labels[(seed, m, cut)]``: each partition."""

    n_symbols: int
    n_returns: int
    n_sectors: int
    seeds: list[int]
    mode_shares: list[float]
    within_sector: dict[int, float]
    across_sectors: dict[int, float]
    scores: list[CutScore]
    labels: dict[tuple[int, int, str], np.ndarray]


def _cuts(n_sectors: int, thresholds: Sequence[float]) -> list[tuple[str, dict[str, object]]]:
    """``(name, parameters)`` of each cut: the distance thresholds, then 1× and 2× sectors."""
    cuts: list[tuple[str, dict[str, object]]] = [
        (f"distance_threshold={t:g}", {"distance_threshold": float(t), "n_clusters": None})
        for t in thresholds
    ]
    for k in sorted({n_sectors, 2 * n_sectors}):
        cuts.append((f"n_clusters={k}", {"distance_threshold": None, "n_clusters": k}))
    return cuts


def _correlation(returns: np.ndarray, params: SnapshotParameters) -> np.ndarray:
    """The snapshot's correlation of ``returns`` (:func:`corr_pipeline.snapshot.steps.correlation`),
    in memory; the overlap is dropped."""
    n = returns.shape[1]
    corr = np.empty((n, n), np.float32)
    overlap = np.empty((n, n), overlap_dtype(returns.shape[0]))
    steps.correlation(returns, params.correlation, out_corr=corr, out_overlap=overlap)
    return corr


def run_cluster_cuts(
    *,
    n_symbols: int = 1000,
    n_returns: int = 252,
    n_sectors: int = 10,
    seeds: Sequence[int] = (1, 2, 3),
    modes_removed: Sequence[int] = (0, 1, 2),
    thresholds: Sequence[float] = DISTANCE_THRESHOLDS,
) -> CutsReport:
    """Score every ``(m, cut)`` on ``len(seeds)`` universes (module docstring)."""
    if n_sectors < 1:
        raise ValueError(f"n_sectors must be >= 1, got {n_sectors}")
    cuts = _cuts(n_sectors, thresholds)
    scores = {(m, name): CutScore(m, name) for m in modes_removed for name, _ in cuts}
    most = max(max(modes_removed, default=0), 1)
    shares: list[np.ndarray] = []
    within: dict[int, list[float]] = {m: [] for m in modes_removed}
    across: dict[int, list[float]] = {m: [] for m in modes_removed}
    labels: dict[tuple[int, int, str], np.ndarray] = {}
    base = SnapshotParameters()
    for seed in seeds:
        draw = market_like_returns(n_returns, n_symbols, seed=seed, n_sectors=n_sectors)
        corr = _correlation(draw.returns, base)
        modes = steps.market_modes(
            corr, SnapshotParameters(**{**base.as_dict(), "market_modes_removed": most})
        )
        shares.append(modes.share[:most])
        for m in modes_removed:
            inside, between = sector_correlations(corr, draw.sector, modes, m)
            within[m].append(inside)
            across[m].append(between)
            for name, cut in cuts:
                params = SnapshotParameters(**{**base.as_dict(), **cut, "market_modes_removed": m})
                found = steps.clusters(corr, params.clusters, modes=modes)
                labels[(seed, m, name)] = found
                score = scores[(m, name)]
                score.n_clusters.append(int(found.max()) + 1 if found.size else 0)
                score.singleton_shares.append(singleton_share(found))
                score.rand_indices.append(adjusted_rand_index(found, draw.sector))
    return CutsReport(
        n_symbols=n_symbols,
        n_returns=n_returns,
        n_sectors=n_sectors,
        seeds=list(seeds),
        mode_shares=[float(x) for x in np.mean(shares, axis=0)],
        within_sector={m: float(np.mean(v)) for m, v in within.items()},
        across_sectors={m: float(np.mean(v)) for m, v in across.items()},
        scores=list(scores.values()),
        labels=labels,
    )


def format_report(report: CutsReport) -> str:
    """The report as text: a heading line, the correlations of ``C_m``, and a markdown table
    with the mean over the seeds of the clusters, the singleton share and the adjusted Rand
    index (its smallest and largest over the seeds in brackets)."""
    shares = ", ".join(f"λ{k + 1}/N {s:.3f}" for k, s in enumerate(report.mode_shares))
    lines = [
        f"N = {report.n_symbols}, T = {report.n_returns}, {report.n_sectors} sectors, "
        f"seeds {', '.join(map(str, report.seeds))}; mean {shares}",
        "",
        "| m | mean corr within a sector | across sectors |",
        "|---:|---:|---:|",
    ]
    for m in report.within_sector:
        lines.append(f"| {m} | {report.within_sector[m]:.3f} | {report.across_sectors[m]:.3f} |")
    lines += [
        "",
        "| m | cut | clusters | singleton share | adjusted Rand (min–max) |",
        "|---:|---|---:|---:|---|",
    ]
    for score in report.scores:
        ari = score.rand_indices
        lines.append(
            f"| {score.market_modes_removed} | {score.cut} | {np.mean(score.n_clusters):.0f} | "
            f"{np.mean(score.singleton_shares):.3f} | "
            f"{_hundredths(np.mean(ari))} ({_hundredths(min(ari))}–{_hundredths(max(ari))}) |"
        )
    return "\n".join(lines)


def _hundredths(x: float | np.floating) -> str:
    """``x`` to two decimals, without the sign of a negative zero (``-0.004`` is ``0.00``)."""
    return f"{round(float(x), 2) + 0.0:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, run :func:`run_cluster_cuts`, print :func:`format_report`."""
    parser = argparse.ArgumentParser(
        prog="python -m corr_pipeline.bench.cluster_cuts",
        description="Singleton share and adjusted Rand index against the true sectors of each "
        "dendrogram cut, with market_modes_removed = 0, 1, 2, on synthetic universes.",
    )
    parser.add_argument("--n", type=int, default=1000, help="symbols (default 1000)")
    parser.add_argument("--t", type=int, default=252, help="returns (default 252)")
    parser.add_argument("--sectors", type=int, default=10, help="sectors (default 10)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3], help="one universe per seed"
    )
    args = parser.parse_args(argv)
    report = run_cluster_cuts(
        n_symbols=args.n, n_returns=args.t, n_sectors=args.sectors, seeds=args.seeds
    )
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
