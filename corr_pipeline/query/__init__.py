"""Answers for one symbol from the published snapshot (SPEC §7) and the matrix store (SPEC §8).

``snapshots(engine)``                   the published snapshots, newest first
``peers(engine, symbol, date)``         its top-k neighbors (``peer_neighbors``, SPEC §4)
``cluster(engine, symbol, date)``       its cluster id, the cluster's size and some members
                                        (``symbol_clusters``, SPEC §5)
``lead_lag(engine, symbol, date)``      the lead-lag pairs where it leads or lags
                                        (``lead_lag_pairs``, SPEC §6), each with its reverse
                                        pair and whether it is two-way (or, for a snapshot
                                        published before that was recorded, unknown)
``corr(engine, a, b, date, store=)``    ``corr[a, b]`` and ``overlap[a, b]`` (SPEC §3) of the
                                        published snapshot, one element of each memory-mapped
                                        matrix in the matrix store, at the versions the
                                        snapshot pins (SPEC §8), nothing recomputed
``corr_from_store(store, a, b, date)``  the same from the matrix store alone (no database)
``changes(engine, date)``               what changed since the previous session (SPEC §10):
                                        drift, largest moves, entered/left, counts
``symbol_changes(engine, s, date)``     one symbol's cluster move, neighbor turnover, lead-lag
                                        changes and largest correlation moves
``quality(engine, date)``               the snapshot's suspect prices (``suspect_prices``,
                                        SPEC §2): the screen's thresholds and each suspect
                                        symbol's zero-return share, largest |log return|, reason

``date=None`` means the latest snapshot. Each function returns a typed answer
(:mod:`~corr_pipeline.query.answers`) with ``.to_json()``; :func:`to_text` gives its text for a
terminal (fixed-width tables, :mod:`~corr_pipeline.query.render`). A question that cannot be
answered raises a :class:`QueryError` (:mod:`~corr_pipeline.query.errors`) whose message says
what to do. The command line ``corr-pipeline query ...`` is ``corr_pipeline.cli.query``.

Modules: ``published`` (SQL reads of the published tables, one database snapshot per answer),
``matrix`` (reads of the matrix store), ``answers`` (result types and JSON), ``render`` (text),
``errors`` (error types), ``symbols`` (close matches of a mistyped symbol), ``quality`` (the
suspect prices).
"""

from corr_pipeline.query.answers import (
    Answer,
    ChangesResult,
    ClusterResult,
    CorrResult,
    LeadLagResult,
    PeersResult,
    QualityResult,
    Snapshot,
    SnapshotsResult,
    SymbolChangesResult,
)
from corr_pipeline.query.changes import ChangesNotRecordedError, changes, symbol_changes
from corr_pipeline.query.errors import (
    MatricesPrunedError,
    MatrixUnavailableError,
    NoSnapshotError,
    QueryError,
    SnapshotNotFoundError,
    UnknownSymbolError,
)
from corr_pipeline.query.matrix import (
    CORR_ARRAY,
    CORR_ASSET,
    OVERLAP_ARRAY,
    OVERLAP_ASSET,
    corr,
    corr_from_store,
)
from corr_pipeline.query.published import (
    cluster,
    lead_lag,
    parse_date,
    parse_max_q,
    peers,
    snapshots,
)
from corr_pipeline.query.quality import QualityNotRecordedError, quality
from corr_pipeline.query.render import format_table, to_text
from corr_pipeline.query.symbols import close_matches, suggest_symbols

__all__ = [
    "CORR_ARRAY",
    "CORR_ASSET",
    "OVERLAP_ARRAY",
    "OVERLAP_ASSET",
    "Answer",
    "ChangesNotRecordedError",
    "ChangesResult",
    "ClusterResult",
    "CorrResult",
    "LeadLagResult",
    "MatricesPrunedError",
    "MatrixUnavailableError",
    "NoSnapshotError",
    "PeersResult",
    "QualityNotRecordedError",
    "QualityResult",
    "QueryError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotsResult",
    "SymbolChangesResult",
    "UnknownSymbolError",
    "changes",
    "close_matches",
    "cluster",
    "corr",
    "corr_from_store",
    "format_table",
    "lead_lag",
    "parse_date",
    "parse_max_q",
    "peers",
    "quality",
    "snapshots",
    "suggest_symbols",
    "symbol_changes",
    "to_text",
]
