"""``python -m corr_pipeline.dbserver watch PGDATA``: the watchdog
(:func:`corr_pipeline.dbserver.watchdog.watch`)."""

from __future__ import annotations

import sys
from pathlib import Path

from corr_pipeline.dbserver.watchdog import watch


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "watch":
        return watch(Path(argv[1]))
    print("usage: python -m corr_pipeline.dbserver watch PGDATA", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
