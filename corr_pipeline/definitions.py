"""The code location (``workspace.yaml``, ``[tool.dagster]``): the one ``Definitions`` object,
built by :func:`corr_pipeline.defs.definitions.build_definitions`.

Loading it also narrows the instance's storage directories under ``$DAGSTER_HOME`` to 0700
(:func:`corr_pipeline.privacy.private_instance_storage`): every process that serves or runs this
location (the code server of ``dg dev``, each run worker) does, so the runs' events and logs are
the owner's alone however the instance was started."""

from __future__ import annotations

import logging
import os

from corr_pipeline import privacy
from corr_pipeline.defs.definitions import build_definitions, build_resources

__all__ = ["build_resources", "defs"]

for _problem in privacy.private_instance_storage(os.environ.get("DAGSTER_HOME")):
    logging.getLogger(__name__).warning("Dagster storage %s", _problem)

defs = build_definitions()
