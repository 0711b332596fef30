"""Alembic environment of corr_pipeline: runs the migrations on the connection that
:mod:`corr_pipeline.db.migrate` passes in ``config.attributes["connection"]``, inside that
connection's transaction (PostgreSQL DDL is transactional: an upgrade commits whole or not at
all). There is no ``alembic.ini``: the configuration is built in code
(:func:`corr_pipeline.db.migrate.alembic_config`).

Without a connection (the ``alembic`` command run by hand with a configuration pointing here),
the project's database is used (:func:`corr_pipeline.db.engine.database_url`). Offline mode
(``--sql``) is not supported: revision 0002 reads the catalog.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from corr_pipeline.db.migrate import VERSION_TABLE

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=None,
        version_table=VERSION_TABLE,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("corr_pipeline migrations need a database connection (no --sql mode)")

_connection = config.attributes.get("connection")
if _connection is not None:
    _run(_connection)
else:  # pragma: no cover - the alembic command line, by hand
    from corr_pipeline.db.engine import get_engine

    with get_engine().begin() as _conn:
        _run(_conn)
