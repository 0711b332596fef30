"""The snapshot's output: what one session publishes (SPEC §7), handed to
:func:`corr_pipeline.db.publish.publish_snapshot`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corr_pipeline.compute.suspect import SuspectSymbol

__all__ = ["SnapshotResults"]


@dataclass(frozen=True)
class SnapshotResults:
    """What one snapshot publishes (SPEC §7), the value handed to
    :func:`corr_pipeline.db.publish.publish_snapshot`.

    ``symbols``: the N kept symbols (column order of every index below). ``neighbor_index``
    (int, N × k, −1 = padding), ``neighbor_corr`` (float, N × k), ``neighbor_overlap``
    (int, N × k): SPEC §4 top-k. ``cluster_labels``: int, N (SPEC §5). ``lead_lag_pairs``:
    structured array with :data:`corr_pipeline.db.publish.LEAD_LAG_FIELDS`, leader/lagger as
    indices into ``symbols`` (SPEC §6). ``params``: JSON-able run parameters stored as jsonb. ``matrix_versions``:
    the matrix-store versions the results were computed from, ``{asset: {array: version}}``
    (SPEC §8; e.g. ``{"correlation_matrix": {"corr": "<version>"}, ...}``), stored in
    ``snapshots.matrix_versions``; None (NULL) when no store is involved. ``suspects``: the
    window's suspect prices (SPEC §2), stored in ``suspect_prices``.
    """

    snapshot_date: dt.date | str
    as_of_trade_date: dt.date | str
    symbols: Sequence[str]
    n_dropped: int
    lookback_days: int
    params: Mapping[str, Any]
    neighbor_index: Any
    neighbor_corr: Any
    neighbor_overlap: Any
    cluster_labels: Any
    lead_lag_pairs: Any
    matrix_versions: Mapping[str, Mapping[str, str]] | None = None
    suspects: Sequence[SuspectSymbol] = ()
