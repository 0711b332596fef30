"""The published rows of a session, as tests compare them across ways of computing it."""

from __future__ import annotations

import sqlalchemy as sa

from corr_pipeline.db.schema import CHANGE_TABLES, PUBLISHED_TABLES

#: Columns that record when or by which run a row was written, not what was computed.
RUN_COLUMNS = {"created_at", "previous_published_at", "snapshot_published_at", "matrix_versions"}


def published_rows(engine: sa.Engine, day: str) -> dict[str, list[tuple]]:
    """Every row of ``day`` in every published and change table, without :data:`RUN_COLUMNS`
    (any ``*_at`` column) and ``dagster_run_id`` in ``params``, sorted, read in one snapshot."""
    out = {}
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        for table in (*PUBLISHED_TABLES, *CHANGE_TABLES):
            result = conn.execute(
                sa.text(f"SELECT * FROM {table} WHERE snapshot_date = :d"), {"d": day}
            )
            names = list(result.keys())
            rows = []
            for row in result:
                values = dict(zip(names, row, strict=True))
                if isinstance(values.get("params"), dict):
                    values["params"] = {
                        k: v for k, v in values["params"].items() if k != "dagster_run_id"
                    }
                rows.append(
                    tuple(
                        (k, repr(v))
                        for k, v in values.items()
                        if k not in RUN_COLUMNS and not k.endswith("_at")
                    )
                )
            out[table] = sorted(rows)
    return out
