"""Benchmark: calibration of the lead-lag significance, old definition against new (SPEC §6).

    python benchmarks/bench_lead_lag_calibration.py                  # N = 100, T = 252, 100 windows
    python benchmarks/bench_lead_lag_calibration.py --n 200 --windows 40

Each window is an independent draw of :func:`corr_pipeline.synth.market_like_returns` (a
reversing market, common GARCH volatility, Student-t tails, sectors, ragged listings): window
``w`` of the **null** universe (no lead-lag) has seed ``seed + w``, window ``w`` of the
**injected** universe (``--pairs`` pure lead-lag pairs) seed ``seed + windows + w``. Every
window is tested four ways, the series ``X`` crossed with the test:

* series: the raw returns ``R``, or the market residuals ``E`` (``m = 1`` eigenportfolio of the
  window's own ``pairwise_correlation``, :func:`corr_pipeline.compute.market_residuals`);
* test at the pair's best lag ``ℓ*`` (largest ``|r|`` of the lagged pairwise-complete Pearson
  ``r`` of ``(X[t, i], X[t + ℓ, j])``, ``ℓ = 1 .. max_lag``, ties to the smaller lag):
  **white noise** (the old, removed definition, computed here in float64):
  ``z = atanh(|r|) · sqrt(n − 3)`` (``n`` the overlap at ``ℓ*``), ``p = erfc(z / √2)``;
  or **robust** (the package, :func:`corr_pipeline.compute.pair_significance` over every ordered
  pair with a best lag): ``t = Σ a_t b_{t+ℓ*} / sqrt(Σ a_t² b_{t+ℓ*}²)`` (``a``, ``b`` the
  columns less their means over their finite rows), ``p = erfc(|t| / √2)``.
  Both then Šidák over the lags, ``p_value = 1 − (1 − p)^max_lag``, and Benjamini–Hochberg
  q-values over all ordered pairs with a best lag.

The old definition is raw + white noise; the new one (the pipeline's default) residuals +
robust; the two mixed columns show which half fixes what. Reported, pooled over the windows:
the share of the null pairs' ``p_value`` below 0.05, 0.01 and 1e-4 (nominal: the same
numbers), the mean number of pairs with ``q <= 0.05`` per window (on the injected universe: the
null pairs among them, false discoveries) and the share of windows with any, and the share of
injected pairs found at ``q <= 0.05`` with their true lag as best lag.

Targets: on the null, the shares at 0.05 and 0.01 within ±20 % of nominal and at most 5 % of
the windows with any ``q <= 0.05``; at least 90 % of the injected pairs recovered.

Measured with the defaults (commit 4aa2ff0, 2 cores, ~70-150 s): the old definition gives
4.6 × the nominal share at 0.05 and 10 × at 0.01, and a pair at ``q <= 0.05`` in 95 % of the
null windows (703 per window); the new one 0.68 × and 0.48 × (0.1 × at 1e-4) and none: it is
*conservative*, because a self-normalised sum of heavy-tailed products has lighter tails than
N(0, 1) (``--df 30``: 0.86 × and 0.74 ×). Residuals alone remove the market's lag-1 reversal
(no excess at lag 1); the robust statistic alone removes the common volatility's and the
tails' inflation. Power: 96 % of the injected pairs (ρ 0.5-0.8) against 100 % for the old
test; the misses are the weaker pairs in windows whose common variance spikes, where the robust
statistic is about ``ρ · sqrt(n_eff / (1 + 2ρ²))`` with ``n_eff = (Σ h)² / Σ h²``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

import numpy as np
from common import git_commit, machine_line
from scipy.special import erfc

from corr_pipeline.compute import market_residuals, pair_significance, pairwise_correlation
from corr_pipeline.synth import market_like_returns

THRESHOLDS = (0.05, 0.01, 1e-4)
Q_LEVEL = 0.05
SHARE_TOLERANCE = 0.20
MAX_WINDOW_SHARE_WITH_DISCOVERY = 0.05
MIN_RECOVERED_SHARE = 0.90
DEFINITIONS = (
    ("raw + white noise (old)", "raw", "white noise"),
    ("raw + robust", "raw", "robust"),
    ("residuals + white noise", "residuals", "white noise"),
    ("residuals + robust (new)", "residuals", "robust"),
)


def lagged_correlation(X: np.ndarray, Y: np.ndarray, min_overlap: int):
    """Pairwise-complete Pearson ``r`` (float64) of every column of ``X`` with every column of
    ``Y`` (same rows) and the overlap ``n``: from masked moments of the columns shifted by their
    finite mean, ``cov = Sxy − Sx·Sy/n``, ``var = Sxx − Sx²/n``; NaN where ``n < min_overlap`` or
    a variance is not positive (as ``bench_lead_lag.masked_correlation``)."""
    mx, my = np.isfinite(X), np.isfinite(Y)
    x0 = np.where(mx, X - np.nanmean(X, axis=0), 0.0)
    y0 = np.where(my, Y - np.nanmean(Y, axis=0), 0.0)
    fx, fy = mx.astype(np.float64), my.astype(np.float64)
    n = fx.T @ fy
    sx, sy = x0.T @ fy, fx.T @ y0
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = x0.T @ y0 - sx * sy / n
        var_x = (x0 * x0).T @ fy - sx * sx / n
        var_y = fx.T @ (y0 * y0) - sy * sy / n
        r = cov / np.sqrt(var_x * var_y)
    undefined = (n < min_overlap) | ~(var_x > 0) | ~(var_y > 0)
    return np.where(undefined, np.nan, np.clip(r, -1.0, 1.0)), n


def best_lags(X: np.ndarray, max_lag: int, min_overlap: int):
    """Per ordered pair ``(i, j)``: the best lag (0: none, and on the diagonal), its ``|r|``
    and its overlap, over every lag's full N × N float64 matrix."""
    n_rows, n_cols = X.shape
    best_abs = np.full((n_cols, n_cols), -np.inf)
    best_lag = np.zeros((n_cols, n_cols), dtype=np.int64)
    overlap = np.zeros((n_cols, n_cols))
    for lag in range(1, max_lag + 1):
        r, n = lagged_correlation(X[: n_rows - lag], X[lag:], min_overlap)
        better = np.abs(r) > best_abs  # NaN never wins; ties keep the smaller lag
        best_abs[better], best_lag[better], overlap[better] = np.abs(r[better]), lag, n[better]
    np.fill_diagonal(best_lag, 0)
    return best_lag, best_abs, overlap


def sidak(p: np.ndarray, max_lag: int) -> np.ndarray:
    return -np.expm1(max_lag * np.log1p(-p))


def white_noise_p_values(abs_r: np.ndarray, overlap: np.ndarray, max_lag: int) -> np.ndarray:
    """The old test: ``z = atanh(|r|) · sqrt(n − 3)``, ``p = erfc(z / √2)``, Šidák."""
    with np.errstate(divide="ignore"):
        z = np.arctanh(np.minimum(abs_r, 1.0)) * np.sqrt(overlap - 3.0)
    return sidak(erfc(z / np.sqrt(2.0)), max_lag)


def bh_q_values(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg: ``q_(k) = min over l >= k of p_(l) · M / l``, capped at 1."""
    order = np.argsort(p, kind="stable")
    ranked = p[order] * p.size / np.arange(1, p.size + 1)
    q = np.empty(p.size)
    q[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    return q


@dataclass
class Tally:
    """One definition's figures on one universe, summed over its windows."""

    null_pairs: int = 0
    below: np.ndarray = field(default_factory=lambda: np.zeros(len(THRESHOLDS), dtype=np.int64))
    discoveries: list[int] = field(default_factory=list)
    injected: int = 0
    recovered: int = 0

    def row(self) -> dict[str, float]:
        discoveries = np.array(self.discoveries)
        return {
            **{
                f"p<{t:g}": b / self.null_pairs for t, b in zip(THRESHOLDS, self.below, strict=True)
            },
            "mean": float(discoveries.mean()),
            "any": float((discoveries > 0).mean()),
            "recovered": self.recovered / self.injected if self.injected else float("nan"),
        }


def score_window(R: np.ndarray, truth: np.ndarray, args, tallies: dict[str, Tally]) -> None:
    """Add one window's p- and q-values under the four definitions to ``tallies``."""
    corr = pairwise_correlation(R, min_overlap=args.min_overlap).corr
    series = {"raw": R, "residuals": market_residuals(R, corr=corr, m=1)}
    lags = {
        key: best_lags(X.astype(np.float64), args.max_lag, args.min_overlap)
        for key, X in series.items()
    }
    injected = np.zeros((R.shape[1], R.shape[1]), dtype=bool)
    injected[truth["leader"], truth["lagger"]] = True
    for name, series_name, test in DEFINITIONS:
        X = series[series_name]
        best_lag, best_abs, overlap = lags[series_name]
        leaders, laggers = np.nonzero(best_lag > 0)
        if test == "white noise":
            p = white_noise_p_values(
                best_abs[leaders, laggers], overlap[leaders, laggers], args.max_lag
            )
            q = bh_q_values(p)
        else:
            significance = pair_significance(
                X, leaders, laggers, max_lag=args.max_lag, min_overlap=args.min_overlap
            )
            assert significance.m == leaders.size, (significance.m, leaders.size)
            p, q = significance.p_value, significance.q_value
        is_null = ~injected[leaders, laggers]
        tally = tallies[name]
        tally.null_pairs += int(is_null.sum())
        tally.below += np.array([np.count_nonzero(p[is_null] < t) for t in THRESHOLDS])
        tally.discoveries.append(int(np.count_nonzero(q[is_null] <= Q_LEVEL)))
        q_matrix = np.full(best_lag.shape, np.inf)
        q_matrix[leaders, laggers] = q
        found = (q_matrix[truth["leader"], truth["lagger"]] <= Q_LEVEL) & (
            best_lag[truth["leader"], truth["lagger"]] == truth["lag"]
        )
        tally.injected += truth.size
        tally.recovered += int(found.sum())


def run(args) -> dict[str, dict[str, Tally]]:
    results = {}
    for universe, n_pairs, first_seed in (
        ("null", 0, args.seed),
        ("injected", args.pairs, args.seed + args.windows),
    ):
        tallies = {name: Tally() for name, _, _ in DEFINITIONS}
        for w in range(args.windows):
            draw = market_like_returns(
                args.t,
                args.n,
                seed=first_seed + w,
                n_sectors=args.sectors,
                n_pairs=n_pairs,
                ragged_share=args.ragged_share,
                student_t_df=args.df,
            )
            score_window(draw.returns, draw.truth, args, tallies)
        results[universe] = tallies
    return results


def print_report(results: dict[str, dict[str, Tally]]) -> None:
    """The table (one column per definition), then the targets of the old and the new one."""
    names = [name for name, _, _ in DEFINITIONS]
    rows = {u: {name: t.row() for name, t in tallies.items()} for u, tallies in results.items()}
    any_target = f"<= {MAX_WINDOW_SHARE_WITH_DISCOVERY:g}"
    lines = {
        universe: [
            *(
                (f"p<{t:g}", f"share of null pairs' p_value < {t:g}", f"{t:g}", ".3g")
                for t in THRESHOLDS
            ),
            ("mean", f"{many} at q <= {Q_LEVEL:g} per window", "", ".2f"),
            ("any", f"windows with any {one} at q <= {Q_LEVEL:g}", target, ".2f"),
        ]
        for universe, many, one, target in (
            ("null", "pairs", "pair", any_target),
            ("injected", "false discoveries", "false discovery", ""),
        )
    }
    lines["injected"].append(
        (
            "recovered",
            f"injected pairs recovered at q <= {Q_LEVEL:g} with their lag",
            f">= {MIN_RECOVERED_SHARE:g}",
            ".3f",
        )
    )
    print("| universe | figure | nominal / target | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---:|" * len(names))
    for universe, universe_lines in lines.items():
        for key, label, nominal, fmt in universe_lines:
            cells = " | ".join(format(rows[universe][name][key], fmt) for name in names)
            print(f"| {universe} | {label} | {nominal} | {cells} |")
    print()
    for name in (names[0], names[-1]):
        null, injected = rows["null"][name], rows["injected"][name]
        checks = [
            *(
                (
                    f"null share p < {t:g} within ±{SHARE_TOLERANCE:.0%} of nominal",
                    abs(null[f"p<{t:g}"] / t - 1.0) <= SHARE_TOLERANCE,
                    f"{null[f'p<{t:g}']:.4f} = {null[f'p<{t:g}'] / t:.2f} × nominal",
                )
                for t in THRESHOLDS[:2]
            ),
            (
                f"null windows with any q <= {Q_LEVEL:g}: at most"
                f" {MAX_WINDOW_SHARE_WITH_DISCOVERY:.0%}",
                null["any"] <= MAX_WINDOW_SHARE_WITH_DISCOVERY,
                f"{null['any']:.2f}",
            ),
            (
                f"injected pairs recovered: at least {MIN_RECOVERED_SHARE:.0%}",
                injected["recovered"] >= MIN_RECOVERED_SHARE,
                f"{injected['recovered']:.3f}",
            ),
        ]
        print(f"{name}:")
        for label, met, value in checks:
            print(f"  {'MET    ' if met else 'NOT MET'}  {label}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="symbols per window")
    parser.add_argument("--t", type=int, default=252, help="returns per window")
    parser.add_argument("--windows", type=int, default=100, help="windows per universe")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first null window")
    parser.add_argument("--max-lag", type=int, default=5)
    parser.add_argument("--min-overlap", type=int, default=60)
    parser.add_argument("--pairs", type=int, default=5, help="injected pairs per window")
    parser.add_argument("--sectors", type=int, default=10)
    parser.add_argument("--ragged-share", type=float, default=0.15)
    parser.add_argument("--df", type=float, default=4.0, help="Student-t degrees of freedom")
    args = parser.parse_args()
    print(f"# {machine_line()}; commit {git_commit()}")
    print(
        f"# market_like_returns: N = {args.n}, T = {args.t}, {args.windows} windows per universe,"
        f" seed {args.seed}, {args.sectors} sectors, ragged share {args.ragged_share:g},"
        f" Student-t df {args.df:g}, {args.pairs} injected pairs (injected universe);"
        f" max_lag = {args.max_lag}, min_overlap = {args.min_overlap}"
    )
    load_before = os.getloadavg()
    start = time.perf_counter()
    results = run(args)
    elapsed = time.perf_counter() - start
    load_after = os.getloadavg()
    print(
        f"# {elapsed:.0f} s; load average (1, 5, 15 min) before {load_before[0]:.2f}"
        f" {load_before[1]:.2f} {load_before[2]:.2f}, after {load_after[0]:.2f}"
        f" {load_after[1]:.2f} {load_after[2]:.2f}"
    )
    print()
    print_report(results)


if __name__ == "__main__":
    main()
