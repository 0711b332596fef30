"""What each step of :class:`~corr_pipeline.snapshot.chain.SessionChain` hands its caller: the
stored bundles, the arrays the caller describes, and the verdicts of :mod:`.verify` (None when
the chain runs without its verifications).

The Dagster op turns them into materializations and check results
(:mod:`corr_pipeline.defs.stages`), the benchmark into the rows of its table
(:mod:`corr_pipeline.bench.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.db.publish import PublishReport
from corr_pipeline.db.window import ReturnsWindow
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.snapshot.verify import CorrelationStats, Verdict
from corr_pipeline.store.matrix_store import MatrixBundle

__all__ = [
    "ClustersOutput",
    "CorrelationChecked",
    "CorrelationOutput",
    "LeadLagOutput",
    "NeighborsOutput",
    "PublicationOutput",
    "ReturnsOutput",
    "StepOutput",
    "StoredOutput",
]


@dataclass(frozen=True)
class StoredOutput:
    """A step's stored ``bundle`` and the verdict of its contract."""

    bundle: MatrixBundle
    verdict: Verdict | None


@dataclass(frozen=True)
class ReturnsOutput(StoredOutput):
    """The session's window (SPEC §2) as loaded; its ``returns_matrix`` bundle."""

    window: ReturnsWindow


@dataclass(frozen=True)
class CorrelationOutput:
    """The stored ``correlation_matrix`` and ``overlap_matrix`` (SPEC §3) of ``returns``."""

    returns: MatrixBundle
    corr: MatrixBundle
    overlap: MatrixBundle


@dataclass(frozen=True)
class CorrelationChecked:
    """The facts of the correlation and overlap (one pass over both) and the correlation's
    verdicts by name (:func:`~corr_pipeline.snapshot.verify.verify_correlation`)."""

    stats: CorrelationStats
    verdicts: dict[str, Verdict]


@dataclass(frozen=True)
class NeighborsOutput(StoredOutput):
    """The neighbors (SPEC §4); their ``top_k_neighbors`` bundle."""

    found: Neighbors


@dataclass(frozen=True)
class ClustersOutput(StoredOutput):
    """The cluster labels (SPEC §5) and the market modes found for them; their ``clusters``
    bundle."""

    labels: np.ndarray
    modes: MarketModes


@dataclass(frozen=True)
class LeadLagOutput(StoredOutput):
    """The lead-lag pairs (SPEC §6); their ``lead_lag_pairs`` bundle."""

    pairs: np.ndarray


@dataclass(frozen=True)
class PublicationOutput:
    """What was published (SPEC §7): the results, the store versions they pin, what
    :func:`~corr_pipeline.db.publish.publish_snapshot` reported, and (verified) the rows read
    back per table."""

    results: SnapshotResults
    versions: dict[str, dict[str, str]]
    report: PublishReport
    counts: dict[str, int] | None
    verdict: Verdict | None


StepOutput = (
    ReturnsOutput
    | CorrelationOutput
    | CorrelationChecked
    | NeighborsOutput
    | ClustersOutput
    | LeadLagOutput
    | PublicationOutput
)
