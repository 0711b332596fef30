"""Benchmarks of the nightly chain (issue 6): ``corr-pipeline bench`` and ``benchmarks/*.py``.

Two measurements, both printing a machine line and the git commit:

* :func:`run_pipeline_benchmark` — the whole chain on a synthetic universe
  (:mod:`corr_pipeline.synth_model`, written into PostgreSQL with
  :func:`~corr_pipeline.db.synth.write_synthetic_universe`, which **replaces** ``prices``), then
  the functions the Dagster assets call, in this process, stage after stage: window load (SPEC §2)
  → correlation + overlap memory-mapped into a matrix store (§3, §8) → neighbors (§4) → clusters
  (§5) → lead-lag with the synchronous corr read from the map (§6) → publish, one transaction
  (§7). Per stage: wall seconds, peak RSS, peak RssAnon, rows published.
* :func:`run_publish_benchmark` — publish alone, on results of realistic size and dtypes made
  directly with numpy (:func:`synthetic_results`), timed per phase and per table.

Memory (Linux ``/proc/self/status``, read with
:func:`corr_pipeline.defs.instrumentation.read_proc_status_kib`): *peak RSS* is the kernel's
``VmHWM`` after resetting it at the start of the stage (``/proc/self/clear_refs``; if that is
not permitted, the sampled maximum of ``VmRSS``); it counts the memory-mapped matrix pages the
stage touched. *Peak RssAnon* (anonymous memory: heap, numpy temporaries, what the working
memory budget governs) is sampled every 10 ms by a thread (:class:`PeakMemory`). Both are the
whole process's figures, so they include the interpreter and what earlier stages still hold;
with Dagster's multiprocess executor every stage is its own process.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.schema import PUBLISHED_TABLES
from corr_pipeline.defs.instrumentation import read_proc_status_kib, reset_peak_rss

__all__ = [
    "PIPELINE_STAGES",
    "MemoryPeak",
    "PeakMemory",
    "PipelineBenchReport",
    "PublishBenchReport",
    "StageResult",
    "SyntheticResults",
    "git_commit",
    "machine_line",
    "run_pipeline_benchmark",
    "run_publish_benchmark",
    "synthetic_results",
]

#: Stage names, in the order the nightly chain runs them.
PIPELINE_STAGES = ("load window", "correlation", "neighbors", "clusters", "lead-lag", "publish")

#: Average-linkage cut used by the benchmark (distance = 1 − corr; SPEC §5).
BENCH_DISTANCE_THRESHOLD = 1.2


# ------------------------------------------------------------------------------------------
# machine, commit, memory sampling
# ------------------------------------------------------------------------------------------


def machine_line() -> str:
    """CPU model, cores, memory, numpy version, and load average, for benchmark tables."""
    model = platform.processor() or "unknown cpu"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        load = f", load {os.getloadavg()[0]:.1f}"
    except OSError:
        load = ""
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, numpy {np.__version__}{load}"


def git_commit() -> str:
    """Short hash of the checkout this package is imported from, or ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


@dataclass
class MemoryPeak:
    """Peaks above the level at entry, MiB."""

    rss_mib: float
    anon_mib: float


class PeakMemory:
    """Context manager sampling the process's RssAnon and VmRSS peaks (KiB) every ``interval`` s.

    ``peak_anon`` / ``peak_rss``: the highest values seen (including at entry and exit);
    ``base_anon`` / ``base_rss``: the values at entry; :attr:`above`: the peaks above entry.
    When the kernel lets us reset ``VmHWM`` at entry, ``peak_rss`` also takes ``VmHWM`` at exit,
    the exact peak rather than a sample.
    """

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._hwm_reset = False
        self.base_anon = 0
        self.base_rss = 0
        self.peak_anon = 0
        self.peak_rss = 0

    def _read(self) -> None:
        status = read_proc_status_kib(("VmRSS", "RssAnon"))
        self.peak_anon = max(self.peak_anon, status.get("RssAnon", 0))
        self.peak_rss = max(self.peak_rss, status.get("VmRSS", 0))

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self) -> PeakMemory:
        self._hwm_reset = reset_peak_rss()
        status = read_proc_status_kib(("VmRSS", "RssAnon"))
        self.base_anon = self.peak_anon = status.get("RssAnon", 0)
        self.base_rss = self.peak_rss = status.get("VmRSS", 0)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
        if self._hwm_reset:
            self.peak_rss = max(self.peak_rss, read_proc_status_kib(("VmHWM",)).get("VmHWM", 0))

    @property
    def above(self) -> MemoryPeak:
        """Peaks above the entry level, MiB."""
        return MemoryPeak(
            (self.peak_rss - self.base_rss) / 1024, (self.peak_anon - self.base_anon) / 1024
        )


# ------------------------------------------------------------------------------------------
# whole chain
# ------------------------------------------------------------------------------------------


@dataclass
class StageResult:
    """One stage: wall seconds, peak RSS / RssAnon (MiB), rows it contributes to publication
    (None for stages that publish nothing), and a note."""

    name: str
    seconds: float
    peak_rss_mib: float
    peak_anon_mib: float
    rows: int | None = None
    note: str = ""


@dataclass
class PipelineBenchReport:
    """Everything :func:`run_pipeline_benchmark` measured; :meth:`table` renders it."""

    machine: str
    commit: str
    params: dict[str, Any]
    stages: list[StageResult] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)
    synth_seconds: float | None = None

    @property
    def total_seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    def table(self) -> str:
        """Markdown table, one row per stage plus the total."""
        lines = [
            "| stage | wall s | peak RSS MiB | peak RssAnon MiB | rows published | note |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for s in self.stages:
            rows = "-" if s.rows is None else f"{s.rows:,}"
            lines.append(
                f"| {s.name} | {s.seconds:.1f} | {s.peak_rss_mib:,.0f} | {s.peak_anon_mib:,.0f}"
                f" | {rows} | {s.note} |"
            )
        peak_anon = max((s.peak_anon_mib for s in self.stages), default=0.0)
        lines.append(f"| **total** | **{self.total_seconds:.1f}** | | {peak_anon:,.0f} (max) | | |")
        return "\n".join(lines)


def _stage_line(stage: StageResult) -> str:
    rows = "" if stage.rows is None else f"  rows {stage.rows:,}"
    return (
        f"  {stage.name:<12} {stage.seconds:8.1f} s  peak RSS {stage.peak_rss_mib:8,.0f} MiB"
        f"  peak RssAnon {stage.peak_anon_mib:8,.0f} MiB{rows}  {stage.note}"
    ).rstrip()


def run_pipeline_benchmark(
    engine: sa.Engine,
    store_root: Path,
    *,
    n: int,
    t: int,
    max_lag: int = 5,
    k: int = 10,
    working_memory_mb: float = 256,
    seed: int = 11,
    synth: bool = True,
    keep_matrices: bool = False,
    echo: Callable[[str], None] = print,
) -> PipelineBenchReport:
    """Run the whole chain once on ``engine`` (see the module docstring) and return the figures.

    ``synth``: first replace ``prices`` (and ``synthetic_lead_lag_truth``) with the synthetic
    universe of ``n`` symbols × ``t + 1`` days (seed ``seed``); not timed as a nightly stage.
    ``False`` reuses the prices already there. The snapshot is published for the synthetic
    universe's last date (:data:`corr_pipeline.synth_model.DEFAULT_END_DATE`), replacing any
    earlier snapshot of that date. ``min_overlap = max(2, min(60, t // 4))`` and
    ``min_history_days = 2 · min_overlap``; clusters: average linkage cut at distance
    :data:`BENCH_DISTANCE_THRESHOLD`; ``k`` is k_neighbors = k_leaders = k_laggers.
    The correlation and overlap maps go to a :class:`~corr_pipeline.store.matrix_store.MatrixStore`
    under ``store_root`` and are deleted at the end unless ``keep_matrices``. Each stage's line
    is passed to ``echo`` as soon as it finishes.
    """
    from corr_pipeline.compute import (
        find_lead_lag_pairs,
        hierarchical_clusters,
        pairwise_correlation,
        top_k_neighbors,
    )
    from corr_pipeline.compute.tiling import overlap_dtype
    from corr_pipeline.db.publish import publish_snapshot
    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.db.window import load_returns_window
    from corr_pipeline.store.matrix_store import MatrixStore
    from corr_pipeline.synth_model import DEFAULT_END_DATE

    min_overlap = max(2, min(60, t // 4))
    params = {
        "n": n,
        "t": t,
        "max_lag": max_lag,
        "k": k,
        "working_memory_mb": working_memory_mb,
        "min_overlap": min_overlap,
        "seed": seed,
    }
    report = PipelineBenchReport(machine=machine_line(), commit=git_commit(), params=params)
    echo(f"# {report.machine}; commit {report.commit}")
    echo("# " + ", ".join(f"{key} = {value}" for key, value in params.items()))
    if synth:
        start = time.perf_counter()
        written = write_synthetic_universe(engine, n_symbols=n, n_days=t + 1, seed=seed)
        report.synth_seconds = time.perf_counter() - start
        echo(
            f"synth   {written.rows_written:,} price rows written in {report.synth_seconds:.1f} s"
            " (not part of the nightly run)"
        )
    snapshot = DEFAULT_END_DATE
    partition = snapshot.isoformat()
    store = MatrixStore(store_root)
    state: dict[str, Any] = {}

    def load() -> tuple[int | None, str]:
        window = load_returns_window(
            engine, snapshot, lookback_days=t, min_history_days=2 * min_overlap
        )
        state["window"] = window
        return None, f"T x N = {window.returns.shape[0]} x {window.returns.shape[1]}"

    def correlation() -> tuple[int | None, str]:
        returns = state["window"].returns
        cols = returns.shape[1]
        pending_corr = store.allocate("correlation_matrix", partition, "corr", (cols, cols), "f4")
        pending_overlap = store.allocate(
            "overlap_matrix", partition, "overlap", (cols, cols), overlap_dtype(returns.shape[0])
        )
        pairwise_correlation(
            returns,
            min_overlap=min_overlap,
            working_memory_mb=working_memory_mb,
            out_corr=pending_corr.array,
            out_overlap=pending_overlap.array,
        )
        state["corr"] = pending_corr.commit().array
        state["overlap"] = pending_overlap.commit().array
        size = (state["corr"].nbytes + state["overlap"].nbytes) / 2**30
        return None, f"{size:.2f} GiB memory-mapped"

    def neighbors() -> tuple[int | None, str]:
        found = top_k_neighbors(
            state["corr"], k=k, overlap=state["overlap"], working_memory_mb=working_memory_mb
        )
        state["neighbors"] = found
        return int(np.count_nonzero(found.index >= 0)), f"k = {k}"

    def clusters() -> tuple[int | None, str]:
        labels = hierarchical_clusters(
            state["corr"], method="average", distance_threshold=BENCH_DISTANCE_THRESHOLD
        )
        state["labels"] = labels
        return int(labels.size), f"{int(labels.max()) + 1:,} clusters"

    def lead_lag() -> tuple[int | None, str]:
        pairs = find_lead_lag_pairs(
            state["window"].returns,
            max_lag=max_lag,
            k_leaders=k,
            k_laggers=k,
            min_overlap=min_overlap,
            corr=state["corr"],
            working_memory_mb=working_memory_mb,
        )
        state["pairs"] = pairs
        return int(pairs.size), f"max_lag = {max_lag}"

    def publish() -> tuple[int | None, str]:
        window, found = state["window"], state["neighbors"]
        published = publish_snapshot(
            engine,
            snapshot_date=snapshot,
            as_of_trade_date=window.as_of_trade_date,
            symbols=window.symbols,
            n_dropped=len(window.dropped),
            lookback_days=t,
            params={"benchmark": True, **params},
            neighbor_index=found.index,
            neighbor_corr=found.corr,
            neighbor_overlap=found.overlap,
            cluster_labels=state["labels"],
            lead_lag_pairs=state["pairs"],
        )
        report.published = dict(published.rows)
        note = ", ".join(f"{table} {count:,}" for table, count in published.rows.items())
        return sum(published.rows.values()), note

    steps = (load, correlation, neighbors, clusters, lead_lag, publish)
    try:
        for name, fn in zip(PIPELINE_STAGES, steps, strict=True):
            with PeakMemory() as memory:
                start = time.perf_counter()
                rows, note = fn()
                seconds = time.perf_counter() - start
            stage = StageResult(
                name, seconds, memory.peak_rss / 1024, memory.peak_anon / 1024, rows, note
            )
            report.stages.append(stage)
            echo(_stage_line(stage))
    finally:
        state.clear()  # drop the memory maps before deleting their files
        if not keep_matrices:
            store.delete("correlation_matrix", partition, "corr")
            store.delete("overlap_matrix", partition, "overlap")
    echo(f"  {'total':<12} {report.total_seconds:8.1f} s")
    return report


# ------------------------------------------------------------------------------------------
# publish alone
# ------------------------------------------------------------------------------------------


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
    from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
    from corr_pipeline.compute.tiling import overlap_dtype

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
    Both dates' snapshots are deleted afterwards (through ``publish``'s own tables).
    """
    from corr_pipeline.db.publish import publish_snapshot

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
            published = publish_snapshot(
                engine,
                snapshot_date=day,
                as_of_trade_date=day,
                symbols=results.symbols,
                n_dropped=0,
                lookback_days=t,
                params={"benchmark": "publish"},
                neighbor_index=results.neighbor_index,
                neighbor_corr=results.neighbor_corr,
                neighbor_overlap=results.neighbor_overlap,
                cluster_labels=results.labels,
                lead_lag_pairs=results.pairs,
            )
            reports.append(
                PublishBenchReport(label, published.seconds, published.rows, published.timings)
            )
            phases = "  ".join(f"{name} {value:.2f}" for name, value in published.timings.items())
            echo(f"  {label:<22} {published.seconds:6.2f} s   {phases}")
    finally:
        with engine.begin() as conn:
            for table in PUBLISHED_TABLES[::-1]:
                conn.execute(
                    sa.text(f"DELETE FROM {table} WHERE snapshot_date BETWEEN :a AND :b"),
                    {"a": snapshot_date - dt.timedelta(days=1), "b": snapshot_date},
                )
    return reports
