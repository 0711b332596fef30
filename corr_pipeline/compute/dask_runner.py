"""A :class:`~corr_pipeline.compute.stripes.StripeRunner` on a Dask distributed cluster.

``distributed`` is an optional dependency (``pip install -e '.[dask]'``), imported only when a
runner is made. Per :meth:`DaskRunner.map`: ``shared`` (the returns R, T x N float32) is
scattered once to every worker (``broadcast=True``), one task per stripe is submitted (with
feedback, as many at a time as the cluster has threads, the next as one completes), and the
results are gathered as they complete (``as_completed``, which drives ``progress``) and returned
in stripe order. A worker that dies mid-stripe has its task re-run by the scheduler on another
worker (up to ``distributed.scheduler.allowed-failures`` times, default 3): the stripe
functions are idempotent, so the result is the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from corr_pipeline.compute.correlation import Progress

if TYPE_CHECKING:
    from distributed import Client

    from corr_pipeline.compute.stripes import StripeFeedback

T = TypeVar("T")


class DaskRunner:
    """Runs stripes as tasks of the cluster behind ``client``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @property
    def dashboard_link(self) -> str:
        """The URL of the cluster's Dask dashboard (served when bokeh is installed there)."""
        return str(self.client.dashboard_link)

    @property
    def n_workers(self) -> int:
        """Workers connected to the scheduler now."""
        return len(self.client.scheduler_info().get("workers", {}))

    def map(
        self,
        fn: Callable[..., T],
        shared: np.ndarray | None,
        stripes: Sequence[tuple[int, int]],
        *args: Any,
        progress: Progress | None = None,
        feedback: StripeFeedback | None = None,
    ) -> list[T]:
        """``[fn(shared, stripe, token, *args) for stripe in stripes]``, one task per stripe, all
        submitted at once; with ``feedback``, as many at a time as the cluster has threads
        (:class:`~corr_pipeline.compute.stripes.StripeRunner`)."""
        from distributed import as_completed

        token = f"{fn.__name__}-{uuid.uuid4().hex}"
        scattered = (
            None if shared is None else self.client.scatter(shared, broadcast=True, hash=False)
        )
        ahead = len(stripes)
        if feedback is not None:
            threads = self.client.nthreads()
            ahead = max(1, sum(threads.values()))

        def submit(i: int) -> Any:
            extra = () if feedback is None else (feedback.current(),)
            stripe = stripes[i]
            return self.client.submit(
                fn, scattered, stripe, token, *args, *extra, key=f"{token}-{i}", pure=False
            )

        futures = [submit(i) for i in range(min(ahead, len(stripes)))]
        position = {future.key: i for i, future in enumerate(futures)}
        results: list[Any] = [None] * len(stripes)
        try:
            completed = as_completed(futures, loop=self.client.loop)
            for done, future in enumerate(completed, start=1):
                result = future.result()
                results[position[future.key]] = result
                if feedback is not None:
                    feedback.update(result)
                if len(futures) < len(stripes):
                    futures.append(submit(len(futures)))
                    position[futures[-1].key] = len(futures) - 1
                    completed.add(futures[-1])
                if progress is not None:
                    progress(done, len(stripes))
        finally:
            self.client.cancel([*futures, *([] if scattered is None else [scattered])])
        return results


@contextmanager
def connect(address: str) -> Iterator[DaskRunner]:
    """A runner on the scheduler at ``address`` (e.g. ``tcp://host:8786``), closed on exit."""
    from distributed import Client

    with Client(address, set_as_default=False) as client:
        yield DaskRunner(client)
