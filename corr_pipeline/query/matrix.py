"""``corr[a, b]`` and ``overlap[a, b]`` (SPEC §3) read from the matrix store (SPEC §8).

``corr(engine, a, b, date, *, store=None)``  the snapshot date resolved among the published
                                             snapshots (SPEC §7), the matrices read exactly at
                                             the versions its publication pins (SPEC §8); a
                                             date whose matrices are in the store but that is
                                             not published is still answered (current
                                             versions), flagged ``published=False``
``corr_from_store(store, a, b, date)``       dates from the matrix store alone (no database),
                                             always ``published=False``

One element of each memory-mapped matrix is read: nothing is recomputed and no row is loaded.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Sequence
from functools import partial

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.published_reads import published_matrix_versions
from corr_pipeline.query.answers import CorrResult, Snapshot
from corr_pipeline.query.errors import (
    MatricesPrunedError,
    MatrixUnavailableError,
    NoSnapshotError,
    SnapshotNotFoundError,
    UnknownSymbolError,
)
from corr_pipeline.query.published import (
    LATEST_SHOWN,
    consistent_read,
    parse_date,
    require_symbol,
    resolve_snapshot,
)
from corr_pipeline.query.symbols import suggest_symbols
from corr_pipeline.store.matrix_store import (
    MatrixNotFoundError,
    MatrixStore,
    MatrixStoreError,
    StoredArray,
    VersionNotFoundError,
)

__all__ = [
    "CORR_ARRAY",
    "CORR_ASSET",
    "OVERLAP_ARRAY",
    "OVERLAP_ASSET",
    "corr",
    "corr_from_store",
    "default_store",
]

#: Where a snapshot's matrices live in the matrix store (the assets of ``corr_pipeline.defs``):
#: ``<store>/<asset>/<snapshot date>/<array>.<version>.npy`` with the symbols in the sidecar
#: labels.
CORR_ASSET, CORR_ARRAY = "correlation_matrix", "corr"
OVERLAP_ASSET, OVERLAP_ARRAY = "overlap_matrix", "overlap"

#: Resolutions of a published date whose pinned versions vanished meanwhile (a newer
#: publication of the date committed and its retention collected them).
_PIN_ATTEMPTS = 3


def default_store() -> MatrixStore:
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
    return [
        p for p in store.files.partitions(CORR_ASSET) if store.exists(CORR_ASSET, p, CORR_ARRAY)
    ]


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


def _pins(snap: Snapshot) -> tuple[str, str | None] | None:
    """(corr version, overlap version or None) the published snapshot pins; None when it
    recorded none (published without a store, or by an older corr_pipeline)."""
    versions = snap.matrix_versions or {}
    corr_version = (versions.get(CORR_ASSET) or {}).get(CORR_ARRAY)
    if not corr_version:
        return None
    return str(corr_version), (versions.get(OVERLAP_ASSET) or {}).get(OVERLAP_ARRAY)


def _dates_with_matrices(engine: sa.Engine, store: MatrixStore) -> tuple[list[dt.date], int]:
    """The newest published dates whose correlation matrix is still in ``store`` (at most
    :data:`LATEST_SHOWN`, newest first) and how many there are."""
    found: list[dt.date] = []
    for day, versions in sorted(published_matrix_versions(engine).items(), reverse=True):
        partition = day.isoformat()
        version = ((versions or {}).get(CORR_ASSET) or {}).get(CORR_ARRAY)
        try:
            if version:
                present = store.has_version(CORR_ASSET, partition, CORR_ARRAY, version)
            else:
                present = store.exists(CORR_ASSET, partition, CORR_ARRAY)
        except MatrixStoreError:
            present = False
        if present:
            found.append(day)
    return found[:LATEST_SHOWN], len(found)


def _unavailable(
    engine: sa.Engine, store: MatrixStore, day: dt.date, exc: VersionNotFoundError
) -> MatrixUnavailableError:
    """The error for a published date whose pinned matrix is not in the store: pruned by
    retention (the store recorded it), or missing for another reason."""
    record = store.pruned(day.isoformat()) or {}
    pruned = exc.version in ((record.get("versions") or {}).get(exc.asset) or {}).get(exc.name, [])
    if pruned:
        available, total = _dates_with_matrices(engine, store)
        return MatricesPrunedError(day, available, total)
    return MatrixUnavailableError(
        f"the snapshot of {day} is published but the {exc.name} version it was computed from "
        f"({exc.version}) is not in the matrix store {store.base_dir}: was the store cleaned "
        "up, or does CORR_PIPELINE_STORE_DIR point elsewhere? Re-materialize the partition "
        f"{day.isoformat()} to recompute it"
    )


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

    The date is resolved among the published snapshots (SPEC §7) and the matrices read are
    exactly the versions its publication pins (SPEC §8), so the answer comes from the same
    snapshot as ``peers``/``cluster``/``lead-lag`` for that date, whatever a re-run of the date
    has committed to the store since. A pinned version missing because a newer publication
    replaced the snapshot meanwhile is resolved again. When the date has no snapshot, or
    nothing is published, the current matrices of that date (None: the newest) present in the
    store are still answered with ``published=False``. Raises :class:`MatricesPrunedError` when
    retention removed the date's matrices (with the dates that still have them),
    :class:`MatrixUnavailableError` when they are missing otherwise, :class:`UnknownSymbolError`
    (with close matches) for a symbol not in the matrix.
    """
    if store is None:
        store = default_store()
    requested = parse_date(date)
    missing: VersionNotFoundError | None = None
    for _attempt in range(_PIN_ATTEMPTS):
        day = requested
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
        if snap is None:
            assert day is not None
            return _current(store, day, a, b, None)
        pins = _pins(snap)
        if pins is None:  # recorded no versions: the store's current ones
            return _told_apart(
                engine, snap, partial(_current, store, snap.snapshot_date, a, b, snap)
            )
        partition = snap.snapshot_date.isoformat()
        try:
            stored = store.load(CORR_ASSET, partition, CORR_ARRAY, version=pins[0])
            stored_overlap = (
                None
                if pins[1] is None
                else store.load(OVERLAP_ASSET, partition, OVERLAP_ARRAY, version=pins[1])
            )
        except VersionNotFoundError as exc:
            missing = exc  # replaced by a newer publication meanwhile? resolve again
            continue
        except MatrixStoreError as exc:
            raise MatrixUnavailableError(f"cannot read the correlation matrix: {exc}") from None
        return _told_apart(
            engine, snap, partial(_element, stored, stored_overlap, snap.snapshot_date, a, b, snap)
        )
    assert missing is not None and snap is not None
    raise _unavailable(engine, store, snap.snapshot_date, missing)


def _told_apart(engine: sa.Engine, snap: Snapshot, answer: Callable[[], CorrResult]) -> CorrResult:
    """``answer()``; a symbol it does not find is looked up in the published snapshot, so that
    one dropped from the window (it has prices) is told apart from an unknown one, as ``peers``
    and ``cluster`` do."""
    try:
        return answer()
    except UnknownSymbolError as exc:
        with consistent_read(engine) as conn:
            require_symbol(conn, snap, exc.symbol)  # raises the dropped-or-unknown error
        raise


def _current(store: MatrixStore, day: dt.date, a: str, b: str, snap: Snapshot | None) -> CorrResult:
    """The element from the store's current corr and overlap of ``day`` (no pinned versions)."""
    partition = day.isoformat()
    try:
        stored = store.load(CORR_ASSET, partition, CORR_ARRAY)
    except MatrixNotFoundError:
        pruned = snap is not None and store.pruned(partition) is not None
        raise MatrixUnavailableError(
            f"the snapshot of {day} is published but its correlation matrix is not in the "
            f"matrix store {store.base_dir} ({CORR_ASSET}/{partition}/{CORR_ARRAY}.npy): "
            + (
                "it was pruned by retention (CORR_PIPELINE_KEEP_MATRICES). "
                if pruned
                else "was the store cleaned up, or does CORR_PIPELINE_STORE_DIR point elsewhere? "
            )
            + f"Re-materialize {CORR_ASSET} for {partition}"
        ) from None
    except MatrixStoreError as exc:
        raise MatrixUnavailableError(f"cannot read the correlation matrix: {exc}") from None
    try:
        stored_overlap: StoredArray | None = store.load(OVERLAP_ASSET, partition, OVERLAP_ARRAY)
    except MatrixStoreError:
        stored_overlap = None
    return _element(stored, stored_overlap, day, a, b, snap)


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
    if not store.exists(CORR_ASSET, partition, CORR_ARRAY):
        keys = _store_partitions(store)
        latest = [dt.date.fromisoformat(k) for k in reversed(keys)][:LATEST_SHOWN]
        earlier = max((d for d in latest if d < day), default=None)
        raise SnapshotNotFoundError(day, latest, earlier, len(keys))
    return _current(store, day, a, b, None)


def _element(
    stored: StoredArray,
    stored_overlap: StoredArray | None,
    day: dt.date,
    a: str,
    b: str,
    snap: Snapshot | None,
) -> CorrResult:
    """Element ``[a, b]`` of the correlation matrix ``stored`` and of the overlap matrix
    ``stored_overlap`` (when stored with the same symbols). ``snap`` is the published snapshot
    (None: not published); it supplies ``min_overlap`` when the matrix's parameters lack it."""
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
    versions = {CORR_ARRAY: stored.version}
    if stored_overlap is not None and stored_overlap.labels.get("symbols") == symbols:
        overlap_value = int(stored_overlap.array[ia, ib])
        versions[OVERLAP_ARRAY] = stored_overlap.version
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
        versions=versions,
    )
