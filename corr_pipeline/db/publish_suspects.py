"""The rows of ``suspect_prices`` (SPEC §2 "Suspect prices", migration 0010) a snapshot's
publication writes in its transaction (:func:`corr_pipeline.db.publish.publish_snapshot`).

:func:`suspect_rows` validates them before the transaction starts (one symbol once, a share in
``[0, 1]``, a largest ``|return|`` finite and ``>= 0``, a reason); :func:`insert_suspects`
writes them with one ``INSERT ... SELECT FROM unnest(...)`` (a handful of rows, none on clean
prices), whose row count the publication checks like its ``COPY``'s.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

from corr_pipeline.compute.suspect import SuspectSymbol

__all__ = ["SUSPECT_TABLE", "insert_suspects", "suspect_rows"]

SUSPECT_TABLE = "suspect_prices"


def suspect_rows(suspects: Iterable[SuspectSymbol], error: type[Exception]) -> list[tuple]:
    """``(symbol, zero_return_share, max_abs_return, reason, dropped)`` per suspect symbol,
    in symbol order; ``error`` (one line, naming the symbol) for a value the table refuses."""
    rows = []
    for s in suspects:
        share, largest = float(s.zero_return_share), float(s.max_abs_return)
        if not 0.0 <= share <= 1.0:
            raise error(f"suspect {s.symbol!r}: zero_return_share {share} is not in [0, 1]")
        if not (math.isfinite(largest) and largest >= 0.0):
            raise error(f"suspect {s.symbol!r}: max_abs_return {largest} is not finite and >= 0")
        if not s.reason:
            raise error(f"suspect {s.symbol!r}: no reason given")
        rows.append((str(s.symbol), share, largest, str(s.reason), bool(s.dropped)))
    rows.sort(key=lambda row: row[0])
    names = [row[0] for row in rows]
    if len(set(names)) != len(names):
        raise error("suspects lists a symbol twice")
    return rows


def insert_suspects(d: dt.date, rows: list[tuple], cursor: Any) -> None:
    """Insert ``rows`` (:func:`suspect_rows`) as ``d``'s suspect prices, in one statement."""
    columns = [[row[k] for row in rows] for k in range(5)]
    cursor.execute(
        f"INSERT INTO {SUSPECT_TABLE} (snapshot_date, symbol, zero_return_share, "
        "max_abs_return, reason, dropped) "
        "SELECT %s, * FROM unnest(%s::text[], %s::float8[], %s::float8[], %s::text[], "
        "%s::boolean[])",
        (d, *columns),
    )
