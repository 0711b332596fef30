"""``corr[a, b]`` and ``overlap[a, b]`` (SPEC §3) read from the matrix store (SPEC §8).

``corr(engine, a, b, date, *, store=None)``  the snapshot date resolved among the published
                                             snapshots (SPEC §7); a date whose matrices are in
                                             the store but that is not published is still
                                             answered, flagged ``published=False``
``corr_from_store(store, a, b, date)``       dates from the matrix store alone (no database),
                                             always ``published=False``

One element of each memory-mapped matrix is read: nothing is recomputed and no row is loaded.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.query.answers import CorrResult, Snapshot
from corr_pipeline.query.errors import (
    MatrixUnavailableError,
    NoSnapshotError,
    SnapshotNotFoundError,
    UnknownSymbolError,
)
from corr_pipeline.query.published import (
    LATEST_SHOWN,
    consistent_read,
    parse_date,
    resolve_snapshot,
)
from corr_pipeline.query.symbols import suggest_symbols
from corr_pipeline.store.matrix_store import (
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    StoredArray,
)

__all__ = [
    "CORR_ARRAY",
    "CORR_ASSET",
    "OVERLAP_ARRAY",
    "OVERLAP_ASSET",
    "corr",
    "corr_from_store",
]

#: Where a snapshot's matrices live in the matrix store (the assets of ``corr_pipeline.defs``):
#: ``<store>/<asset>/<snapshot date>/<array>.npy`` with the symbols in the sidecar labels.
CORR_ASSET, CORR_ARRAY = "correlation_matrix", "corr"
OVERLAP_ASSET, OVERLAP_ARRAY = "overlap_matrix", "overlap"


def _default_store() -> MatrixStore:
    """The project's store (``settings.store_dir()``), which must exist."""
    base = settings.store_dir()
    if not base.is_dir():
        raise MatrixUnavailableError(
            f"the matrix store {base} does not exist: no correlation matrix has been "
            "computed with this CORR_PIPELINE_HOME / CORR_PIPELINE_STORE_DIR"
        )
    return MatrixStore(base, create=False)


def _store_partitions(store: MatrixStore) -> list[str]:
    """Partitions (snapshot dates) of the store holding a correlation matrix, oldest first."""
    return [p for p in store.partitions(CORR_ASSET) if store.exists(CORR_ASSET, p, CORR_ARRAY)]


def _symbol_index(symbols: Sequence[str], symbol: str) -> int | None:
    """Position of ``symbol`` in the sidecar's symbol list: bisect (the list is sorted by code
    point, SPEC §2), with a linear scan as the fallback should a list not be sorted."""
    i = bisect.bisect_left(symbols, symbol)
    if i < len(symbols) and symbols[i] == symbol:
        return i
    try:
        return list(symbols).index(symbol)
    except ValueError:
        return None


def corr(
    engine: sa.Engine,
    a: str,
    b: str,
    date: dt.date | str | None = None,
    *,
    store: MatrixStore | None = None,
) -> CorrResult:
    """``corr[a, b]`` and ``overlap[a, b]`` of the published snapshot of ``date`` (None: the
    latest), read from ``store`` (default: ``settings.store_dir()``).

    The date is resolved among the published snapshots (SPEC §7); when it has none, or
    nothing is published, matrices of that date (None: the newest) present in the store are
    still answered with ``published=False``. Raises :class:`MatrixUnavailableError` when a
    published snapshot's matrix is not in the store, :class:`UnknownSymbolError` (with close
    matches) for a symbol not in the matrix.
    """
    if store is None:
        store = _default_store()
    day = parse_date(date)
    snap: Snapshot | None = None
    with consistent_read(engine) as conn:
        try:
            snap = resolve_snapshot(conn, day)
        except (NoSnapshotError, SnapshotNotFoundError) as exc:
            # matrices computed but not (yet) published are still answerable
            keys = _store_partitions(store)
            key = day.isoformat() if day else (keys[-1] if keys else None)
            if key is None or key not in keys:
                raise exc from None
            day = dt.date.fromisoformat(key)
    if snap is not None:
        day = snap.snapshot_date
    assert day is not None  # resolved above, or raised
    partition = day.isoformat()
    try:
        stored = store.load(CORR_ASSET, partition, CORR_ARRAY)
    except MatrixNotFoundError:
        raise MatrixUnavailableError(
            f"the snapshot of {day} is published but its correlation matrix is not in the "
            f"matrix store {store.base_dir} ({CORR_ASSET}/{partition}/{CORR_ARRAY}.npy): was "
            "the store cleaned up, or does CORR_PIPELINE_STORE_DIR point elsewhere? "
            f"Re-materialize {CORR_ASSET} for {partition}"
        ) from None
    except MatrixStoreError as exc:
        raise MatrixUnavailableError(f"cannot read the correlation matrix: {exc}") from None
    return _element(store, stored, day, a, b, snap)


def corr_from_store(
    store: MatrixStore, a: str, b: str, date: dt.date | str | None = None
) -> CorrResult:
    """``corr[a, b]`` and ``overlap[a, b]`` of the matrices of ``date`` (None: the newest) in
    ``store``, without the database: ``published`` is always False.

    Raises :class:`NoSnapshotError` when the store holds no correlation matrix,
    :class:`SnapshotNotFoundError` (with the store's latest dates) when ``date`` has none.
    """
    day = parse_date(date)
    if day is None:
        keys = _store_partitions(store)
        if not keys:
            raise NoSnapshotError(
                f"no correlation matrix in the matrix store {store.base_dir}: materialize "
                "correlation_matrix first (see docs/user_guide.md)"
            )
        day = dt.date.fromisoformat(keys[-1])
    partition = day.isoformat()
    try:
        stored = store.load(CORR_ASSET, partition, CORR_ARRAY)
    except MatrixNotFoundError:
        keys = _store_partitions(store)
        latest = [dt.date.fromisoformat(k) for k in reversed(keys)][:LATEST_SHOWN]
        earlier = max((d for d in latest if d < day), default=None)
        raise SnapshotNotFoundError(day, latest, earlier, len(keys)) from None
    except MatrixStoreError as exc:
        raise MatrixUnavailableError(f"cannot read the correlation matrix: {exc}") from None
    return _element(store, stored, day, a, b, None)


def _element(
    store: MatrixStore,
    stored: StoredArray,
    day: dt.date,
    a: str,
    b: str,
    snap: Snapshot | None,
) -> CorrResult:
    """Element ``[a, b]`` of the correlation matrix ``stored`` and of the overlap matrix of the
    same partition (when stored with the same symbols). ``snap`` is the published snapshot
    (None: not published); it supplies ``min_overlap`` when the matrix's parameters lack it."""
    partition = day.isoformat()
    symbols = stored.labels.get("symbols")
    if not isinstance(symbols, list) or len(symbols) != stored.array.shape[0]:
        raise MatrixUnavailableError(
            f"{stored.path}: its sidecar has no symbol list matching the matrix shape "
            f"{stored.array.shape}"
        )
    index = {}
    for name in (a, b):
        i = _symbol_index(symbols, name)
        if i is None:
            raise UnknownSymbolError(
                name,
                snap,
                suggest_symbols(name, symbols),
                where=f"the correlation matrix of {day} ({len(symbols):,} symbols)",
            )
        index[name] = i
    ia, ib = index[a], index[b]
    value = float(stored.array[ia, ib])
    overlap_value: int | None = None
    try:
        stored_overlap: StoredArray | None = store.load(OVERLAP_ASSET, partition, OVERLAP_ARRAY)
    except MatrixStoreError:
        stored_overlap = None
    if stored_overlap is not None and stored_overlap.labels.get("symbols") == symbols:
        overlap_value = int(stored_overlap.array[ia, ib])
    min_overlap = stored.params.get("min_overlap")
    if min_overlap is None and snap is not None:
        min_overlap = snap.params.get("min_overlap")
    return CorrResult(
        snapshot_date=day,
        a=a,
        b=b,
        corr=value,
        overlap=overlap_value,
        min_overlap=None if min_overlap is None else int(min_overlap),
        index_a=ia,
        index_b=ib,
        n_symbols=len(symbols),
        published=snap is not None,
        path=stored.path,
    )
