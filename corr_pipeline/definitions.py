"""The code location (``workspace.yaml``, ``[tool.dagster]``): the one ``Definitions`` object,
built by :func:`corr_pipeline.defs.definitions.build_definitions`."""

from __future__ import annotations

from corr_pipeline.defs.definitions import build_definitions, build_resources

__all__ = ["build_resources", "defs"]

defs = build_definitions()
