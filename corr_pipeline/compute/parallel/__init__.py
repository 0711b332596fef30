"""Where the striped variants run: the runner protocol and the in-process runner
(``runners.py``), and the Dask runner (``dask_runner.py``, imported only by who uses it:
``distributed`` is an optional dependency)."""

from corr_pipeline.compute.parallel.runners import InProcessRunner, StripeRunner

__all__ = ["InProcessRunner", "StripeRunner"]
