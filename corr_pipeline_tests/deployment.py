"""The code location's resources for a test's own matrix store.

Where a run reads and writes is deployment configuration (the environment), never run config:
a test that wants its own store sets ``CORR_PIPELINE_STORE_DIR``, which the autouse fixture
``deployment_settings_restored`` (conftest) puts back after the test.
"""

from __future__ import annotations

import os
from pathlib import Path

from corr_pipeline import settings
from corr_pipeline.definitions import build_resources


def use_store(store_dir: str | os.PathLike[str]) -> Path:
    """Make ``store_dir`` the matrix store of this process and the runs it starts, for the rest
    of the test; returns it."""
    path = Path(store_dir)
    os.environ[settings.ENV_STORE_DIR] = str(path)
    return path


def resources_at(store_dir: str | os.PathLike[str]) -> dict[str, object]:
    """:func:`~corr_pipeline.definitions.build_resources` with the matrix store at
    ``store_dir`` (:func:`use_store`)."""
    use_store(store_dir)
    return build_resources()
