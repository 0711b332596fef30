"""What each asset shows in the Dagster UI: numeric metadata (plotted across partitions),
markdown previews and pictures, built from a step's results and its :class:`StageStats`.

Every float is rounded by the rules of :mod:`corr_pipeline.snapshot.display` (correlations to 4
decimals, shares to 4 significant digits, seconds to 0.01 s, MiB to 0.1) and stays a
``FloatMetadataValue``, so the UI keeps plotting it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dagster as dg
import numpy as np

from corr_pipeline.db.schema import DRIFT_COLUMNS
from corr_pipeline.db.window import SUSPECT_PRICES, TOO_FEW_RETURNS, ZERO_VARIANCE, ReturnsWindow
from corr_pipeline.defs import ranges
from corr_pipeline.snapshot import direction, display, markdown, session_gap
from corr_pipeline.snapshot.measure import StageStats, measure_stage
from corr_pipeline.snapshot.verify import CorrelationStats, Verdict

if TYPE_CHECKING:
    from corr_pipeline.compute.market_modes import MarketModes
    from corr_pipeline.compute.parallel.dask_runner import DaskRunner
    from corr_pipeline.snapshot.params import SnapshotParameters


def number(value: float, rule: Callable[[Any], float]) -> dg.FloatMetadataValue:
    """``value`` rounded by ``rule`` (one of :mod:`corr_pipeline.snapshot.display`'s), as a float
    metadata value; NaN where the value is not finite."""
    return dg.MetadataValue.float(rule(value))


def stage(stats: StageStats) -> dict[str, Any]:
    """``stage_seconds``, ``peak_rss_mib``, ``rss_anon_mib`` of the step (rounded by
    :meth:`StageStats.metadata`)."""
    return {key: dg.MetadataValue.float(float(value)) for key, value in stats.metadata().items()}


@contextmanager
def measured(
    context: dg.AssetExecutionContext, label: str | Callable[[], str]
) -> Iterator[StageStats]:
    """The scaffolding of every stage: time and measure the ``with`` body
    (:func:`~corr_pipeline.snapshot.measure.measure_stage`), then log one line with its time and
    peak RSS (:func:`corr_pipeline.defs.ranges.log`). ``label``: the line's subject, or a
    function giving it after the body (to name what the body found)."""
    with measure_stage() as stats:
        yield stats
    ranges.log(context, stage_line(label() if callable(label) else label, stats))


def stage_line(label: str, stats: StageStats) -> str:
    """``label: 1.23s, peak RSS 456 MiB``: a stage's log line."""
    peak = f", peak RSS {stats.peak_rss_mib:.0f} MiB" if stats.peak_rss_mib is not None else ""
    return f"{label}: {stats.seconds:.2f}s{peak}"


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
    context: dg.AssetExecutionContext,
    what: str,
    make: Callable[[], dict[str, Any]],
    session: str | None = None,
) -> dict[str, Any]:
    """Picture metadata from ``make`` (see :mod:`corr_pipeline.defs.pictures`); a picture that
    cannot be drawn is logged as a warning and left out: it never fails the asset. In a run
    over a range of sessions (a backfill), only the newest ``session``'s pictures are drawn: a
    picture costs 0.1-0.6 s, more than a small universe's whole session, while the numeric
    metadata of every session is there (and plotted across partitions)."""
    if session is not None and not context.has_partition_key:
        if session != max(context.partition_keys):
            return {}
    try:
        return make()
    except Exception as exc:  # a picture is a nicety, the asset's data is what matters
        context.log.warning(f"{what} picture skipped: {type(exc).__name__}: {exc}")
        return {}


def returns_window(window: ReturnsWindow, verdict: Verdict, stats: StageStats) -> dict[str, Any]:
    """The window: symbols kept and dropped (by reason), suspect prices (SPEC §2: how many, and
    each with its zero-return share, largest |return| and reason), bad prices, T, its dates,
    load phases."""
    R = window.returns
    return {
        "n_symbols": dg.MetadataValue.int(len(window.symbols)),
        "n_dropped": dg.MetadataValue.int(len(window.dropped)),
        "n_dropped_too_few_returns": dg.MetadataValue.int(
            window.drop_counts.get(TOO_FEW_RETURNS, 0)
        ),
        "n_dropped_zero_variance": dg.MetadataValue.int(window.drop_counts.get(ZERO_VARIANCE, 0)),
        "n_dropped_suspect_prices": dg.MetadataValue.int(window.drop_counts.get(SUSPECT_PRICES, 0)),
        "n_suspect_symbols": dg.MetadataValue.int(len(window.suspects)),
        "bad_prices": dg.MetadataValue.int(int(window.bad_prices)),
        "n_returns": dg.MetadataValue.int(int(R.shape[0])),
        "n_price_rows": dg.MetadataValue.int(int(window.n_price_rows)),
        "as_of_trade_date": dg.MetadataValue.text(window.as_of_trade_date.isoformat()),
        "window": dg.MetadataValue.text(f"{window.dates[0]} .. {window.dates[-1]}"),
        "missing_return_share": number(
            verdict.metadata.get("missing_return_share", 0.0), display.share
        ),
        "dropped_symbols": dg.MetadataValue.md(markdown.dropped_symbols(window.dropped)),
        "suspect_symbols": dg.MetadataValue.md(markdown.suspect_symbols(window.suspects)),
        **{f"load_{k}": number(v, display.seconds) for k, v in window.timings.items()},
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
        "mean_abs_corr": number(corr_stats.mean_abs_corr, display.corr),
        "defined_pair_share": number(defined_share, display.share),
        "max_abs_offdiag_corr": number(corr_stats.max_abs_offdiag, display.corr),
        "check_seconds": number(check_stats.seconds, display.seconds),
        **stage(stats),
    }


def overlap(n: int, corr_stats: CorrelationStats, dtype: np.dtype) -> dict[str, Any]:
    """Mean overlap and the overlap dtype."""
    return {
        "n_symbols": dg.MetadataValue.int(n),
        "mean_overlap": number(corr_stats.mean_overlap, display.mean_count),
        "dtype": dg.MetadataValue.text(display.dtype_text(dtype)),
    }


def neighbors(n: int, k: int, verdict: Verdict, stats: StageStats) -> dict[str, Any]:
    """Neighbors published, fill rate, rows short of k."""
    return {
        "n_symbols": dg.MetadataValue.int(n),
        "k": dg.MetadataValue.int(k),
        "neighbors_published": dg.MetadataValue.int(int(verdict.metadata["neighbors_published"])),
        "fill_rate": number(verdict.metadata["fill_rate"], display.share),
        "rows_short_of_k": dg.MetadataValue.int(int(verdict.metadata["rows_short_of_k"])),
        **stage(stats),
    }


def clusters(
    labels: np.ndarray,
    symbols: list[str],
    verdict: Verdict,
    stats: StageStats,
    modes: MarketModes,
    params: SnapshotParameters,
) -> dict[str, Any]:
    """Number of clusters, the largest, singletons (``n_singletons`` clusters of one symbol and
    ``singleton_share``, their share of the symbols: high when most correlations left are weaker
    than the cut, as with the market modes removed), the largest clusters' first members, and the
    market modes (SPEC §5): ``market_mode_share`` ``λ_1 / N`` (plotted across partitions: it
    rises when everything moves together), ``market_modes_removed`` ``m`` and, for ``m > 0``,
    ``removed_modes_share`` ``Σ_{k<=m} λ_k / N``."""
    facts = verdict.metadata
    out: dict[str, Any] = {
        "n_symbols": dg.MetadataValue.int(len(symbols)),
        "n_clusters": dg.MetadataValue.int(int(facts.get("n_clusters", 0))),
        "largest_cluster_size": dg.MetadataValue.int(int(facts.get("largest_cluster_size", 0))),
        "n_singletons": dg.MetadataValue.int(int(facts.get("n_singletons", 0))),
        "singleton_share": number(facts.get("singleton_share", 0.0), display.share),
        "largest_clusters": dg.MetadataValue.md(markdown.largest_clusters(labels, symbols)),
        "market_modes_removed": dg.MetadataValue.int(int(params.market_modes_removed)),
    }
    share = modes.share
    if share.size:
        out["market_mode_share"] = number(share[0], display.share)
    if params.market_modes_removed and share.size:
        removed = share[: params.market_modes_removed].sum()
        out["removed_modes_share"] = number(removed, display.share)
    return {**out, **stage(stats)}


#: The q-value levels of the ``significant_pairs_q*`` metadata of ``lead_lag_pairs``.
SIGNIFICANCE_LEVELS = {"significant_pairs_q05": 0.05, "significant_pairs_q01": 0.01}


def significant_pairs(pairs: np.ndarray) -> dict[str, int]:
    """``significant_pairs_q05`` / ``significant_pairs_q01``: how many of ``pairs`` have a
    ``q_value`` (Benjamini–Hochberg, SPEC §6 "Significance") at most 0.05 / 0.01; a NaN
    q-value counts as not significant."""
    q_value = np.asarray(pairs["q_value"], dtype=np.float64)
    return {
        key: int(np.count_nonzero(q_value <= level)) for key, level in SIGNIFICANCE_LEVELS.items()
    }


def lead_lag(
    pairs: np.ndarray, symbols: list[str], stats: StageStats, *, max_q_value: float = 1.0
) -> dict[str, Any]:
    """Number of pairs; ``significant_pairs``, how many have ``q_value <= max_q_value`` (the
    snapshot's parameter, SPEC §6 "Significance"), and ``two_way_pairs``, how many have a
    reverse pair ``(lagger, leader)`` significant at it too (SPEC §6 "Direction": the lag shows
    both ways; :mod:`corr_pipeline.snapshot.direction`), with ``max_q_value`` itself; how many
    are significant at q <= 0.05 and q <= 0.01 (:func:`significant_pairs`), all plotted across
    partitions; the strongest ones (two-way marked ``⇄`` with the reverse lag and q-value), the
    largest and median improvement (the recall of injected pairs on synthetic data is the
    ``injected_pairs_found`` check's)."""
    out: dict[str, Any] = {
        "n_pairs": dg.MetadataValue.int(int(pairs.shape[0])),
        "significant_pairs": dg.MetadataValue.int(direction.count_significant(pairs, max_q_value)),
        "two_way_pairs": dg.MetadataValue.int(direction.count_two_way(pairs, max_q_value)),
        "max_q_value": dg.MetadataValue.float(float(max_q_value)),
        **{key: dg.MetadataValue.int(count) for key, count in significant_pairs(pairs).items()},
        "n_symbols": dg.MetadataValue.int(len(symbols)),
        "strongest_pairs": dg.MetadataValue.md(
            markdown.strongest_pairs(pairs, symbols, max_q_value=max_q_value)
        ),
        **stage(stats),
    }
    if pairs.shape[0]:
        out["max_improvement"] = number(pairs["improvement"].max(), display.corr)
        out["median_improvement"] = number(np.median(pairs["improvement"]), display.corr)
    return out


def changes(
    results: Any, summary: dict[str, Any], rows: dict[str, Any], stats: StageStats
) -> dict[str, Any]:
    """The changes against the previous session (SPEC §10): the session compared with
    (``previous_date``, ``sessions_between`` the calendar's sessions between the two, an int
    plotted across partitions and left out when unknown, and ``compared_with`` in words, which
    the markdown previews repeat when the changes are not overnight), the drift as floats
    (plotted across partitions), counts of every kind of change, the largest moves and the
    symbols with the largest neighbor turnover as markdown, the parts skipped."""
    between = results.sessions_between
    compared = session_gap.compared_with(results.previous_date, between)
    # a markdown preview opened on its own says too that the changes span a gap
    heading = "" if session_gap.is_overnight(between) else f"**{markdown.escape(compared)}**\n\n"
    out: dict[str, Any] = {
        "previous_date": dg.MetadataValue.text(results.previous_date.isoformat()),
        **({} if between is None else {"sessions_between": dg.MetadataValue.int(int(between))}),
        "compared_with": dg.MetadataValue.text(compared),
        "n_common": dg.MetadataValue.int(int(summary["n_common"])),
        "n_entered": dg.MetadataValue.int(int(summary["n_entered"])),
        "n_left": dg.MetadataValue.int(int(summary["n_left"])),
    }
    for key in DRIFT_COLUMNS:
        if summary[key] is not None:
            out[key] = number(summary[key], display.corr)
    quantiles = summary["quantiles"]
    if quantiles is not None and 0.5 in quantiles["levels"]:
        median = quantiles["levels"].index(0.5)
        out["median_corr"] = number(quantiles["corr_today"][median], display.corr)
        out["median_abs_corr"] = number(quantiles["abs_corr_today"][median], display.corr)
    if summary["n_pairs"] is not None:
        out["n_pairs_compared"] = dg.MetadataValue.int(int(summary["n_pairs"]))
        out["largest_moves"] = dg.MetadataValue.md(
            heading + markdown.largest_moves(rows["change_pairs"])
        )
    migrations = results.clusters
    lead_lag = results.lead_lag
    out.update(
        {
            "n_moved_symbols": dg.MetadataValue.int(int(migrations.moved.sum())),
            "n_clusters_appeared": dg.MetadataValue.int(int((migrations.match_today < 0).sum())),
            "n_clusters_vanished": dg.MetadataValue.int(int((migrations.match_previous < 0).sum())),
            "n_clusters_split": dg.MetadataValue.int(int(migrations.split.sum())),
            "n_clusters_merged": dg.MetadataValue.int(int(migrations.merged.sum())),
            "n_lead_lag_appeared": dg.MetadataValue.int(int(lead_lag.appeared.size)),
            "n_lead_lag_vanished": dg.MetadataValue.int(int(lead_lag.vanished.size)),
            "n_lead_lag_lag_changed": dg.MetadataValue.int(int(lead_lag.changed_today.size)),
            "largest_turnover": dg.MetadataValue.md(
                heading
                + markdown.largest_turnover(
                    results.match.common, results.new_neighbors, results.n_neighbors
                )
            ),
            "skipped": dg.MetadataValue.json(dict(summary["skipped"])),
        }
    )
    if results.n_neighbors.sum():
        out["neighbor_turnover"] = number(
            float(results.new_neighbors.sum() / results.n_neighbors.sum()), display.share
        )
    return {**out, **stage(stats)}
