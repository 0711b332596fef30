"""Which failures a snapshot step retries: only an unreachable database.

The op ``snapshot``, which computes every asset, carries :data:`DATABASE_RETRY_POLICY`, and
what touches the database runs inside :func:`retry_only_if_database_unavailable`: a connection
failure propagates and Dagster retries the step (4 attempts over about 3 minutes); anything else (wrong data, inconsistent parameters,
a bug) becomes ``dg.Failure(allow_retries=False)``, since running the same deterministic
computation again cannot help. Nor is an interrupt retried (:func:`interrupt_not_retried`): a run
asked to terminate ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg
import sqlalchemy as sa

from corr_pipeline.db.engine import DatabaseUnavailableError

#: Database unreachable: 4 attempts, waits of about 15 s, 45 s, 105 s (each +/- 15 s).
DATABASE_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=15, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


def is_database_unavailable(exc: BaseException) -> bool:
    """True for the errors of a server that cannot be reached (or dropped the connection)."""
    return isinstance(
        exc,
        DatabaseUnavailableError
        | sa.exc.OperationalError
        | sa.exc.InterfaceError
        | psycopg.OperationalError
        | psycopg.InterfaceError,
    )


@contextmanager
def retry_only_if_database_unavailable(what: str) -> Iterator[None]:
    """Let "database unreachable" errors through (the RetryPolicy retries them); turn anything
    else into ``dg.Failure(allow_retries=False)`` whose description names ``what`` and the
    error."""
    try:
        yield
    except dg.Failure:
        raise
    except Exception as exc:
        if is_database_unavailable(exc):
            raise
        raise dg.Failure(
            description=f"{what} failed: {type(exc).__name__}: {exc}", allow_retries=False
        ) from exc


@contextmanager
def one_line_failure(*errors: type[Exception]) -> Iterator[None]:
    """Turn ``errors`` (configuration or data problems whose message is already one line naming
    what is wrong, e.g. a misconfigured price source) into ``dg.Failure(allow_retries=False)``
    whose description is exactly that line."""
    try:
        yield
    except errors as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc


@contextmanager
def interrupt_not_retried(what: str) -> Iterator[None]:
    """An interrupt (Dagster raises one in the op when its run is asked to terminate: the UI's
    *Terminate*, a stopped ``corr-pipeline backfill``) ends the step as a failure that is not
    retried, so the run ends canceled. Dagster would otherwise turn it into a retry of the op's
    retry policy, which is meant for an unreachable database, and the run would go on."""
    try:
        yield
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
        raise dg.Failure(
            description=f"{what} interrupted: the run was asked to terminate", allow_retries=False
        ) from None
