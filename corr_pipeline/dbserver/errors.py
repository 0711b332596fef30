"""The error of the embedded server and the database layer that callers (the CLI, the Dagster
retry policy) tell apart."""

from __future__ import annotations


class DatabaseUnavailableError(RuntimeError):
    """PostgreSQL cannot be reached, refused the connection, or the embedded server cannot start.

    The message is one line: it names the (password-free) server and database, or the data
    directory, and says what to do. It never contains a password.
    """
