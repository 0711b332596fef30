"""The whole nightly chain on a synthetic universe, stage after stage, in this process.

The universe (:mod:`corr_pipeline.synth`) is written into PostgreSQL with
:func:`~corr_pipeline.db.synth.write_synthetic_universe`, which **replaces** ``prices``; then
the session's chain runs, the pipeline's own (:class:`corr_pipeline.snapshot.chain.SessionChain`):
window load (SPEC §2) → correlation + overlap memory-mapped into a matrix store (§3, §8) →
neighbors (§4) → clusters (§5) → lead-lag with the synchronous corr read from the map (§6) →
publish, one transaction (§7), each step's bundle stored as the op stores it and the publication
recorded as the op records it (its parameters, the window's facts, the store versions it pins).
After the window is loaded, the GEMM floor of that window (:mod:`.floor`: ``R0.T @ R0`` on
the same T × N returns, zero-filled, best of 7) is timed in the same process, and every stage's
seconds are also given in floors (for lead-lag also per lag: floors / max_lag). Per stage: wall
seconds, peak RSS (``VmHWM`` reset at the start of the stage; it counts
the memory-mapped pages the stage touched) and the sampled peak of RssAnon (anonymous memory,
what the working-memory budget governs). Both are the whole process's figures, so they include
the interpreter and what earlier stages still hold; with Dagster's multiprocess executor every
stage is its own process. With ``checks`` the chain also runs the verifications the assets run
(:mod:`corr_pipeline.snapshot.verify`) where they run them: the correlation's as a stage of its own
("correlation checks"), those of the window, neighbors, clusters, lead-lag pairs and published
rows inside their stages.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.bench.floor import GemmFloor, measure_floor
from corr_pipeline.bench.machine import git_commit, machine_line
from corr_pipeline.compute.tiling import DEFAULT_WORKING_MEMORY_MB
from corr_pipeline.db.synth import write_synthetic_universe
from corr_pipeline.snapshot import steps, verify
from corr_pipeline.snapshot.chain import SessionChain
from corr_pipeline.snapshot.measure import fix_mmap_threshold, measure_stage
from corr_pipeline.snapshot.params import DEFAULTS, SnapshotParameters
from corr_pipeline.snapshot.session_outputs import (
    ClustersOutput,
    CorrelationChecked,
    CorrelationOutput,
    LeadLagOutput,
    NeighborsOutput,
    PublicationOutput,
    ReturnsOutput,
    StepOutput,
)
from corr_pipeline.snapshot.session_store import SessionStore
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline.synth import DEFAULT_END_DATE

#: Stage names, in the order the nightly chain runs them.
PIPELINE_STAGES = ("load window", "correlation", "neighbors", "clusters", "lead-lag", "publish")

#: The stage of the correlation's checks, after "correlation", when the chain runs the checks.
CORRELATION_CHECKS = "correlation checks"

#: The benchmark's name of each step the chain yields, by the type of what it yields.
STAGE_NAMES: dict[type, str] = {
    ReturnsOutput: "load window",
    CorrelationOutput: "correlation",
    CorrelationChecked: CORRELATION_CHECKS,
    NeighborsOutput: "neighbors",
    ClustersOutput: "clusters",
    LeadLagOutput: "lead-lag",
    PublicationOutput: "publish",
}

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


def _require(verdict: verify.Verdict | None) -> None:
    """Raise when a verification failed (None: not run): the benchmark's results must be the
    pipeline's."""
    if verdict is not None and not verdict.passed:
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
    earlier snapshot of that date; parameters: :func:`bench_parameters`. Every step's bundle
    goes to a :class:`~corr_pipeline.store.matrix_store.MatrixStore` under ``store_root`` as the
    pipeline stores it (the correlation and overlap as memory maps, labelled with the window's
    symbols), and the session's partition is removed at the end unless ``keep_matrices`` (also
    when a stage fails or Ctrl-C interrupts it: the temp files of an unfinished correlation are
    removed as well). ``floor``: time the GEMM
    floor of the loaded window (:func:`~corr_pipeline.bench.floor.measure_floor`, not a stage:
    between the window load and the correlation, holding 4 N² bytes for a moment) and give
    every stage in floors. ``checks``: run the assets' verifications too (module docstring).
    ``in_memory``: the session's matrices go to the store's memory area when it has room, as
    a session's that retention will not keep do in the pipeline. The clusters' scratch
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
    day = day or DEFAULT_END_DATE
    store = MatrixStore(store_root)
    chain = SessionChain(
        day,
        params,
        SessionStore(store, day.isoformat()),
        engine,
        load_window=partial(steps.load_returns, engine, day, params),
        recorded={"benchmark": True, **report.params},
        warn=echo,
        in_memory=in_memory,
        verify=checks,
    )
    try:
        with closing(chain.run()) as outputs:
            while True:
                with measure_stage(sample_interval=SAMPLE_INTERVAL) as stats:
                    output = next(outputs, None)
                if output is None:
                    break
                rows, note = _rows_and_note(output, params)
                stage = StageResult(
                    STAGE_NAMES[type(output)],
                    stats.seconds,
                    stats.peak_rss_mib or 0.0,
                    stats.peak_anon_mib or 0.0,
                    rows,
                    note,
                )
                if isinstance(output, LeadLagOutput):
                    report.note_floors_per_lag(stage, max_lag)
                report.stages.append(stage)
                echo(_stage_line(stage, report.floors(stage.seconds)))
                if isinstance(output, ReturnsOutput) and floor:
                    report.floor = measure_floor(output.window.returns)
                    echo(f"# {report.floor.line()}")
                if isinstance(output, PublicationOutput):
                    report.published = dict(output.report.rows)
    finally:
        # also on Ctrl-C (KeyboardInterrupt) and any error: the matrices (gigabytes at large N)
        # never outlive the benchmark unless asked to; the maps go first
        chain.bundles.clear()
        chain.modes = output = None
        if not keep_matrices:
            _remove_matrices(store, day.isoformat())
    total = report.floors(report.total_seconds)
    echo(
        f"  {'total':<12} {report.total_seconds:8.1f} s"
        + ("" if total == "-" else f" = {total:>8} floors")
    )
    return report


def _rows_and_note(output: StepOutput, params: SnapshotParameters) -> tuple[int | None, str]:
    """The rows a stage contributes to publication (None for none) and its note; a failed
    verification raises."""
    if isinstance(output, ReturnsOutput):
        _require(output.verdict)
        returns = output.window.returns
        return None, f"T x N = {returns.shape[0]} x {returns.shape[1]}"
    if isinstance(output, CorrelationOutput):
        nbytes = output.corr["corr"].nbytes + output.overlap["overlap"].nbytes
        return None, f"{nbytes / 2**30:.2f} GiB memory-mapped"
    if isinstance(output, CorrelationChecked):
        for verdict in output.verdicts.values():
            _require(verdict)
        return None, f"{output.stats.pairs_defined:,} pairs defined"
    if isinstance(output, NeighborsOutput):
        _require(output.verdict)
        return int(np.count_nonzero(output.found.index >= 0)), f"k = {params.k_neighbors}"
    if isinstance(output, ClustersOutput):
        _require(output.verdict)
        labels = output.labels
        removed = f", {params.market_modes_removed} mode(s) removed"
        return int(labels.size), f"{int(labels.max()) + 1:,} clusters" + removed
    if isinstance(output, LeadLagOutput):
        _require(output.verdict)
        return int(output.pairs.size), (
            f"max_lag = {params.max_lag}, {params.lead_lag_market_modes} mode(s) removed, "
            f"q <= {params.max_q_value:g}"
        )
    _require(output.verdict)
    rows = output.report.rows
    return sum(rows.values()), ", ".join(f"{table} {count:,}" for table, count in rows.items())


def _remove_matrices(store: MatrixStore, partition: str) -> None:
    """Remove the benchmarked session's partition from the store, temp files of an unfinished
    correlation included."""
    if partition in store.files.partition_keys():
        store.collector.remove_partition(partition)
