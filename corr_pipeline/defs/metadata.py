"""What each asset shows in the Dagster UI: numeric metadata (plotted across partitions),
markdown previews and pictures, built from a step's results and its :class:`StageStats`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dagster as dg
import numpy as np

from corr_pipeline.db.window import TOO_FEW_RETURNS, ZERO_VARIANCE, ReturnsWindow
from corr_pipeline.snapshot import markdown
from corr_pipeline.snapshot.measure import StageStats
from corr_pipeline.snapshot.verify import CorrelationStats, Verdict

if TYPE_CHECKING:
    from corr_pipeline.compute.dask_runner import DaskRunner


def number(value: float) -> dg.FloatMetadataValue:
    """A float metadata value; NaN where the value is not finite."""
    return dg.MetadataValue.float(float(value) if math.isfinite(value) else float("nan"))


def stage(stats: StageStats) -> dict[str, Any]:
    """``stage_seconds``, ``peak_rss_mib``, ``rss_anon_mib`` of the step."""
    return {key: dg.MetadataValue.float(float(value)) for key, value in stats.metadata().items()}


def log_stage(context: dg.AssetExecutionContext, label: str, stats: StageStats) -> None:
    """One log line with the step's time and peak RSS."""
    peak = f", peak RSS {stats.peak_rss_mib:.0f} MiB" if stats.peak_rss_mib is not None else ""
    context.log.info(f"{label}: {stats.seconds:.2f}s{peak}")


def dask_cluster(context: dg.AssetExecutionContext, runner: DaskRunner | None) -> dict[str, Any]:
    """``dask_dashboard`` (the cluster's dashboard URL) and ``dask_workers`` when the step's
    stripes run on a Dask cluster, logged once; nothing on threads. The step's ``peak_rss_mib``
    is then the client's: the stripes' memory is the workers' (see the dashboard)."""
    if runner is None:
        return {}
    workers = runner.n_workers
    context.log.info(f"stripes on the Dask cluster {runner.dashboard_link} ({workers} workers)")
    return {
        "dask_dashboard": dg.MetadataValue.url(runner.dashboard_link),
        "dask_workers": dg.MetadataValue.int(workers),
    }


def pictures(
    context: dg.AssetExecutionContext, what: str, make: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Picture metadata from ``make`` (see :mod:`corr_pipeline.defs.pictures`); a picture that
    cannot be drawn is logged as a warning and left out: it never fails the asset."""
    try:
        return make()
    except Exception as exc:  # a picture is a nicety, the asset's data is what matters
        context.log.warning(f"{what} picture skipped: {type(exc).__name__}: {exc}")
        return {}


def returns_window(window: ReturnsWindow, verdict: Verdict, stats: StageStats) -> dict[str, Any]:
    """The window: symbols kept and dropped (by reason), bad prices, T, its dates, load phases."""
    R = window.returns
    return {
        "n_symbols": dg.MetadataValue.int(len(window.symbols)),
        "n_dropped": dg.MetadataValue.int(len(window.dropped)),
        "n_dropped_too_few_returns": dg.MetadataValue.int(
            window.drop_counts.get(TOO_FEW_RETURNS, 0)
        ),
        "n_dropped_zero_variance": dg.MetadataValue.int(window.drop_counts.get(ZERO_VARIANCE, 0)),
        "bad_prices": dg.MetadataValue.int(int(window.bad_prices)),
        "n_returns": dg.MetadataValue.int(int(R.shape[0])),
        "n_price_rows": dg.MetadataValue.int(int(window.n_price_rows)),
        "as_of_trade_date": dg.MetadataValue.text(window.as_of_trade_date.isoformat()),
        "window": dg.MetadataValue.text(f"{window.dates[0]} .. {window.dates[-1]}"),
        "missing_return_share": number(verdict.metadata.get("missing_return_share", 0.0)),
        "dropped_symbols": dg.MetadataValue.md(markdown.dropped_symbols(window.dropped)),
        **{f"load_{k}": dg.MetadataValue.float(round(v, 3)) for k, v in window.timings.items()},
        **stage(stats),
    }


def correlation(
    n: int, corr_stats: CorrelationStats, stats: StageStats, check_stats: StageStats
) -> dict[str, Any]:
    """Mean |corr|, share of defined pairs, largest off-diagonal |corr|, time of the checks."""
    total = corr_stats.pairs_total
    defined_share = corr_stats.pairs_defined / total if total else 0.0
    return {
        "n_symbols": dg.MetadataValue.int(n),
        "mean_abs_corr": number(corr_stats.mean_abs_corr),
        "defined_pair_share": number(defined_share),
        "max_abs_offdiag_corr": number(corr_stats.max_abs_offdiag),
        "check_seconds": dg.MetadataValue.float(round(check_stats.seconds, 3)),
        **stage(stats),
    }


def overlap(n: int, corr_stats: CorrelationStats, dtype: np.dtype) -> dict[str, Any]:
    """Mean overlap and the overlap dtype."""
    return {
        "n_symbols": dg.MetadataValue.int(n),
        "mean_overlap": number(corr_stats.mean_overlap),
        "dtype": dg.MetadataValue.text(str(dtype)),
    }


def neighbors(n: int, k: int, verdict: Verdict, stats: StageStats) -> dict[str, Any]:
    """Neighbors published, fill rate, rows short of k."""
    return {
        "n_symbols": dg.MetadataValue.int(n),
        "k": dg.MetadataValue.int(k),
        "neighbors_published": dg.MetadataValue.int(int(verdict.metadata["neighbors_published"])),
        "fill_rate": number(verdict.metadata["fill_rate"]),
        "rows_short_of_k": dg.MetadataValue.int(int(verdict.metadata["rows_short_of_k"])),
        **stage(stats),
    }


def clusters(
    labels: np.ndarray, symbols: list[str], verdict: Verdict, stats: StageStats
) -> dict[str, Any]:
    """Number of clusters, the largest, singletons, and the largest clusters' first members."""
    facts = verdict.metadata
    return {
        "n_symbols": dg.MetadataValue.int(len(symbols)),
        "n_clusters": dg.MetadataValue.int(int(facts.get("n_clusters", 0))),
        "largest_cluster_size": dg.MetadataValue.int(int(facts.get("largest_cluster_size", 0))),
        "n_singletons": dg.MetadataValue.int(int(facts.get("n_singletons", 0))),
        "largest_clusters": dg.MetadataValue.md(markdown.largest_clusters(labels, symbols)),
        **stage(stats),
    }


def lead_lag(pairs: np.ndarray, symbols: list[str], stats: StageStats) -> dict[str, Any]:
    """Number of pairs, the strongest ones, the largest and median improvement (the recall of
    injected pairs on synthetic data is the ``injected_pairs_found`` check's)."""
    out: dict[str, Any] = {
        "n_pairs": dg.MetadataValue.int(int(pairs.shape[0])),
        "n_symbols": dg.MetadataValue.int(len(symbols)),
        "strongest_pairs": dg.MetadataValue.md(markdown.strongest_pairs(pairs, symbols)),
        **stage(stats),
    }
    if pairs.shape[0]:
        out["max_improvement"] = number(float(pairs["improvement"].max()))
        out["median_improvement"] = number(float(np.median(pairs["improvement"])))
    return out
