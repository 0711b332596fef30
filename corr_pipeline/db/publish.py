"""Publish one snapshot to PostgreSQL, atomically replacing any earlier version (SPEC §7).

:func:`publish_snapshot` runs ONE transaction:

1. ``pg_advisory_xact_lock(hashtext('corr_pipeline.snapshot'), <days since 1970-01-01>)``:
   publishers of the same ``snapshot_date`` queue up here (different dates do not block each
   other), so two concurrent publishers end with one whole snapshot — the one that commits
   last — instead of a unique violation or a mix;
2. ``DELETE`` the date's rows from the three child tables, then its ``snapshots`` row
   (explicitly, so this does not depend on the schema's ``ON DELETE CASCADE``);
3. ``INSERT`` the ``snapshots`` row (``params`` as jsonb, ``created_at = now()``);
4. the child rows: fixed-width binary records built with numpy (no per-row Python) are
   ``COPY ... FROM STDIN (FORMAT BINARY)``'d into transaction-local TEMP staging tables holding
   symbol *indices* (plus one ``(i, symbol)`` table), the staging tables are ANALYZEd, and one
   ``INSERT ... SELECT`` per table maps indices to symbol text with hash joins;
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
  finite.

Float32 values go into ``real`` columns bit for bit (binary COPY of float4).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.bulk import driver_connection
from corr_pipeline.db.dates import as_iso_date

__all__ = [
    "LEAD_LAG_FIELDS",
    "PublishError",
    "PublishReport",
    "publish_snapshot",
    "read_snapshot_counts",
]

#: Fields a lead-lag structured array must have (SPEC §6 / §9).
LEAD_LAG_FIELDS = (
    "leader",
    "lagger",
    "lag",
    "lagged_corr",
    "sync_corr",
    "improvement",
    "overlap",
)

_LOCK_NAMESPACE = "corr_pipeline.snapshot"
_EPOCH = dt.date(1970, 1, 1)
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_TABLES = ("snapshots", "peer_neighbors", "symbol_clusters", "lead_lag_pairs")


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


def _records(dtype_fields: list[tuple[str, str]], n: int) -> np.ndarray:
    """Zeroed binary-COPY records: int16 field count, then (int32 length, value) per column."""
    layout: list[tuple[str, str]] = [("n_fields", ">i2")]
    for name, fmt in dtype_fields:
        layout += [(f"{name}_len", ">i4"), (name, fmt)]
    rec = np.zeros(n, dtype=np.dtype(layout))
    rec["n_fields"] = len(dtype_fields)
    for name, _ in dtype_fields:
        rec[f"{name}_len"] = rec.dtype[name].itemsize
    return rec


def _copy_binary(cursor: Any, table: str, records: np.ndarray) -> None:
    with cursor.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(_COPY_HEADER)
        if records.size:
            copy.write(records.tobytes())
        copy.write(_COPY_TRAILER)


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
        key = cols["leader"] * n + cols["lagger"]
        if np.unique(key).size != key.size:
            raise PublishError("lead_lag_pairs lists the same (leader, lagger) twice")
        if cols["lag"].min() < 1 or cols["lag"].max() > np.iinfo(np.int16).max:
            raise PublishError("lead_lag_pairs.lag must lie in 1..32767")
    for f in ("lagged_corr", "sync_corr", "improvement"):
        cols[f] = cols[f].astype(np.float32)
    for f in ("lagged_corr", "improvement"):
        if not np.all(np.isfinite(cols[f])):
            raise PublishError(f"lead_lag_pairs.{f} must be finite")
    return cols


# ------------------------------------------------------------------------------------------
# SQL
# ------------------------------------------------------------------------------------------

_STAGING_DDL = """
DROP TABLE IF EXISTS pg_temp._pub_symbols, pg_temp._pub_neighbors, pg_temp._pub_clusters,
    pg_temp._pub_pairs;
CREATE TEMP TABLE _pub_symbols (i int4 PRIMARY KEY, symbol text NOT NULL) ON COMMIT DROP;
CREATE TEMP TABLE _pub_neighbors (i int4, rank int2, j int4, corr float4, overlap int4)
    ON COMMIT DROP;
CREATE TEMP TABLE _pub_clusters (i int4, cluster_id int4) ON COMMIT DROP;
CREATE TEMP TABLE _pub_pairs (leader int4, lagger int4, lag int2, lagged_corr float4,
    sync_corr float4, improvement float4, overlap int4) ON COMMIT DROP;
"""

# Staging tables have no statistics until ANALYZE; without it the planner guesses tiny
# tables and picks nested loops (measured: 20 s instead of < 1 s at 240,000 neighbor rows).
_ANALYZE_STAGING = "ANALYZE _pub_symbols, _pub_neighbors, _pub_clusters, _pub_pairs"

_INSERT_NEIGHBORS = """
INSERT INTO peer_neighbors (snapshot_date, symbol, rank, neighbor, corr, overlap)
SELECT %(d)s, a.symbol, n.rank, b.symbol, n.corr, n.overlap
FROM _pub_neighbors n JOIN _pub_symbols a ON a.i = n.i JOIN _pub_symbols b ON b.i = n.j
"""

_INSERT_CLUSTERS = """
INSERT INTO symbol_clusters (snapshot_date, symbol, cluster_id)
SELECT %(d)s, a.symbol, c.cluster_id FROM _pub_clusters c JOIN _pub_symbols a ON a.i = c.i
"""

_INSERT_PAIRS = """
INSERT INTO lead_lag_pairs (snapshot_date, leader, lagger, lag, lagged_corr, sync_corr,
                            improvement, overlap)
SELECT %(d)s, a.symbol, b.symbol, p.lag, p.lagged_corr, NULLIF(p.sync_corr, 'NaN'::float4),
       p.improvement, p.overlap
FROM _pub_pairs p JOIN _pub_symbols a ON a.i = p.leader JOIN _pub_symbols b ON b.i = p.lagger
"""


def _symbols_copy_payload(symbols: list[str]) -> bytes:
    """Binary COPY tuples (i int4, symbol text) — the only per-symbol Python loop (N items)."""
    parts = []
    pack = struct.Struct(">hiii").pack
    for i, symbol in enumerate(symbols):
        encoded = symbol.encode("utf-8")
        parts.append(pack(2, 4, i, len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def publish_snapshot(
    engine: sa.Engine,
    *,
    snapshot_date: dt.date | str,
    as_of_trade_date: dt.date | str,
    symbols: Sequence[str],
    n_dropped: int,
    lookback_days: int,
    params: Mapping[str, Any],
    neighbor_index: Any,
    neighbor_corr: Any,
    neighbor_overlap: Any,
    cluster_labels: Any,
    lead_lag_pairs: Any,
) -> PublishReport:
    """Replace the snapshot of ``snapshot_date`` with these results, in one transaction (SPEC §7).

    ``symbols``: the N kept symbols (column order of every index below). ``neighbor_index``
    (int, N × k, −1 = padding), ``neighbor_corr`` (float, N × k), ``neighbor_overlap``
    (int, N × k): SPEC §4 top-k. ``cluster_labels``: int, N (SPEC §5). ``lead_lag_pairs``:
    structured array with :data:`LEAD_LAG_FIELDS`, leader/lagger as indices into ``symbols``
    (SPEC §6). ``params``: JSON-able run parameters stored as jsonb.

    Everything is validated before the transaction starts (:class:`PublishError`, nothing
    written). Database errors surface as the driver's ``psycopg.Error`` subclasses (connection
    loss: ``psycopg.OperationalError``) after the transaction was rolled back. See the module
    docstring for the locking and row rules.
    """
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
    params_json = _json_params(params)

    nb_i, nb_rank, nb_j, nb_corr, nb_overlap = _neighbor_rows(
        n, neighbor_index, neighbor_corr, neighbor_overlap
    )
    labels = _int_array(cluster_labels, "cluster_labels", 1)
    if labels.shape[0] != n:
        raise PublishError(f"cluster_labels has {labels.shape[0]} entries for {n} symbols")
    if labels.size and (labels.min() < 0 or labels.max() > np.iinfo(np.int32).max):
        raise PublishError("cluster_labels must be non-negative int32")
    pairs = _pair_rows(n, lead_lag_pairs)

    neighbors_rec = _records(
        [("i", ">i4"), ("rank", ">i2"), ("j", ">i4"), ("corr", ">f4"), ("overlap", ">i4")],
        nb_i.size,
    )
    neighbors_rec["i"], neighbors_rec["rank"], neighbors_rec["j"] = nb_i, nb_rank, nb_j
    neighbors_rec["corr"], neighbors_rec["overlap"] = nb_corr, nb_overlap
    clusters_rec = _records([("i", ">i4"), ("cluster_id", ">i4")], n)
    clusters_rec["i"], clusters_rec["cluster_id"] = np.arange(n), labels
    pairs_rec = _records(
        [
            ("leader", ">i4"),
            ("lagger", ">i4"),
            ("lag", ">i2"),
            ("lagged_corr", ">f4"),
            ("sync_corr", ">f4"),
            ("improvement", ">f4"),
            ("overlap", ">i4"),
        ],
        pairs["leader"].size,
    )
    for f in LEAD_LAG_FIELDS:
        pairs_rec[f] = pairs[f]
    timings = {"prepare_s": time.perf_counter() - t_start}

    lock_key = (d - _EPOCH).days
    rows: dict[str, int] = {}
    with engine.begin() as conn:
        pg = driver_connection(conn)
        with pg.cursor() as cur:
            t = time.perf_counter()
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (_LOCK_NAMESPACE, lock_key)
            )
            lock_wait = time.perf_counter() - t
            t = time.perf_counter()
            for child in _TABLES[1:]:  # explicit, so correctness does not hinge on CASCADE
                cur.execute(f"DELETE FROM {child} WHERE snapshot_date = %s", (d,))
            cur.execute("DELETE FROM snapshots WHERE snapshot_date = %s", (d,))
            replaced = cur.rowcount > 0
            cur.execute(
                "INSERT INTO snapshots (snapshot_date, as_of_trade_date, n_symbols, n_dropped, "
                "lookback_days, params, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s::jsonb, now())",
                (d, as_of, n, int(n_dropped), int(lookback_days), params_json),
            )
            rows["snapshots"] = cur.rowcount
            timings["replace_snapshot_row_s"] = time.perf_counter() - t
            t = time.perf_counter()
            cur.execute(_STAGING_DDL)
            with cur.copy("COPY _pub_symbols FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(_COPY_HEADER)
                copy.write(_symbols_copy_payload(symbol_list))
                copy.write(_COPY_TRAILER)
            _copy_binary(cur, "_pub_neighbors", neighbors_rec)
            _copy_binary(cur, "_pub_clusters", clusters_rec)
            _copy_binary(cur, "_pub_pairs", pairs_rec)
            cur.execute(_ANALYZE_STAGING)
            timings["copy_s"] = time.perf_counter() - t
            t_insert = time.perf_counter()
            sym = {"d": d}
            for table, statement in (
                ("peer_neighbors", _INSERT_NEIGHBORS),
                ("symbol_clusters", _INSERT_CLUSTERS),
                ("lead_lag_pairs", _INSERT_PAIRS),
            ):
                t = time.perf_counter()
                cur.execute(statement, sym)
                rows[table] = cur.rowcount
                timings[f"insert_{table}_s"] = time.perf_counter() - t
            timings["insert_s"] = time.perf_counter() - t_insert
        expected = {
            "snapshots": 1,
            "peer_neighbors": int(nb_i.size),
            "symbol_clusters": n,
            "lead_lag_pairs": int(pairs_rec.size),
        }
        if rows != expected:  # impossible unless the join lost rows: never commit that
            raise RuntimeError(f"publishing {d}: inserted {rows}, expected {expected}")
        t = time.perf_counter()
    timings["commit_s"] = time.perf_counter() - t
    return PublishReport(
        snapshot_date=d,
        rows=rows,
        seconds=time.perf_counter() - t_start,
        lock_wait_seconds=lock_wait,
        replaced_previous=replaced,
        timings=timings,
    )


def read_snapshot_counts(engine: sa.Engine, snapshot_date: dt.date | str) -> dict[str, int]:
    """Rows per published table for ``snapshot_date``, read in one consistent snapshot."""
    d = as_iso_date(snapshot_date, "snapshot_date", PublishError)
    query = " UNION ALL ".join(
        f"SELECT '{table}', count(*) FROM {table} WHERE snapshot_date = :d" for table in _TABLES
    )
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        result: dict[str, int] = {
            str(table): int(count) for table, count in conn.execute(sa.text(query), {"d": d})
        }
    return {table: int(result[table]) for table in _TABLES}
