"""The order in which an asset's metadata reads in the Dagster UI: what it found first.

The UI lists a materialization's metadata in the order of its keys. An asset's own entries
come in three groups, in this order (:func:`in_reading_order`):

1. the quant's figures and tables (counts, correlations, clusters, changes);
2. its pictures, each keyed ``picture: <what it shows>`` (:func:`picture_key`), because the UI
   opens a picture behind a "[Show Markdown]" button that says nothing of what is behind it;
3. the step's housekeeping (:data:`HOUSEKEEPING_KEYS`: time, memory, where the matrices live,
   the Dask cluster);
4. the matrix store's entries (:data:`STORE_KEYS`: path, arrays, versions, bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HOUSEKEEPING_KEYS", "PICTURE_PREFIX", "STORE_KEYS", "in_reading_order", "picture_key"]

PICTURE_PREFIX = "picture: "
"""The start of every picture's metadata key."""

HOUSEKEEPING_KEYS = (
    "stage_seconds",
    "check_seconds",
    "peak_rss_mib",
    "rss_anon_mib",
    "matrices_in_memory",
    "dask_dashboard",
    "dask_workers",
)
"""The step's own figures, listed after the results (in this order)."""

STORE_KEYS = ("path", "arrays", "versions", "bytes", "copied_bytes", "zero_copy_arrays")
"""Where the matrix store keeps the asset's arrays (:func:`corr_pipeline.defs.io_manager.stored_metadata`),
listed last."""


def picture_key(what: str) -> str:
    """``picture: <what>``: the metadata key of a picture showing ``what``."""
    return PICTURE_PREFIX + what


def in_reading_order(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with the results first (in their own order), then the pictures, then the
    housekeeping keys, then the store's (each in the order of its tuple)."""
    pictures = [key for key in metadata if key.startswith(PICTURE_PREFIX)]
    last = set(HOUSEKEEPING_KEYS) | set(STORE_KEYS) | set(pictures)
    keys = [key for key in metadata if key not in last]
    keys += pictures
    keys += [key for key in (*HOUSEKEEPING_KEYS, *STORE_KEYS) if key in metadata]
    return {key: metadata[key] for key in keys}
