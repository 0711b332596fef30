"""The code location: ``workspace.yaml``, ``[tool.dagster]``, ``dg`` (the default
``code_location_target_module`` of the root module ``corr_pipeline``), the Helm chart and the
user code image all load this module. ``defs`` is every definition of ``corr_pipeline/defs/``,
collected as ``dg`` collects a project's defs folder
(:func:`corr_pipeline.defs.location.build_definitions`): a definition is added by declaring it
in a module of that folder.

Loading it also narrows the instance's storage directories under ``$DAGSTER_HOME`` to 0700
(:func:`corr_pipeline.privacy.private_instance_storage`): every process that serves or runs this
location (the code server of ``dg dev``, each run worker) does, so the runs' events and logs are
the owner's alone however the instance was started."""

from __future__ import annotations

import logging
import os

from corr_pipeline import privacy
from corr_pipeline.defs.location import build_definitions

__all__ = ["defs"]

for _problem in privacy.private_instance_storage(os.environ.get("DAGSTER_HOME")):
    logging.getLogger(__name__).warning("Dagster storage %s", _problem)

defs = build_definitions()
