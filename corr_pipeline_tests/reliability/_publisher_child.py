"""Child process of the fault and concurrency tests: publishes snapshots through
:func:`corr_pipeline.db.publish.publish_snapshot` into the database at ``URL``.

    python -m corr_pipeline_tests.reliability._publisher_child MODE URL DATE N K VERSION [REPEATS]

MODE
    ``hold``  publish once, but stop inside the transaction -- after the old snapshot was deleted,
              the new snapshots row inserted and the COPYs done -- print
              ``IN_TRANSACTION`` and wait for a line on stdin before going on;
    ``once``  publish once (a large payload is killed while PostgreSQL works on it);
    ``loop``  REPEATS times: publish version VERSION + (i % 2), then delete the snapshot again.

Prints ``DONE`` on success; on an error one JSON line ``{"error": type, "message": text,
"retryable": bool}`` (``retryable``: what the Dagster assets' retry filter decides) and exit 3.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time

import sqlalchemy as sa

from corr_pipeline.db import publish
from corr_pipeline.db.engine import get_engine
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline_tests.reliability._payloads import publish_arguments

STATE_HOLD_S = 0.05
"""``loop`` keeps each state (published, withdrawn) this long, so a polling reader meets both
even when publishing is fast; the races themselves are at the commits, unaffected by it."""


def main(argv: list[str]) -> int:
    mode, url, day_text, n, k, version = argv[:6]
    repeats = int(argv[6]) if len(argv) > 6 else 1
    day = dt.date.fromisoformat(day_text)
    n, k, version = int(n), int(k), int(version)
    if mode == "hold":
        copy_binary = publish._copy_binary

        def held_copy(cursor, table, records):  # type: ignore[no-untyped-def]
            copy_binary(cursor, table, records)
            if table == "lead_lag_pairs":  # the last COPY of the transaction
                print("IN_TRANSACTION", flush=True)
                sys.stdin.readline()

        publish._copy_binary = held_copy
    try:
        engine = get_engine(url)
        if mode == "loop":
            versions = [publish_arguments(day, n=n, k=k, version=version + v) for v in (0, 1)]
            for i in range(repeats):
                publish.publish_snapshot(engine, SnapshotResults(**versions[i % 2]))
                time.sleep(STATE_HOLD_S)  # let readers see the published state, too
                with engine.begin() as conn:
                    conn.execute(
                        sa.text("DELETE FROM snapshots WHERE snapshot_date = :d"), {"d": day}
                    )
                time.sleep(STATE_HOLD_S)
        else:
            publish.publish_snapshot(
                engine, SnapshotResults(**publish_arguments(day, n=n, k=k, version=version))
            )
    except Exception as exc:
        from corr_pipeline.defs.retries import is_database_unavailable

        print(
            json.dumps(
                {
                    "error": f"{type(exc).__module__}.{type(exc).__name__}",
                    "message": str(exc),
                    "retryable": is_database_unavailable(exc),
                }
            ),
            flush=True,
        )
        return 3
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
