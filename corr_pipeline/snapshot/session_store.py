"""Where one session's matrices live while :class:`~corr_pipeline.snapshot.chain.SessionChain`
computes it: one partition of a matrix store (SPEC §8).

The chain allocates its large outputs there (filled in place, committed without a copy), asks
it for the clustering's scratch distances, saves each step's bundle there (the next step reads
the stored bundle and records its versions), and loads the inputs a session does not compute.
The benchmark uses :class:`SessionStore` as it is; the Dagster op's
(:mod:`corr_pipeline.defs.session_store`) holds every partition it touches until its step ends
and keeps what each save reports for the asset's materialization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from corr_pipeline.store.matrix_store import (
    BundleWriteReport,
    MatrixBundle,
    MatrixStore,
    PendingArray,
)

__all__ = ["SessionStore"]


@dataclass
class SessionStore:
    """Session ``partition`` of ``store``; ``in_memory``: in the store's memory area when it has
    room (:mod:`corr_pipeline.store.memory`). :meth:`hold` and :meth:`saved` are where a caller
    hooks in (nothing here)."""

    store: MatrixStore
    partition: str

    def hold(self, asset: str) -> None:
        """Called before the chain uses ``asset``'s directory of the partition."""

    def saved(self, asset: str, report: BundleWriteReport) -> None:
        """Called with what storing ``asset``'s bundle did."""

    def allocate(
        self,
        asset: str,
        name: str,
        shape: Sequence[int],
        dtype: np.dtype,
        *,
        labels: Mapping[str, Any],
        params: Mapping[str, Any],
        in_memory: bool,
    ) -> PendingArray:
        """An output array of ``asset`` to fill in place, then commit."""
        self.hold(asset)
        return self.store.allocate(
            asset,
            self.partition,
            name,
            shape,
            dtype,
            labels=labels,
            params=params,
            in_memory=in_memory,
        )

    def scratch(
        self, asset: str, name: str, shape: Sequence[int], dtype: np.dtype, *, in_memory: bool
    ) -> AbstractContextManager[np.ndarray]:
        """A writable working array of ``asset``'s partition, deleted when the block ends."""
        self.hold(asset)
        return self.store.scratch(asset, self.partition, name, shape, dtype, in_memory=in_memory)

    def save(self, asset: str, bundle: MatrixBundle, *, in_memory: bool) -> MatrixBundle:
        """Store ``bundle`` as ``asset``'s current bundle; the stored bundle (read-only maps,
        with their versions)."""
        self.hold(asset)
        report = self.store.save_bundle(asset, self.partition, bundle, in_memory=in_memory)
        self.saved(asset, report)
        return report.bundle

    def load(self, asset: str) -> MatrixBundle:
        """``asset``'s current bundle (held first when there is one)."""
        if self.store.files.partition_dir(asset, self.partition).is_dir():
            self.hold(asset)
        return self.store.load_bundle(asset, self.partition)
