"""Publish one snapshot to PostgreSQL, atomically replacing any earlier version (SPEC §7).

:func:`publish_snapshot` runs ONE transaction:

1. ``pg_advisory_xact_lock(hashtext('corr_pipeline.snapshot'), <days since 1970-01-01>)``:
   publishers of the same ``snapshot_date`` queue up here (different dates do not block each
   other), so two concurrent publishers end with one whole snapshot — the one that commits
   last — instead of a unique violation or a mix;
2. ``DELETE`` the date's rows from the three child tables and ``suspect_prices``, then its
   ``snapshots`` row
   (explicitly, so this does not depend on the schema's cascade trigger);
3. ``INSERT`` the ``snapshots`` row (``params`` and ``matrix_versions`` as jsonb,
   ``created_at = now()``);
4. the child rows: one ``COPY <table> (...) FROM STDIN (FORMAT BINARY)`` per table, straight
   into the published table, in primary-key order; the payload (symbol text included) is built
   with numpy, chunk by chunk, with no per-row Python. The schema's statement-level trigger
   checks once per COPY that the date has its ``snapshots`` row (migration 0002,
   ``db/migrations/versions/r0002_reference_triggers.py``); then the snapshot's suspect prices
   (SPEC §2, a handful of rows: :mod:`corr_pipeline.db.publish_suspects`);
5. ``COMMIT``. Readers (any isolation level) see the previous snapshot until this commit and the
   new one after it, never a mix; on any error everything rolls back and the previous snapshot
   stays as it was.

Row rules:

* ``peer_neighbors``: for symbol ``i`` and column ``c`` of the top-k arrays with
  ``index[i, c] >= 0``: ``rank = c + 1``, ``neighbor = symbols[index[i, c]]``, ``corr``,
  ``overlap``. Padding (``index == -1``, SPEC §4) is not published; it must be trailing in its
  row, and a published ``corr`` must be finite (the schema has ``corr real NOT NULL``).
* ``symbol_clusters``: ``(symbols[i], labels[i])`` for every kept symbol.
* ``lead_lag_pairs``: one row per pair, leader/lagger mapped to symbols. A NaN ``sync_corr``
  (SPEC §6 allows it: the synchronous correlation was undefined) is stored as **NULL** — SQL's
  "unknown", which aggregates and comparisons handle correctly, whereas a float NaN sorts above
  every number in PostgreSQL and poisons ``avg``. ``lagged_corr`` and ``improvement`` must be
  finite. ``p_value`` and ``q_value`` (float64, SPEC §6 "Significance": the Šidák p-value of
  the best lag and its Benjamini–Hochberg q-value) must be finite and lie in ``[0, 1]``.
  The reverse direction (SPEC §6 "Direction": the ordered pair ``(lagger, leader)``):
  ``reverse_lag`` 0 means that pair has no best lag, and the three ``reverse_*`` columns are
  then **NULL** (whatever the two float fields hold); otherwise ``reverse_lag`` lies in
  ``1..32767``, ``reverse_lagged_corr`` is finite and ``reverse_q_value`` lies in ``[0, 1]``.

Float32 values go into ``real`` columns bit for bit (binary COPY of float4), float64 values into
``double precision`` columns likewise (float8).

Speed: docs/benchmarks.md, Publishing (``corr-pipeline bench --publish-only``). Replacing a
date costs more than a new one: the old rows' index entries are still there during the unique
checks. The rows are
COPYed straight into the published tables (heap multi-insert, no staging table, no join), in
primary-key order (sequential B-tree inserts), and their reference to ``snapshots`` is checked
once per statement by a trigger rather than once per row as a foreign key would.
``synchronous_commit`` stays on: turning it off would save nothing measurable (the commit takes
~10 ms; the WAL is written during the COPY) and would let a crash lose a publication the caller
was told had committed.

:func:`delete_snapshot` withdraws a snapshot the same way (same lock, one transaction).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE
from corr_pipeline.compute.suspect import SuspectSymbol
from corr_pipeline.db.bulk import driver_connection
from corr_pipeline.db.dates import as_iso_date
from corr_pipeline.db.publish_suspects import SUSPECT_TABLE, insert_suspects, suspect_rows
from corr_pipeline.db.replace import lock_date, replace_date_rows
from corr_pipeline.db.schema import CHANGE_TABLES, PUBLISHED_TABLES, SNAPSHOT_CHILD_TABLES

__all__ = [
    "LEAD_LAG_FIELDS",
    "REVERSE_FIELDS",
    "SIGNIFICANCE_FIELDS",
    "PublishableSnapshot",
    "PublishError",
    "PublishReport",
    "delete_change_rows",
    "delete_snapshot",
    "lock_date",
    "publish_snapshot",
    "read_snapshot_counts",
]

#: Fields a lead-lag structured array must have (SPEC §6 / §9).
LEAD_LAG_FIELDS: tuple[str, ...] = LEAD_LAG_DTYPE.names or ()
#: The float64 significance fields of a lead-lag pair (SPEC §6 "Significance"), each in [0, 1].
SIGNIFICANCE_FIELDS = ("p_value", "q_value")
#: The reverse direction of a lead-lag pair (SPEC §6 "Direction"): the best lag of the ordered
#: pair ``(lagger, leader)`` (0: it has none), its lagged correlation and its q-value.
REVERSE_FIELDS = ("reverse_lag", "reverse_lagged_corr", "reverse_q_value")

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)


class PublishError(ValueError):
    """The results handed to :func:`publish_snapshot` are inconsistent; nothing was written."""


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish_snapshot` wrote: ``rows`` per table, total ``seconds`` (incl. waiting
    for a concurrent publisher of the same date: ``lock_wait_seconds``), per-phase ``timings``."""

    snapshot_date: dt.date
    rows: dict[str, int]
    seconds: float
    lock_wait_seconds: float
    replaced_previous: bool
    timings: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _json_params(params: Mapping[str, Any]) -> str:
    def convert(value: Any, where: str) -> Any:
        if isinstance(value, Mapping):
            return {str(k): convert(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list | tuple | np.ndarray):
            return [convert(v, f"{where}[]") for v in list(value)]
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            raise PublishError(f"params{where}: {value} cannot be stored in jsonb")
        if isinstance(value, dt.date | dt.datetime):
            return value.isoformat()
        if value is None or isinstance(value, bool | int | float | str):
            return value
        return str(value)

    return json.dumps(convert(dict(params), ""), sort_keys=True)


def _int_array(value: Any, what: str, ndim: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise PublishError(f"{what} must be {ndim}-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise PublishError(f"{what} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


# ------------------------------------------------------------------------------------------
# validation -> index-based row arrays
# ------------------------------------------------------------------------------------------


def _neighbor_rows(
    n: int, index: Any, corr: Any, overlap: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    idx = _int_array(index, "neighbor_index", 2)
    if idx.shape[0] != n:
        raise PublishError(f"neighbor_index has {idx.shape[0]} rows for {n} symbols")
    k = idx.shape[1]
    if k > np.iinfo(np.int16).max:
        raise PublishError(f"k = {k} neighbors exceeds the smallint rank column")
    corr_a = np.asarray(corr)
    if overlap is None:
        raise PublishError("neighbor_overlap is required (peer_neighbors.overlap is NOT NULL)")
    ovl = _int_array(overlap, "neighbor_overlap", 2)
    if corr_a.shape != idx.shape or ovl.shape != idx.shape:
        raise PublishError(
            f"neighbor arrays disagree in shape: index {idx.shape}, corr {corr_a.shape}, "
            f"overlap {ovl.shape}"
        )
    if idx.size and (idx.min() < -1 or idx.max() >= n):
        raise PublishError(
            f"neighbor_index values must lie in [-1, {n}), got {idx.min()}..{idx.max()}"
        )
    valid = idx >= 0
    if k > 1 and np.any(~valid[:, :-1] & valid[:, 1:]):
        row = int(np.flatnonzero(np.any(~valid[:, :-1] & valid[:, 1:], axis=1))[0])
        raise PublishError(f"neighbor row {row}: padding (-1) followed by a neighbor")
    rows, cols = np.nonzero(valid)
    nbr = idx[rows, cols]
    if np.any(nbr == rows):
        raise PublishError(f"symbol {int(rows[nbr == rows][0])} lists itself as a neighbor")
    c = corr_a[rows, cols].astype(np.float32)
    if not np.all(np.isfinite(c)):
        bad = int(rows[~np.isfinite(c)][0])
        raise PublishError(f"neighbor row {bad}: a published neighbor has a non-finite corr")
    o = ovl[rows, cols]
    if o.size and (o.min() < 0 or o.max() > np.iinfo(np.int32).max):
        raise PublishError("neighbor_overlap values must be non-negative int32")
    return rows, (cols + 1), nbr, c, o


def _pair_rows(n: int, pairs: Any) -> dict[str, np.ndarray]:
    arr = np.asarray(pairs)
    names = arr.dtype.names or ()
    missing = [f for f in LEAD_LAG_FIELDS if f not in names]
    if arr.ndim != 1 or missing:
        raise PublishError(
            f"lead_lag_pairs must be a 1-D structured array with fields {LEAD_LAG_FIELDS}; "
            f"missing {missing}, shape {arr.shape}"
        )
    cols = {f: np.asarray(arr[f]) for f in LEAD_LAG_FIELDS}
    for f in ("leader", "lagger", "lag", "overlap"):
        if cols[f].size and cols[f].dtype.kind not in "iu":
            raise PublishError(f"lead_lag_pairs.{f} must be integers, got {cols[f].dtype}")
        cols[f] = cols[f].astype(np.int64)
    if arr.size:
        for f in ("leader", "lagger"):
            if cols[f].min() < 0 or cols[f].max() >= n:
                raise PublishError(f"lead_lag_pairs.{f} must index the {n} symbols")
        if np.any(cols["leader"] == cols["lagger"]):
            raise PublishError("lead_lag_pairs has a pair with leader == lagger")
        key = np.sort(cols["leader"] * n + cols["lagger"])  # sort: ~30x faster than np.unique
        if np.any(key[1:] == key[:-1]):
            raise PublishError("lead_lag_pairs lists the same (leader, lagger) twice")
        if cols["lag"].min() < 1 or cols["lag"].max() > np.iinfo(np.int16).max:
            raise PublishError("lead_lag_pairs.lag must lie in 1..32767")
    for f in ("lagged_corr", "sync_corr", "improvement"):
        cols[f] = cols[f].astype(np.float32)
    for f in ("lagged_corr", "improvement"):
        if not np.all(np.isfinite(cols[f])):
            raise PublishError(f"lead_lag_pairs.{f} must be finite")
    for f in SIGNIFICANCE_FIELDS:
        if cols[f].size and cols[f].dtype.kind != "f":
            raise PublishError(f"lead_lag_pairs.{f} must be floats, got {cols[f].dtype}")
        cols[f] = cols[f].astype(np.float64)
        if not np.all((cols[f] >= 0.0) & (cols[f] <= 1.0)):  # False for NaN as well
            raise PublishError(f"lead_lag_pairs.{f} must be finite and lie in [0, 1]")
    _reverse_rows(cols)
    return cols


def _reverse_rows(cols: dict[str, np.ndarray]) -> None:
    """Validate the reverse direction of the pairs ``cols`` in place (SPEC §6 "Direction"):
    ``reverse_lag`` as int64 in ``0..32767`` (0: the pair ``(lagger, leader)`` has no best lag),
    ``reverse_lagged_corr`` as float32 (finite where there is a reverse lag) and
    ``reverse_q_value`` as float64 (in ``[0, 1]`` where there is one); both NaN where there is
    none, so that all three are published as NULL there."""
    back = cols["reverse_lag"]
    if back.size and back.dtype.kind not in "iu":
        raise PublishError(f"lead_lag_pairs.reverse_lag must be integers, got {back.dtype}")
    back = cols["reverse_lag"] = back.astype(np.int64)
    if back.size and (back.min() < 0 or back.max() > np.iinfo(np.int16).max):
        raise PublishError(
            "lead_lag_pairs.reverse_lag must lie in 0..32767 (0: the reverse pair has no best lag)"
        )
    present = back > 0
    for f, kind in (("reverse_lagged_corr", np.float32), ("reverse_q_value", np.float64)):
        if cols[f].size and cols[f].dtype.kind != "f":
            raise PublishError(f"lead_lag_pairs.{f} must be floats, got {cols[f].dtype}")
        cols[f] = np.where(present, cols[f].astype(kind), kind(np.nan))
    if not np.all(np.isfinite(cols["reverse_lagged_corr"][present])):
        raise PublishError(
            "lead_lag_pairs.reverse_lagged_corr must be finite where reverse_lag > 0"
        )
    q = cols["reverse_q_value"][present]
    if not np.all((q >= 0.0) & (q <= 1.0)):  # False for NaN as well
        raise PublishError(
            "lead_lag_pairs.reverse_q_value must be finite and lie in [0, 1] where reverse_lag > 0"
        )


# ------------------------------------------------------------------------------------------
# binary COPY payloads, built with numpy
# ------------------------------------------------------------------------------------------

#: Rows per COPY message built at once (bounds the scatter index arrays to a few MB).
_COPY_CHUNK_ROWS = 1 << 16

_PG_EPOCH = dt.date(2000, 1, 1)  # binary ``date`` = int32 days since then


@dataclass(frozen=True)
class _Fixed:
    """A fixed-width column: big-endian numpy format ``fmt`` (``>i2``/``>i4`` integers, ``>f4``
    real, ``>f8`` double precision), one value per row (or a scalar)."""

    fmt: str
    values: Any


@dataclass(frozen=True)
class _Text:
    """A text column whose value in row ``r`` is symbol number ``index[r]``."""

    index: np.ndarray


@dataclass(frozen=True)
class _Nullable:
    """A fixed-width column of big-endian numpy format ``fmt`` (like :class:`_Fixed`) whose
    value in row ``r`` is sent as NULL where ``null[r]``."""

    fmt: str
    values: np.ndarray
    null: np.ndarray


def _nullable_real(values: np.ndarray) -> _Nullable:
    """A ``real`` column; NaN is sent as NULL."""
    return _Nullable(">f4", values, np.isnan(values))


class _Symbols:
    """The symbols as UTF-8 bytes: ``table[i, :lengths[i]]`` is symbol ``i``."""

    def __init__(self, symbols: list[str]) -> None:
        encoded = [s.encode("utf-8") for s in symbols]
        self.lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        width = max(1, int(self.lengths.max(initial=0)))
        self.table = np.frombuffer(
            b"".join(e.ljust(width, b"\0") for e in encoded), dtype=np.uint8
        ).reshape(len(encoded), width)
        # code-point rank of every symbol: the order of the "C"-collated key columns
        self.rank = np.empty(len(symbols), np.int64)
        self.rank[sorted(range(len(symbols)), key=symbols.__getitem__)] = np.arange(len(symbols))


def _copy_chunk(columns: Sequence[Any], rows: slice, m: int, symbols: _Symbols) -> bytes:
    """Rows ``rows`` (``m`` of them) of ``columns`` as binary COPY tuples.

    Each tuple is ``int16`` field count, then per field ``int32`` byte length (−1 = NULL) and
    the bytes. Runs of fixed-width fields become one numpy record per row; variable-width
    pieces (symbol text, NULL-able numbers) are scattered per distinct length. No per-row
    Python.
    """
    segments: list[tuple[Any, ...]] = []
    fixed: list[tuple[str, Any]] = [(">i2", len(columns))]
    for col in columns:
        if isinstance(col, _Fixed):
            values = col.values[rows] if isinstance(col.values, np.ndarray) else col.values
            fixed += [(">i4", np.dtype(col.fmt).itemsize), (col.fmt, values)]
            continue
        if isinstance(col, _Text):
            index = col.index[rows]
            lengths = symbols.lengths[index]
            header, table = lengths, symbols.table
        else:
            width = np.dtype(col.fmt).itemsize
            data = np.asarray(col.values[rows], dtype=col.fmt)
            null = col.null[rows]
            lengths = np.where(null, 0, width)
            header, index = np.where(null, -1, width), None
            table = data.view(np.uint8).reshape(m, width)
        fixed.append((">i4", header))
        segments += [("fixed", fixed), ("var", lengths, table, index)]
        fixed = []
    if fixed:
        segments.append(("fixed", fixed))

    row_bytes = np.zeros(m, np.int64)
    blocks: list[tuple[Any, ...]] = []
    for segment in segments:
        if segment[0] == "fixed":
            layout = np.dtype([(f"f{i}", fmt) for i, (fmt, _) in enumerate(segment[1])])
            rec = np.empty(m, layout)
            for i, (_, value) in enumerate(segment[1]):
                rec[f"f{i}"] = value
            blocks.append(("fixed", rec.view(np.uint8).reshape(m, layout.itemsize)))
            row_bytes += layout.itemsize
        else:
            blocks.append(segment)
            row_bytes += segment[1]
    pos = np.zeros(m, np.int64)
    np.cumsum(row_bytes[:-1], out=pos[1:])
    out = np.empty(int(row_bytes.sum()), np.uint8)
    for block in blocks:
        if block[0] == "fixed":
            data = block[1]
            out[pos[:, None] + np.arange(data.shape[1])] = data
            pos += data.shape[1]
        else:
            _, lengths, table, index = block
            for length in np.flatnonzero(np.bincount(lengths)) if lengths.size else ():
                if length == 0:
                    continue
                sel = np.flatnonzero(lengths == length)
                source = table[sel if index is None else index[sel], :length]
                out[pos[sel, None] + np.arange(length)] = source
            pos += lengths
    return out.tobytes()


def _copy_chunks(columns: Sequence[Any], n_rows: int, symbols: _Symbols) -> Iterator[bytes]:
    """The whole binary COPY stream (header, tuples, trailer), built chunk by chunk so that
    building the next chunk overlaps the server's work on the previous one."""
    yield _COPY_HEADER
    for start in range(0, n_rows, _COPY_CHUNK_ROWS):
        stop = min(n_rows, start + _COPY_CHUNK_ROWS)
        yield _copy_chunk(columns, slice(start, stop), stop - start, symbols)
    yield _COPY_TRAILER


#: Column lists of the COPY statements, in the order the payload builders emit them.
_COPY_COLUMNS = {
    "peer_neighbors": "snapshot_date, symbol, rank, neighbor, corr, overlap",
    "symbol_clusters": "snapshot_date, symbol, cluster_id",
    "lead_lag_pairs": (
        "snapshot_date, leader, lagger, lag, lagged_corr, sync_corr, improvement, overlap, "
        "p_value, q_value, reverse_lag, reverse_lagged_corr, reverse_q_value"
    ),
}


def _copy_binary(cursor: Any, table: str, chunks: Iterable[bytes]) -> None:
    """``COPY table (columns) FROM STDIN (FORMAT BINARY)`` of ``chunks``."""
    with cursor.copy(f"COPY {table} ({_COPY_COLUMNS[table]}) FROM STDIN (FORMAT BINARY)") as copy:
        for chunk in chunks:
            copy.write(chunk)


def _delete_snapshot_rows(cursor: Any, d: dt.date) -> bool:
    """Delete ``d``'s child rows, then its ``snapshots`` row; True if there was one."""
    # explicit, so correctness does not hinge on the schema's cascade
    for child in (*SNAPSHOT_CHILD_TABLES, SUSPECT_TABLE):
        cursor.execute(f"DELETE FROM {child} WHERE snapshot_date = %s", (d,))
    cursor.execute("DELETE FROM snapshots WHERE snapshot_date = %s", (d,))
    return bool(cursor.rowcount > 0)


class PublishableSnapshot(Protocol):
    """What :func:`publish_snapshot` reads from a snapshot's results (SPEC §7): the fields
    of :class:`corr_pipeline.snapshot.results.SnapshotResults`, which documents them."""

    @property
    def snapshot_date(self) -> dt.date | str: ...
    @property
    def as_of_trade_date(self) -> dt.date | str: ...
    @property
    def symbols(self) -> Sequence[str]: ...
    @property
    def n_dropped(self) -> int: ...
    @property
    def lookback_days(self) -> int: ...
    @property
    def params(self) -> Mapping[str, Any]: ...
    @property
    def neighbor_index(self) -> Any: ...
    @property
    def neighbor_corr(self) -> Any: ...
    @property
    def neighbor_overlap(self) -> Any: ...
    @property
    def cluster_labels(self) -> Any: ...
    @property
    def lead_lag_pairs(self) -> Any: ...
    @property
    def matrix_versions(self) -> Mapping[str, Mapping[str, str]] | None: ...
    @property
    def suspects(self) -> Sequence[SuspectSymbol]: ...


def _json_versions(versions: Mapping[str, Mapping[str, str]] | None) -> str | None:
    if versions is None:
        return None
    out: dict[str, dict[str, str]] = {}
    for asset, arrays in versions.items():
        if not isinstance(asset, str) or not isinstance(arrays, Mapping):
            raise PublishError(f"matrix_versions[{asset!r}] must map array names to versions")
        out[asset] = {}
        for name, version in arrays.items():
            if not isinstance(name, str) or not isinstance(version, str):
                raise PublishError(f"matrix_versions[{asset!r}][{name!r}] must be a str version")
            out[asset][name] = version
    return json.dumps(out, sort_keys=True)


def publish_snapshot(engine: sa.Engine, results: PublishableSnapshot) -> PublishReport:
    """Replace the snapshot of ``results.snapshot_date`` with ``results``, in one transaction
    (SPEC §7).

    Everything is validated before the transaction starts (:class:`PublishError`, nothing
    written). Database errors surface as the driver's ``psycopg.Error`` subclasses (connection
    loss: ``psycopg.OperationalError``) after the transaction was rolled back. See the module
    docstring for the locking and row rules.
    """
    snapshot_date, as_of_trade_date = results.snapshot_date, results.as_of_trade_date
    symbols, n_dropped, lookback_days = results.symbols, results.n_dropped, results.lookback_days
    t_start = time.perf_counter()
    d = as_iso_date(snapshot_date, "snapshot_date", PublishError)
    as_of = as_iso_date(as_of_trade_date, "as_of_trade_date", PublishError)
    if as_of > d:
        raise PublishError(f"as_of_trade_date {as_of} is after the snapshot date {d}")
    symbol_list = [str(s) for s in symbols]
    n = len(symbol_list)
    if n == 0:
        raise PublishError("no symbols to publish")
    if len(set(symbol_list)) != n:
        raise PublishError("symbols contains duplicates")
    if int(n_dropped) < 0 or int(lookback_days) < 1:
        raise PublishError(f"n_dropped ({n_dropped}) must be >= 0, lookback_days >= 1")
    params_json = _json_params(results.params)
    versions_json = _json_versions(results.matrix_versions)
    suspects = suspect_rows(results.suspects, PublishError)

    sym = _Symbols(symbol_list)
    copies = _copies(results, n, (d - _PG_EPOCH).days, sym)
    timings = {"prepare_s": time.perf_counter() - t_start}

    head = (
        "INSERT INTO snapshots (snapshot_date, as_of_trade_date, n_symbols, n_dropped, "
        "lookback_days, params, matrix_versions, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, now())",
        (d, as_of, n, int(n_dropped), int(lookback_days), params_json, versions_json),
    )
    done = replace_date_rows(
        engine,
        d,
        what=f"publishing {d}",
        delete=partial(_delete_snapshot_rows, d=d),
        head=("snapshots", "replace_snapshot_row_s", *head),
        copies={
            **{
                table: (n_rows, partial(_copy_table, table, columns, n_rows, sym))
                for table, columns, n_rows in copies
            },
            SUSPECT_TABLE: (len(suspects), partial(insert_suspects, d, suspects)),
        },
    )
    return done.report(PublishReport, d, t_start, timings)


def _copy_table(table: str, columns: list[Any], n_rows: int, sym: _Symbols, cursor: Any) -> None:
    """COPY the ``n_rows`` rows of ``columns`` into ``table`` (binary format)."""
    _copy_binary(cursor, table, _copy_chunks(columns, n_rows, sym))


def _copies(
    results: PublishableSnapshot, n: int, days: int, sym: _Symbols
) -> list[tuple[str, list[Any], int]]:
    """The binary COPY columns and row count of each result table, validated (``days``: the
    snapshot date as PostgreSQL's day number). Rows go in primary-key order (symbols by code
    point, as the "C" collation sorts them): the B-tree inserts then walk the index left to
    right instead of jumping around."""
    nb_i, nb_rank, nb_j, nb_corr, nb_overlap = _neighbor_rows(
        n, results.neighbor_index, results.neighbor_corr, results.neighbor_overlap
    )
    labels = _int_array(results.cluster_labels, "cluster_labels", 1)
    if labels.shape[0] != n:
        raise PublishError(f"cluster_labels has {labels.shape[0]} entries for {n} symbols")
    if labels.size and (labels.min() < 0 or labels.max() > np.iinfo(np.int32).max):
        raise PublishError("cluster_labels must be non-negative int32")
    pairs = _pair_rows(n, results.lead_lag_pairs)
    nb_order = np.lexsort((nb_rank, sym.rank[nb_i]))
    cl_order = np.argsort(sym.rank)
    pr_order = np.argsort(sym.rank[pairs["leader"]] * n + sym.rank[pairs["lagger"]], kind="stable")
    absent = pairs["reverse_lag"][pr_order] == 0  # no reverse best lag: the three are NULL
    return [
        (
            "peer_neighbors",
            [
                _Fixed(">i4", days),
                _Text(nb_i[nb_order]),
                _Fixed(">i2", nb_rank[nb_order]),
                _Text(nb_j[nb_order]),
                _Fixed(">f4", nb_corr[nb_order]),
                _Fixed(">i4", nb_overlap[nb_order]),
            ],
            int(nb_i.size),
        ),
        (
            "symbol_clusters",
            [_Fixed(">i4", days), _Text(cl_order), _Fixed(">i4", labels[cl_order])],
            n,
        ),
        (
            "lead_lag_pairs",
            [
                _Fixed(">i4", days),
                _Text(pairs["leader"][pr_order]),
                _Text(pairs["lagger"][pr_order]),
                _Fixed(">i2", pairs["lag"][pr_order]),
                _Fixed(">f4", pairs["lagged_corr"][pr_order]),
                _nullable_real(pairs["sync_corr"][pr_order]),
                _Fixed(">f4", pairs["improvement"][pr_order]),
                _Fixed(">i4", pairs["overlap"][pr_order]),
                _Fixed(">f8", pairs["p_value"][pr_order]),
                _Fixed(">f8", pairs["q_value"][pr_order]),
                _Nullable(">i2", pairs["reverse_lag"][pr_order], absent),
                _Nullable(">f4", pairs["reverse_lagged_corr"][pr_order], absent),
                _Nullable(">f8", pairs["reverse_q_value"][pr_order], absent),
            ],
            int(pairs["leader"].size),
        ),
    ]


def delete_snapshot(engine: sa.Engine, snapshot_date: dt.date | str) -> bool:
    """Withdraw the snapshot of ``snapshot_date``: its rows in every published table and its
    recorded changes (the ``change_*`` rows of that date, SPEC §10), in one transaction under
    the same per-date lock as :func:`publish_snapshot` and the changes' publication (readers see
    all of it or none of it). Returns whether there was a snapshot."""
    d = as_iso_date(snapshot_date, "snapshot_date", PublishError)
    with engine.begin() as conn, driver_connection(conn).cursor() as cur:
        lock_date(cur, d)
        delete_change_rows(cur, d)
        return _delete_snapshot_rows(cur, d)


def delete_change_rows(cursor: Any, d: dt.date) -> bool:
    """Delete the recorded changes of ``d`` (SPEC §10): the child rows of every change table,
    then its ``change_summaries`` row; True if there was one. The caller holds
    :func:`lock_date`."""
    for table in reversed(CHANGE_TABLES):  # children first, then change_summaries
        cursor.execute(f"DELETE FROM {table} WHERE snapshot_date = %s", (d,))
    return bool(cursor.rowcount > 0)


def read_snapshot_counts(
    engine: sa.Engine,
    snapshot_date: dt.date | str,
    tables: Sequence[str] = (*PUBLISHED_TABLES, SUSPECT_TABLE),
) -> dict[str, int]:
    """Rows per table of ``tables`` (default the published snapshot's, its suspect prices
    included) for ``snapshot_date``,
    read in one consistent snapshot."""
    d = as_iso_date(snapshot_date, "snapshot_date", PublishError)
    query = " UNION ALL ".join(
        f"SELECT '{table}', count(*) FROM {table} WHERE snapshot_date = :d" for table in tables
    )
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        result: dict[str, int] = {
            str(table): int(count) for table, count in conn.execute(sa.text(query), {"d": d})
        }
    return {table: int(result[table]) for table in tables}
