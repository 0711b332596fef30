"""The whole nightly chain on a synthetic universe, stage after stage, in this process.

The universe (:mod:`corr_pipeline.synth`) is written into PostgreSQL with
:func:`~corr_pipeline.db.synth.write_synthetic_universe`, which **replaces** ``prices``; then
the steps of :mod:`corr_pipeline.snapshot.steps` run in order: window load (SPEC §2) →
correlation + overlap memory-mapped into a matrix store (§3, §8) → neighbors (§4) → clusters
(§5) → lead-lag with the synchronous corr read from the map (§6) → publish, one transaction
(§7). After the window is loaded, the GEMM floor of that window (:mod:`.floor`: ``R0.T @ R0`` on
the same T × N returns, zero-filled, best of 7) is timed in the same process, and every stage's
seconds are also given in floors (for lead-lag also per lag: floors / max_lag). Per stage: wall
seconds, peak RSS (``VmHWM`` reset at the start of the stage; it counts
the memory-mapped pages the stage touched) and the sampled peak of RssAnon (anonymous memory,
what the working-memory budget governs). Both are the whole process's figures, so they include
the interpreter and what earlier stages still hold; with Dagster's multiprocess executor every
stage is its own process. With ``checks`` the chain also runs the verifications the assets run
(:mod:`corr_pipeline.snapshot.verify`) where they run them: the correlation's as a stage of its own
("correlation checks"), those of the neighbors, clusters and lead-lag pairs inside their stages.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.bench.floor import GemmFloor, measure_floor
from corr_pipeline.bench.machine import git_commit, machine_line
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB, overlap_dtype
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.snapshot import steps, verify
from corr_pipeline.snapshot.measure import fix_mmap_threshold, measure_stage
from corr_pipeline.snapshot.params import DEFAULTS, SnapshotParameters
from corr_pipeline.store.matrix_store import (
    MatrixBundle,
    MatrixStore,
    PendingArray,
    StoredArray,
)
from corr_pipeline.synth import DEFAULT_END_DATE

#: Stage names, in the order the nightly chain runs them.
PIPELINE_STAGES = ("load window", "correlation", "neighbors", "clusters", "lead-lag", "publish")

#: The stage of the correlation's checks, after "correlation", when the chain runs the checks.
CORRELATION_CHECKS = "correlation checks"

#: Average-linkage cut used by the benchmark (Mantegna distance; SPEC §5).
BENCH_DISTANCE_THRESHOLD = 1.2

#: Seconds between two samples of RssAnon.
SAMPLE_INTERVAL = 0.01


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
    """Everything :func:`run_pipeline_benchmark` (or ``corr-pipeline bench --through-dagster``)
    measured; :meth:`table` renders it. ``floor``: the GEMM floor of the benchmarked window
    (None when not measured); ``run_seconds``: the wall time of a whole Dagster run, whose steps
    may overlap (None in this process, where the total is the sum of the stages)."""

    machine: str
    commit: str
    params: dict[str, Any]
    stages: list[StageResult] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)
    synth_seconds: float | None = None
    floor: GemmFloor | None = None
    run_seconds: float | None = None

    @property
    def total_seconds(self) -> float:
        if self.run_seconds is not None:
            return self.run_seconds
        return sum(stage.seconds for stage in self.stages)

    def floors(self, seconds: float) -> str:
        """``seconds / floor seconds`` to two decimals, ``-`` without a floor."""
        return "-" if self.floor is None else f"{self.floor.ratio(seconds):,.2f}"

    def note_floors_per_lag(self, stage: StageResult, max_lag: int) -> None:
        """Add the lead-lag stage's floors per lag (floors / ``max_lag``) to its note."""
        if self.floor is not None:
            stage.note += f"; {self.floor.ratio(stage.seconds) / max_lag:,.2f} floors per lag"

    def table(self) -> str:
        """The floor line (when measured), then a markdown table, one row per stage plus the
        total; ``floors`` = the stage's wall seconds / the floor's seconds."""
        lines = [f"# {self.floor.line()}"] if self.floor is not None else []
        lines += [
            "| stage | wall s | floors | peak RSS MiB | peak RssAnon MiB | rows published | note |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for s in self.stages:
            rows = "-" if s.rows is None else f"{s.rows:,}"
            lines.append(
                f"| {s.name} | {s.seconds:.1f} | {self.floors(s.seconds)} | {s.peak_rss_mib:,.0f}"
                f" | {s.peak_anon_mib:,.0f} | {rows} | {s.note} |"
            )
        peak_anon = max((s.peak_anon_mib for s in self.stages), default=0.0)
        lines.append(
            f"| **total** | **{self.total_seconds:.1f}** | {self.floors(self.total_seconds)} | "
            f"| {peak_anon:,.0f} (max) | | {'' if self.run_seconds is None else 'run wall time'} |"
        )
        return "\n".join(lines)


def _require(verdict: verify.Verdict) -> None:
    """Raise when a verification failed: the benchmark's results must be the pipeline's."""
    if not verdict.passed:
        raise RuntimeError("a check failed: " + "; ".join(verdict.problems))


def _stage_line(stage: StageResult, floors: str) -> str:
    rows = "" if stage.rows is None else f"  rows {stage.rows:,}"
    ratio = "" if floors == "-" else f" = {floors:>8} floors"
    return (
        f"  {stage.name:<12} {stage.seconds:8.1f} s{ratio}  peak RSS {stage.peak_rss_mib:8,.0f}"
        f" MiB  peak RssAnon {stage.peak_anon_mib:8,.0f} MiB{rows}  {stage.note}"
    ).rstrip()


def bench_parameters(
    t: int,
    *,
    max_lag: int,
    k: int,
    working_memory_mb: float,
    clusters_memory_mb: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SnapshotParameters:
    """The snapshot parameters of the benchmark: ``lookback_days = t``,
    ``min_overlap = max(2, min(60, t // 4))``, ``min_history_days = 2 · min_overlap``,
    ``k`` = k_neighbors = k_leaders = k_laggers, average linkage cut at
    :data:`BENCH_DISTANCE_THRESHOLD`, the pipeline's defaults for the rest, then
    ``overrides`` (``{name: value}`` of snapshot parameters); ``clusters_memory_mb`` None: the
    parameters' default."""
    min_overlap = max(2, min(60, t // 4))
    chosen: dict[str, Any] = {
        "lookback_days": t,
        "min_history_days": 2 * min_overlap,
        "min_overlap": min_overlap,
        "k_neighbors": k,
        "max_lag": max_lag,
        "k_leaders": k,
        "k_laggers": k,
        "linkage_method": "average",
        "distance_threshold": BENCH_DISTANCE_THRESHOLD,
        "working_memory_mb": working_memory_mb,
        "clusters_memory_mb": (
            DEFAULTS.clusters_memory_mb if clusters_memory_mb is None else clusters_memory_mb
        ),
    }
    return SnapshotParameters(**{**chosen, **(overrides or {})})


def start_benchmark(
    engine: sa.Engine,
    *,
    n: int,
    t: int,
    max_lag: int,
    k: int,
    working_memory_mb: float,
    seed: int,
    synth: bool,
    echo: Callable[[str], None],
    how: str = "",
    clusters_memory_mb: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[SnapshotParameters, PipelineBenchReport]:
    """The start of a whole-chain benchmark: its parameters (:func:`bench_parameters`), an
    empty report, the machine and parameter lines (``how`` appended to the latter), and with
    ``synth`` the synthetic universe of ``n`` symbols × ``t + 1`` days (seed ``seed``) written
    into ``engine``'s ``prices`` (timed apart, not a nightly stage)."""
    params = bench_parameters(
        t,
        max_lag=max_lag,
        k=k,
        working_memory_mb=working_memory_mb,
        clusters_memory_mb=clusters_memory_mb,
        overrides=overrides,
    )
    shown: dict[str, Any] = {
        "n": n,
        "t": t,
        "max_lag": max_lag,
        "k": k,
        "working_memory_mb": working_memory_mb,
        "clusters_memory_mb": params.clusters_memory_mb,
        "market_modes_removed": params.market_modes_removed,
        "lead_lag_market_modes": params.lead_lag_market_modes,
        "max_q_value": float(params.max_q_value),
        "min_overlap": params.min_overlap,
        "seed": seed,
    }
    report = PipelineBenchReport(machine=machine_line(), commit=git_commit(), params=shown)
    echo(f"# {report.machine}; commit {report.commit}")
    echo("# " + ", ".join(f"{key} = {value}" for key, value in shown.items()) + how)
    if synth:
        start = time.perf_counter()
        written = write_synthetic_universe(engine, n_symbols=n, n_days=t + 1, seed=seed)
        report.synth_seconds = time.perf_counter() - start
        echo(
            f"synth   {written.rows_written:,} price rows written in {report.synth_seconds:.1f} s"
            " (not part of the nightly run)"
        )
    return params, report


def run_pipeline_benchmark(
    engine: sa.Engine,
    store_root: Path,
    *,
    n: int,
    t: int,
    max_lag: int = 5,
    k: int = 10,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    clusters_memory_mb: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    seed: int = 11,
    synth: bool = True,
    keep_matrices: bool = False,
    floor: bool = True,
    echo: Callable[[str], None] = print,
    day: dt.date | None = None,
    checks: bool = False,
    in_memory: bool = False,
) -> PipelineBenchReport:
    """Run the whole chain once on ``engine`` (see the module docstring) and return the figures.

    ``synth``: first replace ``prices`` (and the synthetic truth) with the synthetic universe of
    ``n`` symbols × ``t + 1`` days (seed ``seed``); not timed as a nightly stage. ``False``
    reuses the prices already there. The snapshot is published for ``day`` (default the
    synthetic universe's last date, :data:`corr_pipeline.synth.DEFAULT_END_DATE`), replacing any
    earlier snapshot of that date; parameters: :func:`bench_parameters`. The correlation and overlap maps go to a
    :class:`~corr_pipeline.store.matrix_store.MatrixStore` under ``store_root`` and are deleted
    at the end unless ``keep_matrices`` (then saved as bundles labelled with the window's
    symbols, as the pipeline saves them; also when a stage fails or Ctrl-C interrupts it: the
    temp files of an unfinished correlation are removed as well). ``floor``: time the GEMM
    floor of the loaded window (:func:`~corr_pipeline.bench.floor.measure_floor`, not a stage:
    between the window load and the correlation, holding 4 N² bytes for a moment) and give
    every stage in floors. ``checks``: run the assets' verifications too (module docstring).
    ``in_memory``: the correlation and overlap go to the store's memory area when it has room,
    as a session that retention will not keep does in the pipeline. The clusters' scratch
    distances go there in any case, as in the pipeline.
    Each stage's line is passed to ``echo`` as soon as it finishes.
    """
    params, report = start_benchmark(
        engine,
        n=n,
        t=t,
        max_lag=max_lag,
        k=k,
        working_memory_mb=working_memory_mb,
        clusters_memory_mb=clusters_memory_mb,
        overrides=overrides,
        seed=seed,
        synth=synth,
        echo=echo,
    )
    fix_mmap_threshold()  # as the pipeline's op does
    chain = _Chain(
        engine,
        MatrixStore(store_root),
        day or DEFAULT_END_DATE,
        params,
        report,
        checks=checks,
        in_memory=in_memory,
    )
    try:
        for name, run_stage in chain.stages():
            with measure_stage(sample_interval=SAMPLE_INTERVAL) as stats:
                rows, note = run_stage()
            stage = StageResult(
                name,
                stats.seconds,
                stats.peak_rss_mib or 0.0,
                stats.peak_anon_mib or 0.0,
                rows,
                note,
            )
            if name == "lead-lag":
                report.note_floors_per_lag(stage, max_lag)
            report.stages.append(stage)
            echo(_stage_line(stage, report.floors(stage.seconds)))
            if name == "load window" and floor:
                report.floor = measure_floor(chain.window.returns)
                echo(f"# {report.floor.line()}")
    finally:
        # also on Ctrl-C (KeyboardInterrupt) and any error: the matrices (gigabytes at large N)
        # never outlive the benchmark unless asked to
        chain.close(keep_matrices=keep_matrices)
    total = report.floors(report.total_seconds)
    echo(
        f"  {'total':<12} {report.total_seconds:8.1f} s"
        + ("" if total == "-" else f" = {total:>8} floors")
    )
    return report


Stage = Callable[[], tuple[int | None, str]]


class _Chain:
    """One session of the chain, stage by stage (:meth:`stages`), each stage returning the rows
    it contributes to publication (None for none) and a note; what a stage produces is kept
    for the next ones. ``checks`` and ``in_memory``: :func:`run_pipeline_benchmark`'s."""

    def __init__(
        self,
        engine: sa.Engine,
        store: MatrixStore,
        day: dt.date,
        params: SnapshotParameters,
        report: PipelineBenchReport,
        *,
        checks: bool,
        in_memory: bool,
    ) -> None:
        self.engine, self.store, self.day, self.params, self.report = (
            engine,
            store,
            day,
            params,
            report,
        )
        self.partition = day.isoformat()
        self.checks, self.in_memory = checks, in_memory
        self.state: dict[str, Any] = {}
        self.committed: dict[str, StoredArray] = {}

    @property
    def window(self) -> Any:
        return self.state["window"]

    def stages(self) -> list[tuple[str, Stage]]:
        """The stages in the order of :data:`PIPELINE_STAGES`, with the correlation's checks
        after the correlation when ``checks``."""
        stages: list[tuple[str, Stage]] = list(
            zip(
                PIPELINE_STAGES,
                (
                    self.load,
                    self.correlation,
                    self.neighbors,
                    self.clusters,
                    self.lead_lag,
                    self.publish,
                ),
                strict=True,
            )
        )
        if self.checks:
            stages.insert(2, (CORRELATION_CHECKS, self.correlation_checks))
        return stages

    def load(self) -> tuple[int | None, str]:
        window = steps.load_returns(self.engine, self.day, self.params)
        self.state["window"] = window
        return None, f"T x N = {window.returns.shape[0]} x {window.returns.shape[1]}"

    def _allocate(self, asset: str, name: str, cols: int, dtype: Any) -> PendingArray:
        return self.store.allocate(
            asset,
            self.partition,
            name,
            (cols, cols),
            dtype,
            labels={"symbols": list(self.window.symbols)},  # as the pipeline labels them
            in_memory=self.in_memory,
        )

    def correlation(self) -> tuple[int | None, str]:
        returns = self.window.returns
        cols = returns.shape[1]
        # with-blocks: an exception or Ctrl-C mid-computation deletes both temp files at once
        with (
            self._allocate("correlation_matrix", "corr", cols, "f4") as p_corr,
            self._allocate(
                "overlap_matrix", "overlap", cols, overlap_dtype(returns.shape[0])
            ) as p_ov,
        ):
            steps.correlation(returns, self.params, out_corr=p_corr.array, out_overlap=p_ov.array)
            self.committed["correlation_matrix"] = p_corr.commit()
            self.committed["overlap_matrix"] = p_ov.commit()
        corr = self.state["corr"] = self.committed["correlation_matrix"].array
        overlap = self.state["overlap"] = self.committed["overlap_matrix"].array
        return None, f"{(corr.nbytes + overlap.nbytes) / 2**30:.2f} GiB memory-mapped"

    def correlation_checks(self) -> tuple[int | None, str]:
        stats = verify.correlation_stats(
            self.state["corr"],
            self.state["overlap"],
            min_overlap=self.params.min_overlap,
            finite_counts=np.isfinite(self.window.returns).sum(axis=0),
        )
        for verdict in verify.verify_correlation(stats).values():
            _require(verdict)
        return None, f"{stats.pairs_defined:,} pairs defined"

    def neighbors(self) -> tuple[int | None, str]:
        corr, overlap = self.state["corr"], self.state["overlap"]
        found = self.state["neighbors"] = steps.neighbors(corr, overlap, self.params)
        if self.checks:
            k = self.params.k_neighbors
            _require(
                verify.verify_neighbors(
                    found.index,
                    found.corr,
                    corr,
                    k=k,
                    neighbor_overlap=found.overlap,
                    overlap=overlap,
                )
            )
        return int(np.count_nonzero(found.index >= 0)), f"k = {self.params.k_neighbors}"

    def clusters(self) -> tuple[int | None, str]:
        scratch = partial(self.store.scratch, "clusters", self.partition, in_memory=True)
        modes = steps.market_modes(self.state["corr"], self.params)
        self.state["modes"] = modes
        labels = steps.clusters(self.state["corr"], self.params, modes=modes, scratch=scratch)
        self.state["labels"] = labels
        if self.checks:
            _require(verify.verify_clusters(labels, labels.size))
        removed = f", {self.params.market_modes_removed} mode(s) removed"
        return int(labels.size), f"{int(labels.max()) + 1:,} clusters" + removed

    def lead_lag(self) -> tuple[int | None, str]:
        params = self.params
        pairs = steps.lead_lag(
            self.window.returns, self.state["corr"], params, modes=self.state.get("modes")
        )
        self.state["pairs"] = pairs
        if self.checks:
            _require(
                verify.verify_lead_lag_pairs(
                    pairs,
                    self.state["corr"].shape[0],
                    max_lag=params.max_lag,
                    min_overlap=params.min_overlap,
                    min_improvement=params.min_improvement,
                    max_q_value=params.max_q_value,
                )
            )
        return int(pairs.size), (
            f"max_lag = {params.max_lag}, {params.lead_lag_market_modes} mode(s) removed, "
            f"q <= {params.max_q_value:g}"
        )

    def publish(self) -> tuple[int | None, str]:
        window = self.window
        results = steps.results_for_publication(
            self.day,
            as_of_trade_date=window.as_of_trade_date,
            symbols=window.symbols,
            n_dropped=len(window.dropped),
            params=self.params,
            found=self.state["neighbors"],
            labels=self.state["labels"],
            pairs=self.state["pairs"],
            recorded={"benchmark": True, **self.report.params},
        )
        published = publish_snapshot(self.engine, results)
        self.report.published = dict(published.rows)
        note = ", ".join(f"{table} {count:,}" for table, count in published.rows.items())
        return sum(published.rows.values()), note

    def close(self, *, keep_matrices: bool) -> None:
        """Drop the memory maps, then save the matrices as bundles (``keep_matrices``) or remove
        the partition, temp files of an unfinished correlation included."""
        self.state.clear()
        store, partition = self.store, self.partition
        if keep_matrices:
            for asset, stored in self.committed.items():
                bundle = MatrixBundle({stored.name: stored}, labels=stored.labels)
                store.save_bundle(asset, partition, bundle)
            return
        for stored in self.committed.values():
            stored.release_writer_lock()
        self.committed.clear()
        assets = ("correlation_matrix", "overlap_matrix")
        if any(store.files.partition_dir(asset, partition).is_dir() for asset in assets):
            store.collector.remove_partition(partition)
