"""No database password in a run's stored events.

What a run records (a failed step's error: its message, the messages of its causes and its
stack; log lines; metadata) is shown to anyone who opens the UI. The project's own messages
never contain a password, but an error raised by a library may quote what it was given: the
last line of defence is :func:`hide_event_secrets`, which the project's instance
(:class:`corr_pipeline.defs.instance_storage.SnapshotInstance`) applies to every event before
it is stored. It replaces each password of ``$CORR_PIPELINE_DATABASE_URL``
(:func:`corr_pipeline.db.engine.secret_texts`: decoded or percent-encoded) by ``***`` in every
text of the event.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from corr_pipeline.db.engine import HIDDEN, secret_texts

__all__ = ["hide_event_secrets"]


def _hidden(value: Any, secrets: list[str]) -> Any:
    """``value`` (JSON: dicts, lists, texts, numbers) with every secret in its texts hidden."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, HIDDEN)
        return value
    if isinstance(value, list):
        return [_hidden(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: _hidden(item, secrets) for key, item in value.items()}
    return value


def hide_event_secrets(entry: dg.EventLogEntry) -> dg.EventLogEntry:
    """``entry`` itself when none of its texts holds a password of the deployment's database
    URL, else a copy whose texts have each password replaced by ``***``."""
    secrets = secret_texts()
    if not secrets:
        return entry
    text = dg.serialize_value(entry)
    if not any(json.dumps(secret)[1:-1] in text for secret in secrets):  # as JSON writes it
        return entry
    hidden = _hidden(json.loads(text), secrets)
    return dg.deserialize_value(json.dumps(hidden), dg.EventLogEntry)
