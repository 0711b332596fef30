"""A :class:`~corr_pipeline.compute.parallel.runners.StripeRunner` on a Dask distributed cluster.

``distributed`` is an optional dependency (``pip install -e '.[dask]'``), imported only when a
runner is made. Per :meth:`DaskRunner.map`: ``shared`` (the returns R, T x N float32) is
scattered once to every worker (``broadcast=True``), one task per stripe is submitted (with
feedback, as many at a time as the cluster has threads, the next as one completes), and the
results are gathered as they complete (``as_completed``, which drives ``progress``) and returned
in stripe order. A worker that dies mid-stripe has its task re-run by the scheduler on another
worker (up to ``distributed.scheduler.allowed-failures`` times, default 3): the stripe
functions are idempotent, so the result is the same. A task the scheduler cancels instead
(seen once in the killed-worker test, with stripes submitted as others complete: "already
forgotten") is submitted again, with ``shared`` scattered again, up to three times.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from corr_pipeline.compute.tiling import Progress

if TYPE_CHECKING:
    from distributed import Client

    from corr_pipeline.compute.parallel.runners import StripeFeedback

T = TypeVar("T")

_RESUBMISSIONS = 3
"""Times a stripe whose task the scheduler cancelled is submitted again before the call fails."""


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
        (:class:`~corr_pipeline.compute.parallel.runners.StripeRunner`)."""
        from distributed import as_completed

        token = f"{fn.__name__}-{uuid.uuid4().hex}"
        scatter = (
            [] if shared is None else [self.client.scatter(shared, broadcast=True, hash=False)]
        )
        ahead = len(stripes)
        if feedback is not None:
            ahead = max(1, sum(self.client.nthreads().values()))
        futures: list[Any] = []
        position: dict[Any, int] = {}
        cancelled = [0] * len(stripes)

        def submit(i: int) -> Any:
            extra = () if feedback is None else (feedback.current(),)
            key = f"{token}-{i}" + (f"-again-{cancelled[i]}" if cancelled[i] else "")
            shared_now = scatter[-1] if scatter else None
            future = self.client.submit(
                fn, shared_now, stripes[i], token, *args, *extra, key=key, pure=False
            )
            futures.append(future)
            position[future.key] = i
            return future

        results: list[Any] = [None] * len(stripes)
        submitted = min(ahead, len(stripes))
        try:
            completed = as_completed([submit(i) for i in range(submitted)], loop=self.client.loop)
            done = 0
            for future in completed:
                i = position[future.key]
                try:
                    result = future.result()
                except CancelledError:
                    # the scheduler dropped the task (e.g. its copies of ``shared`` went with a
                    # dead worker): ship ``shared`` again and resubmit the stripe, idempotent
                    cancelled[i] += 1
                    if cancelled[i] > _RESUBMISSIONS:
                        raise
                    if shared is not None:
                        scatter.append(self.client.scatter(shared, broadcast=True, hash=False))
                    completed.add(submit(i))
                    continue
                results[i] = result if feedback is None else feedback.update(result)
                done += 1
                if submitted < len(stripes):
                    completed.add(submit(submitted))
                    submitted += 1
                if progress is not None:
                    progress(done, len(stripes))
        finally:
            self.client.cancel([*futures, *scatter])
        return results


@contextmanager
def connect(address: str, security: Any = None) -> Iterator[DaskRunner]:
    """A runner on the scheduler at ``address`` (``tls://host:8786``), closed on exit;
    ``security``: the ``distributed.Security`` it is reached with (the pipeline's, mutual TLS:
    :mod:`corr_pipeline.snapshot.scheduler`)."""
    from distributed import Client

    with Client(address, security=security, set_as_default=False) as client:
        yield DaskRunner(client)
