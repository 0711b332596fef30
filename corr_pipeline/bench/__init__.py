"""Benchmarks of the nightly chain as a library: ``corr-pipeline bench`` and ``benchmarks/*.py``.

* :func:`run_pipeline_benchmark` (:mod:`.pipeline`): the whole chain on a synthetic universe,
  stage after stage, through the same steps as the Dagster assets
  (:mod:`corr_pipeline.snapshot.steps`), in this process: per stage wall seconds, peak RSS,
  peak RssAnon, rows published.
* :func:`measure_floor` (:mod:`.floor`): the GEMM floor ``R0.T @ R0`` every stage and kernel is
  compared with, timed in the same run.
* :class:`ProcessTreePeaks` (:mod:`.processes`): peak RssAnon and RSS of every process a run
  starts (Dagster's step processes), sampled from ``/proc``.
* :func:`run_publish_benchmark` (:mod:`.publish`): publication alone, on results of realistic
  size and dtypes made directly with numpy (:func:`synthetic_results`).
* :func:`~corr_pipeline.bench.cluster_cuts.run_cluster_cuts` (:mod:`.cluster_cuts`, run as
  ``python -m corr_pipeline.bench.cluster_cuts``): the singleton share and the adjusted Rand
  index against the true sectors of each dendrogram cut, with 0, 1 and 2 market modes removed.

Memory is measured with :class:`corr_pipeline.snapshot.measure.PeakMemory` (peak RSS from
``VmHWM``, peak RssAnon sampled every 10 ms).
"""

from corr_pipeline.bench.floor import FLOOR_REPEAT, GemmFloor, gemm_floor, measure_floor
from corr_pipeline.bench.machine import git_commit, machine_line
from corr_pipeline.bench.pipeline import (
    PIPELINE_STAGES,
    PipelineBenchReport,
    StageResult,
    run_pipeline_benchmark,
)
from corr_pipeline.bench.processes import ProcessPeak, ProcessTreePeaks
from corr_pipeline.bench.publish import (
    PublishBenchReport,
    SyntheticResults,
    run_publish_benchmark,
    synthetic_results,
)

__all__ = [
    "FLOOR_REPEAT",
    "GemmFloor",
    "PIPELINE_STAGES",
    "PipelineBenchReport",
    "ProcessPeak",
    "ProcessTreePeaks",
    "PublishBenchReport",
    "StageResult",
    "SyntheticResults",
    "gemm_floor",
    "git_commit",
    "machine_line",
    "measure_floor",
    "run_pipeline_benchmark",
    "run_publish_benchmark",
    "synthetic_results",
]
