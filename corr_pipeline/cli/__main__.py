"""``python -m corr_pipeline.cli ARGS``: the same as ``corr-pipeline ARGS``."""

from __future__ import annotations

import sys

from corr_pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
