"""Publication alone (SPEC §7), on results of realistic size and dtypes made with numpy.

:func:`run_publish_benchmark` publishes :func:`synthetic_results` three times (a previous date,
a new date, the same date again) and prints the per-phase and per-table timings of
:func:`~corr_pipeline.db.publish.publish_snapshot`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from corr_pipeline.bench.machine import git_commit, machine_line
from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.publish import delete_snapshot, publish_snapshot
from corr_pipeline.snapshot.results import SnapshotResults


@dataclass
class SyntheticResults:
    """Publishable results with the pipeline's dtypes: ``symbols`` (sorted), neighbor arrays
    (N × k int32 / float32 / int16, ordered by |corr| descending), ``labels`` (int32), and
    ``pairs`` (the lead-lag structured array, sorted by improvement descending as the kernel
    returns it)."""

    symbols: list[str]
    neighbor_index: np.ndarray
    neighbor_corr: np.ndarray
    neighbor_overlap: np.ndarray
    labels: np.ndarray
    pairs: np.ndarray

    def to_results(self, day: dt.date, *, lookback_days: int) -> SnapshotResults:
        """These arrays as the publication of snapshot ``day``."""
        return SnapshotResults(
            snapshot_date=day,
            as_of_trade_date=day,
            symbols=self.symbols,
            n_dropped=0,
            lookback_days=lookback_days,
            params={"benchmark": "publish"},
            neighbor_index=self.neighbor_index,
            neighbor_corr=self.neighbor_corr,
            neighbor_overlap=self.neighbor_overlap,
            cluster_labels=self.labels,
            lead_lag_pairs=self.pairs,
        )

    @property
    def n_rows(self) -> dict[str, int]:
        return {
            "peer_neighbors": int(np.count_nonzero(self.neighbor_index >= 0)),
            "symbol_clusters": int(self.labels.size),
            "lead_lag_pairs": int(self.pairs.size),
        }


def synthetic_results(
    n: int, *, k: int = 10, t: int = 252, cluster_size: float = 6.7, seed: int = 0
) -> SyntheticResults:
    """Random results of the size the pipeline publishes for ``n`` symbols (no computation).

    Symbols: ticker-like, 1-7 characters. Neighbors: ``k`` distinct non-self indices per row. Clusters: about ``n / cluster_size``
    labels (6.7 is what the N = 24,000 factor model gives). Lead-lag: the union of ``k``
    laggers per leader and ``k`` leaders per lagger (≈ 2·n·k pairs, as SPEC §6's two top-k
    lists give when they rarely coincide), ~0.1 % NaN ``sync_corr``.
    """
    if n < 2 * k + 2:
        raise ValueError(f"n = {n} is too small for k = {k} distinct neighbors")
    rng = np.random.default_rng(seed)
    symbols = _ticker_symbols(n, rng)
    rows = np.arange(n)[:, None]

    def distinct_others(count: int) -> np.ndarray:
        steps = rng.integers(1, (n - 1) // count + 1, size=(n, count))
        return ((rows + np.cumsum(steps, axis=1)) % n).astype(np.int32)

    index = rng.permuted(distinct_others(k), axis=1)
    corr = np.sort(rng.uniform(0.2, 0.95, (n, k)).astype(np.float32), axis=1)[:, ::-1]
    corr = np.ascontiguousarray(
        corr * rng.choice(np.array([-1, 1], dtype=np.float32), (n, k), p=[0.05, 0.95])
    )
    overlap = rng.integers(max(2, t // 4), t + 1, (n, k)).astype(overlap_dtype(t))
    n_clusters = max(1, round(n / cluster_size))
    labels = np.concatenate([np.arange(n_clusters), rng.integers(0, n_clusters, n - n_clusters)])
    labels = rng.permutation(labels).astype(np.int32)

    leader = np.concatenate([np.repeat(np.arange(n), k), distinct_others(k).ravel()])
    lagger = np.concatenate([distinct_others(k).ravel(), np.repeat(np.arange(n), k)])
    _, first = np.unique(leader.astype(np.int64) * n + lagger, return_index=True)
    pairs = np.zeros(first.size, dtype=LEAD_LAG_DTYPE)
    pairs["leader"], pairs["lagger"] = leader[first], lagger[first]
    pairs["lag"] = rng.integers(1, 6, first.size)
    pairs["sync_corr"] = rng.uniform(-0.2, 0.4, first.size)
    pairs["improvement"] = rng.uniform(0.01, 0.5, first.size)
    pairs["lagged_corr"] = pairs["sync_corr"] + pairs["improvement"]
    pairs["sync_corr"][rng.random(first.size) < 0.001] = np.nan
    pairs["overlap"] = rng.integers(max(2, t // 4), t + 1, first.size)
    pairs["p_value"] = 10.0 ** -rng.uniform(0, 12, first.size)
    pairs["q_value"] = np.minimum(1.0, pairs["p_value"] * rng.uniform(1, 1e3, first.size))
    # the reverse direction: most pairs have one (NULL where they do not)
    back = rng.random(first.size) < 0.9
    pairs["reverse_lag"] = np.where(back, rng.integers(1, 6, first.size), 0)
    pairs["reverse_lagged_corr"] = np.where(back, rng.uniform(-0.5, 0.5, first.size), np.nan)
    pairs["reverse_q_value"] = np.where(back, rng.uniform(0, 1, first.size), np.nan)
    order = np.lexsort((pairs["lagger"], pairs["leader"], -pairs["improvement"].astype(np.float64)))
    return SyntheticResults(symbols, index, corr, overlap, labels, pairs[order])


def _ticker_symbols(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct ticker-like symbols, sorted by code point: 1-5 capital letters (mostly 3-4)
    and some with a class suffix (``BRK.B``-style), so the text columns vary in width."""
    letters = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)
    found: set[str] = set()
    while len(found) < n:
        m = 2 * (n - len(found)) + 16
        lengths = rng.choice([1, 2, 3, 4, 5], m, p=[0.01, 0.06, 0.33, 0.45, 0.15])
        codes = letters[rng.integers(0, 26, (m, 5))]
        for row, length, suffix in zip(codes, lengths, rng.random(m) < 0.03, strict=True):
            name = row[:length].tobytes().decode()
            found.add(f"{name}.{name[0]}" if suffix else name)
            if len(found) == n:
                break
    return sorted(found)


@dataclass
class PublishBenchReport:
    """One :func:`~corr_pipeline.db.publish.publish_snapshot` call: what it did and its timings."""

    label: str
    seconds: float
    rows: dict[str, int]
    timings: dict[str, float]


def run_publish_benchmark(
    engine: sa.Engine,
    *,
    n: int,
    k: int = 10,
    t: int = 252,
    seed: int = 0,
    snapshot_date: dt.date = dt.date(2001, 1, 2),
    echo: Callable[[str], None] = print,
) -> list[PublishBenchReport]:
    """Publish :func:`synthetic_results` three times and print the per-phase/per-table timings.

    1. ``snapshot_date − 1 day`` — so the tables already hold one snapshot, as on any night
       but the first; 2. ``snapshot_date``, a new date (the nightly case); 3. ``snapshot_date``
       again, replacing it (a re-materialized partition: the old rows are deleted first).
    Both dates' snapshots are deleted afterwards (:func:`~corr_pipeline.db.publish.delete_snapshot`).
    """
    results = synthetic_results(n, k=k, t=t, seed=seed)
    echo(f"# {machine_line()}; commit {git_commit()}")
    rows = results.n_rows
    echo(
        f"# publish N = {n:,}, k = {k}: "
        + ", ".join(f"{table} {count:,}" for table, count in rows.items())
        + f" ({sum(rows.values()):,} rows)"
    )
    runs = (
        ("previous date (setup)", snapshot_date - dt.timedelta(days=1)),
        ("new date", snapshot_date),
        ("replace same date", snapshot_date),
    )
    reports: list[PublishBenchReport] = []
    try:
        for label, day in runs:
            published = publish_snapshot(engine, results.to_results(day, lookback_days=t))
            reports.append(
                PublishBenchReport(label, published.seconds, published.rows, published.timings)
            )
            phases = "  ".join(f"{name} {value:.2f}" for name, value in published.timings.items())
            echo(f"  {label:<22} {published.seconds:6.2f} s   {phases}")
    finally:
        for day in sorted({day for _, day in runs}):
            delete_snapshot(engine, day)
    return reports
