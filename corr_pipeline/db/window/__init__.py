"""The price window and the returns matrix (SPEC §2), read from ``prices`` (or another configured
price source) without per-row Python.

``load_returns_window(engine, D, lookback_days=L, min_history_days=m)``:

* **window dates**: the last ``L + 1`` distinct ``trade_date``s ``<= D`` in ``prices`` (all of them
  if fewer exist); ``as_of_trade_date`` is the last one, so a weekend/holiday ``D`` snapshots the
  previous session.
* **closes**: ``C[t, j]`` for window date ``t`` and symbol ``j`` (every symbol with at least one
  row in the window, sorted by code point); missing rows are NaN, and a NaN, infinite or
  non-positive close is a *bad price*: counted (``bad_prices``) and treated as missing.
* **returns**: ``R[t, j] = ln(C[t+1, j] / C[t, j])`` (float64, then cast to float32) where both
  closes are good, else NaN; no forward fill. ``T = len(dates) - 1`` rows.
* **kept symbols**: at least ``min_history_days`` finite returns and non-zero variance of those
  returns (``max != min`` over the float32 values: exact, no rounding threshold). Others are
  reported in ``dropped`` as ``(symbol, reason)``.
* **suspect prices**: per kept symbol, the share of its finite returns that are exactly 0 and its
  largest ``|R|``; above the thresholds of the ``suspect_screen`` it is listed in ``suspects``
  with both figures (:mod:`corr_pipeline.compute.suspect`), and kept unless the screen drops it.

Query plan (two statements in one REPEATABLE READ, read-only transaction, so they see one
consistent snapshot of ``prices`` even while an import commits):

1. window dates by a *loose index scan* of ``ix_prices_trade_date`` (a recursive CTE hopping from
   one distinct date to the previous one: ``L + 1`` index probes, ~3 ms, instead of reading all
   ``N × (L + 1)`` index entries as ``SELECT DISTINCT ... ORDER BY ... LIMIT`` does, ~0.9 s);
2. one row per symbol, aggregated by the server::

       SELECT symbol,
              string_agg(int4send(trade_date - first), ''::bytea),   -- int4 day offsets
              string_agg(float8send(close), ''::bytea)               -- float8 closes
       FROM prices WHERE trade_date >= first AND trade_date < last + 1 GROUP BY symbol

   fetched in binary: each blob is the group's big-endian values back to back (``int4send`` /
   ``float8send`` are the types' binary encodings), so the ``N`` blobs of each column are joined
   and decoded by one ``np.frombuffer`` each. The two aggregates of one group consume the group's
   rows in the same order, so element ``i`` of both belongs to the same row (neither input is
   ever NULL: ``string_agg`` would skip it; a length mismatch is detected). Unlike
   ``array_send(array_agg(...))``, whose elements carry a 4-byte length each, that is 8 + 4
   bytes per row instead of 16, and a ``postgres_fdw`` foreign table ships the pushed-down
   aggregate as hex ``bytea`` instead of text arrays of decimal floats. Symbols are sorted in
   Python (code-point order, independent of the database collation) and the closes pivoted
   with ``np.searchsorted`` (day → window row) and fancy indexing.

Why not ``COPY ... TO STDOUT``: it delivers one message per row, millions at N = 24,000, whose
consumption in psycopg costs many times the client CPU of the per-symbol aggregate, which moves
the per-row work into the server's C code (the server's CPU is about the same either way).
``work_mem`` is raised for this transaction only (:data:`WINDOW_WORK_MEM`) so
the hash aggregate stays in memory (~400 MB at that size) instead of spilling to disk.

Memory in this process at N = 24,000, L = 252: the fetched blobs ≈ 70 MB, closes float64 ≈
49 MB, returns float64 ≈ 49 MB then float32 ≈ 24 MB.

**Another price source** (:mod:`corr_pipeline.db.price_source`: a team's table, view or
foreign table with its own names): the same two statements, with the relation and the columns
quoted as identifiers, the symbol read as ``text`` (grouped byte-wise: ``COLLATE "C"`` is
added for a nondeterministic collation only), the price
as ``float8`` (a NULL price is a bad price, counted like NaN: left out of both blobs by a
``FILTER`` and counted in a third column), and a ``timestamp`` trade-date column turned into a
date as that module says, while the range conditions stay on the raw column (``col <
start of the next day``) so its index serves the loose scan. The source is resolved against
the catalog at the start of the transaction; two rows for one (symbol, date) are refused.

**Several sessions at once** (a backfill): ``load_returns_windows(engine, days, ...)`` returns,
for each day, exactly what ``load_returns_window`` gives for it (or the :class:`WindowError`
it would raise, as a value), from ONE dates scan and ONE grouped query over the union of the
windows in one transaction; each window is then sliced from the union pivot (see its
docstring for the plan and the memory).

The package's rooms: :mod:`.errors`, :mod:`.sql` (the statements), :mod:`.returns` (decoding,
pivot, returns, kept symbols), :mod:`.single` (one window) and :mod:`.union` (several).
"""

from __future__ import annotations

from corr_pipeline.db.window.errors import StaleSessionError, WindowError
from corr_pipeline.db.window.returns import (
    SUSPECT_PRICES,
    TOO_FEW_RETURNS,
    ZERO_VARIANCE,
    ReturnsWindow,
    returns_from_closes,
)
from corr_pipeline.db.window.single import load_returns_window
from corr_pipeline.db.window.sql import WINDOW_WORK_MEM
from corr_pipeline.db.window.union import UnionWindows, load_returns_windows, read_windows

__all__ = [
    "SUSPECT_PRICES",
    "TOO_FEW_RETURNS",
    "WINDOW_WORK_MEM",
    "ZERO_VARIANCE",
    "ReturnsWindow",
    "StaleSessionError",
    "UnionWindows",
    "WindowError",
    "load_returns_window",
    "load_returns_windows",
    "read_windows",
    "returns_from_closes",
]
