"""Tiny partitioned assets exercising MatrixStoreIOManager (used by test_io_manager.py).

Module-level so that the multiprocess executor can reconstruct the job in step subprocesses.
"""

import dagster as dg
import numpy as np

from corr_pipeline.defs.io_manager import MatrixStoreIOManager, MatrixStoreResource
from corr_pipeline.store.matrix_store import MatrixBundle, sources

PARTITIONS = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-02-01")
SYMBOLS = ["AAA", "BBB", "CCC"]


def partition_day(partition_key: str) -> int:
    return int(partition_key[-2:])


@dg.asset(partitions_def=PARTITIONS)
def returns_matrix(context: dg.AssetExecutionContext) -> MatrixBundle:
    """Plain in-memory arrays: the IO manager copies them into the store."""
    day = partition_day(context.partition_key)
    returns = np.arange(12, dtype=np.float32).reshape(4, 3) + day
    return MatrixBundle(
        {"returns": returns, "valid": np.isfinite(returns)},
        labels={"symbols": SYMBOLS, "partition": context.partition_key},
        params={"day": day},
    )


@dg.asset(partitions_def=PARTITIONS)
def correlation_matrix(
    context: dg.AssetExecutionContext,
    matrix_store: MatrixStoreResource,
    returns_matrix: MatrixBundle,
) -> dg.MaterializeResult:
    """Allocates its output inside the store (zero-copy hand-off) and records what it saw."""
    R = returns_matrix["returns"]
    seen = {
        "input_is_memmap": isinstance(R, np.memmap),
        "input_read_only": not R.flags.writeable,
        "input_labels": returns_matrix.labels,
        "input_versions": returns_matrix.versions,
    }
    n = R.shape[1]
    with matrix_store.allocate_for(
        context, "corr", (n, n), np.float32, labels={"symbols": returns_matrix.labels["symbols"]}
    ) as corr:
        corr.array[:] = np.corrcoef(np.asarray(R, dtype=np.float64), rowvar=False)
        stored = corr.commit()
    return dg.MaterializeResult(
        value=MatrixBundle(
            {"corr": stored, "returns_sum": np.asarray(R.sum(axis=0))},
            labels=returns_matrix.labels,
            inputs=sources(returns_matrix),
        ),
        metadata={"seen": dg.MetadataValue.json(seen)},
    )


@dg.multi_asset(
    partitions_def=PARTITIONS,
    outs={
        "neighbors": dg.AssetOut(),
        "clusters": dg.AssetOut(),
    },
    ins={"correlation_matrix": dg.AssetIn()},
)
def neighbors_and_clusters(correlation_matrix: MatrixBundle):
    corr = correlation_matrix["corr"]
    order = np.argsort(-np.abs(corr), axis=1, kind="stable").astype(np.int32)
    return (
        MatrixBundle({"index": order}, labels=correlation_matrix.labels),
        MatrixBundle({"labels": np.zeros(corr.shape[0], np.int32)}),
    )


ASSETS = [returns_matrix, correlation_matrix, neighbors_and_clusters]


def multiprocess_job() -> dg.JobDefinition:
    """returns_matrix -> correlation_matrix on the multiprocess executor (the store from the
    environment, which every step process inherits)."""
    defs = dg.Definitions(
        assets=ASSETS,
        resources={
            "io_manager": MatrixStoreIOManager(),
            "matrix_store": MatrixStoreResource(),
        },
        jobs=[
            dg.define_asset_job(
                "matrix_store_mp_job",
                selection=dg.AssetSelection.assets(returns_matrix, correlation_matrix),
                executor_def=dg.multiprocess_executor.configured({"max_concurrent": 2}),
            )
        ],
    )
    return defs.resolve_job_def("matrix_store_mp_job")
