"""Dagster's web server as an ASGI application, for ``corr-pipeline ui`` to serve behind its
access check.

Why Dagster-private names: the ``dagster-webserver`` command builds its application and serves
it in one function, with no place for middleware, and it applies the ``.env`` of its working
directory while it starts. Serving the application ourselves needs the two objects that
function builds: the workspace of a workspace file (``WorkspaceFileTarget``) and the
process-wide workspace context that holds its code locations and the read-only switch
(``WorkspaceProcessContext``), both from :mod:`corr_pipeline.defs.dagster_private`, where
their use is pinned. The application itself comes from ``dagster_webserver.app`` (public;
``corr_pipeline_tests/cli/test_ui_access.py`` starts the real server).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["webserver_app"]


@contextlib.contextmanager
def webserver_app(workspace: Path, *, read_only: bool) -> Iterator[Any]:
    """Yield Dagster's web server application (Starlette) on the instance of ``$DAGSTER_HOME``
    and the code locations of the workspace file ``workspace``; ``read_only``: Dagster's
    read-only mode (no launching, terminating, re-executing, no schedule or sensor switches).
    The instance and the code servers the workspace started are closed when the block ends."""
    import dagster as dg
    from dagster_webserver.app import create_app_from_workspace_process_context
    from dagster_webserver.version import __version__

    from corr_pipeline.defs.dagster_private import WorkspaceFileTarget, WorkspaceProcessContext

    with dg.DagsterInstance.get() as instance:
        # what dagster-webserver does with its defaults: statement timeout 15 s, pool recycle 1 h
        instance.optimize_for_webserver(15000, 3600, 20)
        with WorkspaceProcessContext(
            instance,
            WorkspaceFileTarget(paths=[str(workspace)]),
            version=__version__,
            read_only=read_only,
        ) as context:
            yield create_app_from_workspace_process_context(context, "", 2000)
