"""Block sizing from a working-memory budget, and the fixed GEMM tile.

Every kernel in this package works in row blocks: a block of ``b`` rows against
all ``N`` columns, so temporaries are O(b × N), never N × N. The block height
comes from a budget in MiB, as in scikit-learn's ``get_chunk_n_rows``:

    b = clamp(floor(working_memory_mb · 2**20 / row_bytes), 1, n_rows)

where ``row_bytes`` is what one block row keeps alive (all temporaries).

Bit-identical results for every block size: matrix products are always
issued on the fixed, globally aligned tiles of ``GEMM_TILE`` rows
(``[k·GEMM_TILE, (k+1)·GEMM_TILE)``), in chunks of ``PRODUCT_COLUMNS`` columns
counted from the first column the tile needs, whatever the block. BLAS sums in an
order that depends on the shape of the call, so a product split differently
would round differently; with a fixed tile grid every output element comes
from the very same call. The default block height is a multiple of the tile,
so no product is computed twice; an unaligned block (allowed, e.g. in tests)
recomputes the tile it cuts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

GEMM_TILE = 128
"""Rows per matrix-product call. Fixed: changing it may change the last bit of results."""

PRODUCT_COLUMNS = 2048
"""Columns per matrix-product call, counted from the first column a tile needs (its own first
column in the symmetric case, 0 otherwise); fixed, like :data:`GEMM_TILE`. A tile's columns are split into such chunks so that even a single tile
gives every worker thread work, and each chunk's product stays in cache for its fused pass."""

DEFAULT_WORKING_MEMORY_MB = 512
"""The one default budget (MiB) for the temporaries of every block loop in the package."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``: called after each block (or stripe) of a loop."""


def block_rows_for(row_bytes: int, working_memory_mb: float, n_rows: int) -> int:
    """Rows per block so that ``rows × row_bytes`` fits in ``working_memory_mb`` MiB.

    Rounded down to a multiple of :data:`GEMM_TILE` when at least one tile fits
    (so blocks align with the product tiles), never below 1 nor above ``n_rows``.
    """
    if working_memory_mb <= 0:
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb}")
    rows = int(working_memory_mb * 2**20 // max(int(row_bytes), 1))
    if rows >= GEMM_TILE:
        rows -= rows % GEMM_TILE
    return max(1, min(rows, max(int(n_rows), 1)))


def row_blocks(
    n_rows: int,
    row_bytes: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    *,
    block_rows: int | None = None,
) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` row ranges covering ``[0, n_rows)``, each of at most ``b``
    rows, where ``b`` is ``block_rows`` if given, else :func:`block_rows_for` of the budget.

    This is the one chunking helper of the package (in the spirit of scikit-learn's
    ``get_chunk_n_rows``): every loop over row blocks takes its ranges from here.
    """
    rows = resolve_block_rows(block_rows, row_bytes, working_memory_mb, n_rows)
    return [(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows)]


def square_tile_side(
    element_bytes: int,
    working_memory_mb: float = DEFAULT_WORKING_MEMORY_MB,
    n: int = 1,
    *,
    minimum: int = 1,
) -> int:
    """Side ``b`` of a ``b x b`` tile whose temporaries fit the budget:
    ``b = clamp(floor(sqrt(working_memory_mb · 2**20 / element_bytes)), minimum, n)``, where
    ``element_bytes`` is what one tile element keeps alive (for loops that need a tile and its
    transpose, e.g. a symmetry check read from a memory map)."""
    if working_memory_mb <= 0:
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb}")
    side = int((working_memory_mb * 2**20 / max(int(element_bytes), 1)) ** 0.5)
    return max(1, min(max(side, minimum), int(n)))


def tiles_covering(start: int, stop: int) -> list[tuple[int, int]]:
    """The aligned product tiles ``[k·GEMM_TILE, (k+1)·GEMM_TILE)`` that meet ``[start, stop)``."""
    first = (start // GEMM_TILE) * GEMM_TILE
    return [(t, t + GEMM_TILE) for t in range(first, stop, GEMM_TILE)]


def overlap_dtype(n_rows: int) -> np.dtype:
    """Smallest signed integer type that holds ``n_rows`` (SPEC §3): int8, int16, int32 or int64."""
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        if n_rows <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"too many rows for an overlap count: {n_rows}")


def resolve_block_rows(
    block_rows: int | None, row_bytes: int, working_memory_mb: float, n_rows: int
) -> int:
    """An explicit ``block_rows`` (validated) or the one derived from the budget."""
    if block_rows is None:
        return block_rows_for(row_bytes, working_memory_mb, n_rows)
    if int(block_rows) < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    return min(int(block_rows), max(n_rows, 1))
