"""The top-k neighbors of every symbol by |corr| (SPEC §4).

:func:`top_k_neighbors` is the entry point, in this thread or on a runner's stripes; ``rows.py``
holds the compiled row kernel both use, ``striped.py`` the variant in stripes of rows.
"""

from corr_pipeline.compute.neighbors.rows import Neighbors
from corr_pipeline.compute.neighbors.top_k import top_k_neighbors

__all__ = ["Neighbors", "top_k_neighbors"]
