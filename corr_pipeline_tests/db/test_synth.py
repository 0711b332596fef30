"""Synthetic universe in PostgreSQL: the binary COPY payload and the database load.

The model's own properties (pure numpy) are tested in ``corr_pipeline_tests/synth/test_universe.py``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.db.synth import (
    SynthReport,
    prices_copy_binary_chunks,
    read_truth,
    write_synthetic_universe,
    write_universe,
)
from corr_pipeline.synth import DEFAULT_END_DATE, generate_universe

N_SMALL, T_SMALL = 400, 150


@pytest.fixture(scope="module")
def universe():
    return generate_universe(N_SMALL, T_SMALL, seed=11)


def _bits(a: np.ndarray) -> np.ndarray:
    """float64 array as raw uint64 bits: bit-for-bit comparison, NaN payloads included."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def test_binary_copy_payload_holds_every_row(universe):
    chunks = list(prices_copy_binary_chunks(universe, rows_per_chunk=5_000))
    assert chunks[0].startswith(b"PGCOPY\n\xff\r\n\x00")
    assert chunks[-1] == b"\xff\xff"
    lengths = np.char.str_len(universe.symbols)
    # row size: 2 (field count) + 3 × 4 (lengths) + symbol + 4 (date) + 8 (close)
    expected = len(chunks[0]) + 2 + int(((26 + lengths) * universe.present.sum(axis=0)).sum())
    assert sum(len(c) for c in chunks) == expected
    assert len(chunks) > 3  # chunked


# --------------------------------------------------------------------------------------------
# database load
# --------------------------------------------------------------------------------------------


def _table_content(engine: sa.Engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                'SELECT symbol, trade_date, close FROM prices ORDER BY symbol COLLATE "C", trade_date'
            )
        ).all()


def test_database_round_trip(clean_db):
    u = generate_universe(150, 40, seed=5)
    report = write_universe(clean_db, u)
    assert isinstance(report, SynthReport)
    assert report.rows_written == u.n_rows == int(u.present.sum())
    rows = _table_content(clean_db)
    assert len(rows) == u.n_rows
    # rebuild the panel from the table and compare bit for bit (bad prints included)
    column = {str(s): j for j, s in enumerate(u.symbols)}
    row_of = {d.astype(dt.date): t for t, d in enumerate(u.dates)}
    present = np.zeros_like(u.present)
    close = np.full(u.close.shape, np.nan)
    for symbol, trade_date, value in rows:
        t, j = row_of[trade_date], column[symbol]
        present[t, j] = True
        close[t, j] = value
    assert np.array_equal(present, u.present)
    assert np.array_equal(_bits(close), _bits(u.close))
    # report figures
    assert report.n_symbols == 150 and report.n_days == 40
    assert report.first_date == u.dates[0].astype(dt.date)
    assert report.last_date == DEFAULT_END_DATE
    assert report.n_listed_late == int(u.listed_late.sum())
    assert report.n_delisted_early == int(u.delisted_early.sum())
    assert report.n_halts == u.halts.shape[0]
    assert report.bad_prints == u.bad_print_counts()
    text = str(report)
    assert f"{u.n_rows:,} rows written" in text and "seed=5" in text
    assert f"{len(u.truth)} injected lead-lag pairs" in text


def test_truth_table_readable(clean_db):
    report = write_synthetic_universe(clean_db, n_symbols=120, n_days=30, seed=9)
    u = generate_universe(120, 30, seed=9)
    assert read_truth(clean_db) == u.truth_symbols() == report.truth
    with clean_db.connect() as conn:
        seeds = conn.execute(sa.text("SELECT DISTINCT seed FROM synthetic.lead_lag_truth")).all()
    assert seeds == [(9,)]


def test_rerun_replaces_table_and_same_seed_gives_same_content(clean_db):
    write_synthetic_universe(clean_db, n_symbols=120, n_days=30, seed=1)
    first = _table_content(clean_db)
    first_truth = read_truth(clean_db)
    # a bigger universe with another seed, then the first one again: nothing left behind
    write_synthetic_universe(clean_db, n_symbols=160, n_days=35, seed=2)
    assert _table_content(clean_db) != first
    write_synthetic_universe(clean_db, n_symbols=120, n_days=30, seed=1)
    again = _table_content(clean_db)
    assert len(again) == len(first)
    assert [(s, d) for s, d, _ in again] == [(s, d) for s, d, _ in first]
    assert (
        _bits(np.array([c for *_, c in again])).tolist()
        == _bits(np.array([c for *_, c in first])).tolist()
    )
    assert read_truth(clean_db) == first_truth
    # the indexes dropped for the bulk load are back, and the primary key is enforced
    with clean_db.connect() as conn:
        indexes = {
            name
            for (name,) in conn.execute(
                sa.text("SELECT indexname FROM pg_indexes WHERE tablename = 'prices'")
            )
        }
        assert {"prices_pkey", "ix_prices_trade_date"} <= indexes
    symbol, trade_date, _ = first[0]
    with pytest.raises(sa.exc.IntegrityError):
        with clean_db.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO prices VALUES (:s, :d, 1.0)"), {"s": symbol, "d": trade_date}
            )
