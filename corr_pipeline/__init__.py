"""corr_pipeline: nightly correlation snapshots of equity universes.

Importing the package makes numba's cache of compiled kernels private to the user before
anything imports numba (:func:`corr_pipeline.numba_cache.use_private_cache`).
"""

from corr_pipeline.numba_cache import use_private_cache

use_private_cache()
