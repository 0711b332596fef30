"""Matrix store: atomic memory-mapped .npy + JSON sidecar (SPEC §8), without Dagster (its IO
manager is :mod:`corr_pipeline.defs.io_manager`)."""

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
