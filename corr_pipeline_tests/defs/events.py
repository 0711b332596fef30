"""Reading a run's events by asset: the snapshot op reports every asset of every session."""

from __future__ import annotations

from typing import Any

import dagster as dg


def materializations(result: Any, asset: str) -> list[dg.AssetMaterialization]:
    """The materializations of ``asset`` in an execution result, in the order they happened."""
    key = dg.AssetKey(asset)
    return [
        event.event_specific_data.materialization
        for event in result.get_asset_materialization_events()
        if event.asset_key == key
    ]
