"""The matrix store of one session of the snapshot op, as the chain uses it
(:class:`corr_pipeline.snapshot.session_store.SessionStore`), through the run's
:class:`~corr_pipeline.defs.io_manager.MatrixStoreResource`: every partition the step touches
stays held until it ends (retention and garbage collection leave it alone), each stored
bundle's facts (path, versions, bytes) are kept for its asset's materialization, and an input
the run does not compute and the store does not have fails the session saying what to
materialize.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from corr_pipeline.defs.io_manager import MatrixStoreResource, removed_line, stored_metadata
from corr_pipeline.snapshot.session_store import SessionStore
from corr_pipeline.store.matrix_store import BundleWriteReport, MatrixBundle, MatrixStoreError

__all__ = ["ResourceSessionStore"]


@dataclass
class ResourceSessionStore(SessionStore):
    """:class:`SessionStore` of the op's ``resource``, logging to ``context``; ``facts``: the
    stored-bundle metadata (:func:`~corr_pipeline.defs.io_manager.stored_metadata`) of each
    asset saved, by asset."""

    resource: MatrixStoreResource
    context: dg.AssetExecutionContext
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def hold(self, asset: str) -> None:
        self.resource.hold(self.store, asset, self.partition)

    def saved(self, asset: str, report: BundleWriteReport) -> None:
        self.facts[asset] = stored_metadata(report)
        if report.removed:
            self.context.log.info(removed_line(report))

    def load(self, asset: str) -> MatrixBundle:
        """An input the run does not compute, from the store (as the IO manager loads it);
        ``dg.Failure`` naming what to materialize when it is not there."""
        try:
            return super().load(asset)
        except MatrixStoreError as exc:
            raise dg.Failure(
                description=f"{asset} of {self.partition} is not in the matrix store ({exc}): "
                f"materialize {asset} with the assets that read it",
                allow_retries=False,
            ) from exc
