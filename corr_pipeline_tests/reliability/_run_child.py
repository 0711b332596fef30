"""Child process of the concurrency tests: one snapshot run through the project's runner.

    python -m corr_pipeline_tests.reliability._run_child PARTITION STORE_DIR DAGSTER_HOME PARAMS_JSON

Imports everything, prints ``READY``, waits for a line on stdin (so that several children start
their runs at the same moment), runs :func:`corr_pipeline.defs.run.materialize_snapshot`
(in-process executor) and prints one JSON line: ``run_id``, ``success``, ``failed_steps``,
``checks``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from corr_pipeline.defs.run import materialize_snapshot, open_instance


def main(argv: list[str]) -> int:
    partition, store_dir, dagster_home, params_json = argv
    instance = open_instance(Path(dagster_home))
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        summary = materialize_snapshot(
            partition,
            instance=instance,
            params=json.loads(params_json),
            store_dir=store_dir,
            in_process=True,
        )
    finally:
        instance.dispose()
    print(
        json.dumps(
            {
                "run_id": summary.run_id,
                "success": summary.success,
                "failed_steps": summary.failed_steps,
                "checks": summary.checks,
            }
        ),
        flush=True,
    )
    return 0 if summary.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
