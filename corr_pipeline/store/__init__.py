"""Matrix store (atomic memory-mapped .npy + JSON sidecar) and its Dagster IO manager (SPEC §8).

``corr_pipeline.store.matrix_store`` has no Dagster dependency; the IO manager and resource
live in ``corr_pipeline.store.io_manager``.
"""

from corr_pipeline.store.matrix_store import (
    BundleWriteReport,
    CorruptMatrixError,
    InvalidStoreKeyError,
    MatrixBundle,
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    MatrixStoreSpaceError,
    PendingArray,
    StoredArray,
)

__all__ = [
    "BundleWriteReport",
    "CorruptMatrixError",
    "InvalidStoreKeyError",
    "MatrixBundle",
    "MatrixNotFoundError",
    "MatrixStore",
    "MatrixStoreError",
    "MatrixStoreSpaceError",
    "PendingArray",
    "StoredArray",
]
