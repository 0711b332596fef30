"""Load a synthetic universe (:mod:`corr_pipeline.synth.universe`) into PostgreSQL.

``write_synthetic_universe(engine, n_symbols=..., n_days=..., seed=...)`` generates the universe
and **replaces the whole content** of ``prices`` and of the synthetic ground truth
``synthetic.lead_lag_truth`` with it, in one transaction:

1. ``TRUNCATE prices, synthetic.lead_lag_truth``, then drop the indexes of ``prices`` (its
   primary key and ``ix_prices_trade_date``, read from the catalog, so whatever the schema holds;
   ``bulk.prices_indexes_deferred_if_empty``, shared with the CSV import);
2. ``COPY prices (symbol, trade_date, close) FROM STDIN (FORMAT BINARY, FREEZE)`` of every existing
   row (``universe.present``), bad prints included (``0``, negative, ``NaN``, ``Infinity``: they
   are stored as is, SPEC §1 makes the pipeline turn the returns touching them into NaN);
3. recreate the dropped indexes with their original names and definitions (a sorted build is
   ~4x faster than maintaining the B-trees row by row during the COPY);
4. ``INSERT`` the injected pairs (by symbol name) with the seed into ``synthetic.lead_lag_truth``;
5. ``ANALYZE prices`` so the window query is planned on fresh statistics.

Why replace everything rather than upsert: the truth pairs are only the truth for a table that
holds nothing else (foreign rows would add dates to the window and symbols to the scan), and a
re-run with other sizes must not leave the previous run's extra symbols behind. A re-run with the
same arguments therefore leaves a bit-identical table. Readers never see a half-loaded table:
until the commit they see the previous content (the TRUNCATE lock makes them wait).

Fast path: the COPY payload is built in PostgreSQL's binary format with numpy structured arrays
(one fixed-size record per row for each symbol byte-length), so there is no per-row Python and no
float-to-text formatting; closes travel as exact float64. At N = 24,000 × 350 days
(≈ 7.8 M rows after ragged histories) building the payload takes well under a second; the
server-side insert and index maintenance dominate (see :class:`SynthReport` timings).
"""

from __future__ import annotations

import datetime as dt
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa

from corr_pipeline.db.bulk import driver_connection, prices_indexes_deferred_if_empty
from corr_pipeline.db.schema import synthetic_lead_lag_truth
from corr_pipeline.synth import BAD_PRINT_KINDS, SyntheticUniverse, generate_universe

#: The synthetic ground truth: the injected lead-lag pairs (its own schema, apart from production).
TRUTH_TABLE = synthetic_lead_lag_truth.fullname

#: Target rows per COPY chunk (~32 bytes each): bounds the payload held in memory at once.
COPY_ROWS_PER_CHUNK = 1_000_000

#: ``maintenance_work_mem`` for rebuilding the ``prices`` indexes after the load (one sort in
#: memory at N = 24,000 × 350; transaction-local, the server default is untouched).
INDEX_BUILD_MEMORY = "512MB"

_PG_EPOCH = np.datetime64("2000-01-01", "D")
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)  # flags, header extension
_COPY_TRAILER = struct.pack(">h", -1)


def _binary_row_dtype(symbol_bytes: int) -> np.dtype:
    """One ``prices`` tuple in COPY BINARY: field count, then (length, value) per column."""
    return np.dtype(
        [
            ("n_fields", ">i2"),
            ("symbol_len", ">i4"),
            ("symbol", f"S{symbol_bytes}"),
            ("date_len", ">i4"),
            ("date", ">i4"),  # days since 2000-01-01
            ("close_len", ">i4"),
            ("close", ">f8"),
        ]
    )


def prices_copy_binary_chunks(
    universe: SyntheticUniverse, *, rows_per_chunk: int = COPY_ROWS_PER_CHUNK
) -> Iterator[bytes]:
    """The ``COPY prices (symbol, trade_date, close) FROM STDIN (FORMAT BINARY)`` payload of every
    existing row of ``universe``, in chunks of about ``rows_per_chunk`` rows.

    The first chunk starts with the binary signature, the last one is the trailer. Rows are
    ordered by symbol then date within each group of equal-length symbols (so the bulk of the
    load arrives in primary-key order). Symbols must be ASCII (the generator's are).
    """
    symbol_bytes = np.char.encode(universe.symbols, "ascii")
    symbol_lengths = np.char.str_len(symbol_bytes)
    day_numbers = (universe.dates - _PG_EPOCH).astype(np.int32)
    columns_per_chunk = max(1, rows_per_chunk // max(1, universe.n_days))
    yield _COPY_SIGNATURE
    for length in np.unique(symbol_lengths):
        length = int(length)
        columns = np.flatnonzero(symbol_lengths == length)
        row_dtype = _binary_row_dtype(length)
        for start in range(0, columns.shape[0], columns_per_chunk):
            chunk_columns = columns[start : start + columns_per_chunk]
            # symbol-major order: nonzero of the transposed mask walks symbol by symbol
            symbol_pos, row = np.nonzero(universe.present[:, chunk_columns].T)
            if symbol_pos.shape[0] == 0:
                continue
            records = np.empty(symbol_pos.shape[0], dtype=row_dtype)
            records["n_fields"] = 3
            records["symbol_len"] = length
            records["symbol"] = symbol_bytes[chunk_columns][symbol_pos]
            records["date_len"] = 4
            records["date"] = day_numbers[row]
            records["close_len"] = 8
            records["close"] = universe.close[row, chunk_columns[symbol_pos]]
            yield records.tobytes()
    yield _COPY_TRAILER


def _copy_prices(conn: sa.Connection, universe: SyntheticUniverse) -> tuple[int, float]:
    """COPY every row of ``universe`` into ``prices``; returns (rows, seconds spent building the
    payload). ``FREEZE`` is allowed because the table was truncated in this transaction."""
    build_seconds = 0.0
    with driver_connection(conn).cursor() as cursor:
        with cursor.copy(
            "COPY prices (symbol, trade_date, close) FROM STDIN (FORMAT BINARY, FREEZE)"
        ) as copy:
            chunks = prices_copy_binary_chunks(universe)
            while True:
                build_started = time.perf_counter()
                chunk = next(chunks, None)
                build_seconds += time.perf_counter() - build_started
                if chunk is None:
                    break
                copy.write(chunk)
        return int(cursor.rowcount), build_seconds


@dataclass(frozen=True)
class SynthReport:
    """What :func:`write_synthetic_universe` / :func:`write_universe` wrote.

    ``str(report)`` is the short summary printed by ``corr-pipeline prices synth``.
    """

    seed: int
    n_symbols: int
    n_days: int
    first_date: dt.date
    last_date: dt.date
    rows_written: int
    n_listed_late: int
    n_delisted_early: int
    n_halts: int
    bad_prints: dict[str, int]
    truth: list[tuple[str, str, int]]
    generate_seconds: float
    load_seconds: float
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def n_bad_prints(self) -> int:
        return sum(self.bad_prints.values())

    def __str__(self) -> str:
        bad = ", ".join(f"{count} {kind}" for kind, count in self.bad_prints.items())
        example = ""
        if self.truth:
            leader, lagger, lag = self.truth[0]
            example = f" (e.g. {leader} leads {lagger} by {lag} day{'s' if lag > 1 else ''})"
        return (
            f"synthetic universe seed={self.seed}: {self.n_symbols:,} symbols x {self.n_days:,} "
            f"weekdays {self.first_date}..{self.last_date}; {self.rows_written:,} rows written "
            f"(prices table replaced)\n"
            f"  ragged: {self.n_listed_late:,} listed late, {self.n_delisted_early:,} delisted "
            f"early; {self.n_halts:,} single-day halts; {self.n_bad_prints:,} bad prints over the whole "
            f"history ({bad})\n"
            f"  {len(self.truth):,} injected lead-lag pairs in {TRUTH_TABLE}{example}\n"
            f"  generated in {self.generate_seconds:.1f} s, loaded in {self.load_seconds:.1f} s"
        )


def write_universe(
    engine: sa.Engine,
    universe: SyntheticUniverse,
    *,
    generate_seconds: float = 0.0,
    log: Callable[[str], None] | None = None,
) -> SynthReport:
    """Replace ``prices`` and ``synthetic.lead_lag_truth`` with ``universe`` (one transaction;
    see the module docstring). Needs the schema at the newest revision. Returns the
    :class:`SynthReport`."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    truth_rows = [
        {"leader": leader, "lagger": lagger, "lag": lag, "seed": universe.seed}
        for leader, lagger, lag in universe.truth_symbols()
    ]
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE prices, {TRUTH_TABLE}"))
        copy_started = time.perf_counter()
        with prices_indexes_deferred_if_empty(conn, index_memory=INDEX_BUILD_MEMORY) as deferred:
            rows_written, timings["copy_build"] = _copy_prices(conn, universe)
            timings["copy"] = time.perf_counter() - copy_started
            if log:
                log(f"copied {rows_written:,} rows in {timings['copy']:.1f} s")
        timings["index"] = time.perf_counter() - copy_started - timings["copy"]
        if log and deferred:
            log(f"rebuilt the prices indexes in {timings['index']:.1f} s")
        if truth_rows:
            conn.execute(sa.insert(synthetic_lead_lag_truth), truth_rows)
        analyze_started = time.perf_counter()
        conn.execute(sa.text("ANALYZE prices"))
        timings["analyze"] = time.perf_counter() - analyze_started
    load_seconds = time.perf_counter() - started
    timings["other"] = load_seconds - timings["copy"] - timings["index"] - timings["analyze"]
    if rows_written != universe.n_rows:
        raise RuntimeError(
            f"COPY reported {rows_written} rows but the universe has {universe.n_rows}"
        )
    return SynthReport(
        seed=universe.seed,
        n_symbols=universe.n_symbols,
        n_days=universe.n_days,
        first_date=universe.dates[0].astype(dt.date),
        last_date=universe.dates[-1].astype(dt.date),
        rows_written=rows_written,
        n_listed_late=int(np.count_nonzero(universe.listed_late)),
        n_delisted_early=int(np.count_nonzero(universe.delisted_early)),
        n_halts=int(universe.halts.shape[0]),
        bad_prints={kind: universe.bad_print_counts()[kind] for kind in BAD_PRINT_KINDS},
        truth=universe.truth_symbols(),
        generate_seconds=generate_seconds,
        load_seconds=load_seconds,
        timings=timings,
    )


def write_synthetic_universe(
    engine: sa.Engine,
    *,
    n_symbols: int,
    n_days: int,
    seed: int,
    end_date: dt.date | str | None = None,
    log: Callable[[str], None] | None = None,
) -> SynthReport:
    """Generate ``generate_universe(n_symbols, n_days, seed, end_date)`` and replace ``prices``
    and ``synthetic.lead_lag_truth`` with it (see the module docstring). ``log`` receives
    progress lines. Invalid sizes raise before the database is touched."""
    started = time.perf_counter()
    universe = generate_universe(n_symbols, n_days, seed, end_date)
    generate_seconds = time.perf_counter() - started
    if log:
        log(
            f"generated {universe.n_symbols:,} symbols x {universe.n_days:,} days "
            f"({universe.n_rows:,} rows) in {generate_seconds:.1f} s"
        )
    return write_universe(engine, universe, generate_seconds=generate_seconds, log=log)


def read_truth(engine: sa.Engine) -> list[tuple[str, str, int]]:
    """The recorded injected pairs ``(leader, lagger, lag)``, sorted by leader then lagger in
    code-point order (in Python: the database collation may order punctuation differently)."""
    t = synthetic_lead_lag_truth.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.leader, t.lagger, t.lag)).all()
    return sorted((str(leader), str(lagger), int(lag)) for leader, lagger, lag in rows)
