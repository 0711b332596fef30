"""A copy of the checkout's project root for the tests that run Dagster's own commands.

``dg`` and ``dagster`` apply every line of the ``.env`` of the project root they run in (the
checkout's holds the demo's first partition once ``corr-pipeline demo`` ran), and
``CORR_PIPELINE_ENV_FILE=off`` is the ``corr-pipeline`` commands' setting, not theirs: such a test
runs them in :func:`project_copy`, the same project without the ``.env``.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The files that make a directory the project root for ``dg`` and ``corr-pipeline``.
PROJECT_FILES = ("pyproject.toml", "dagster.yaml", "workspace.yaml")


def project_copy(parent: Path) -> Path:
    """``parent/project``: the checkout's :data:`PROJECT_FILES` and a link to its package, no
    ``.env``; created on first use, returned as a resolved path."""
    root = (parent / "project").resolve()
    if not root.exists():
        root.mkdir(parents=True)
        for name in PROJECT_FILES:
            (root / name).write_bytes((REPO / name).read_bytes())
        (root / "corr_pipeline").symlink_to(REPO / "corr_pipeline")
    return root
