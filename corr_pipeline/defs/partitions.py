"""Snapshot partitions: one partition per weekday, keyed by the snapshot date ``YYYY-MM-DD``.

The partition key is the snapshot date ``D`` of SPEC §2: the window is the last
``lookback_days + 1`` trade dates ``<= D`` present in ``prices``. Only weekdays are partitions
(cron ``0 0 * * 1-5``); an exchange holiday that falls on a weekday is still a partition and
snapshots the previous session (``as_of_trade_date`` in the ``snapshots`` row says which).

The first partition is ``$CORR_PIPELINE_PARTITION_START`` (``YYYY-MM-DD``, default
:data:`corr_pipeline.settings.DEFAULT_PARTITION_START`), read once when the code location loads. Partition windows are
UTC days: the partition ``D`` covers ``D 00:00`` to the next weekday ``00:00``. The
partitions definition has ``end_offset=1``, so today's partition (the session in progress, or the
Friday during a weekend) already exists: a snapshot can be built the evening of its session,
and a synthetic universe ending on the last weekday is immediately addressable. The nightly
schedule (:mod:`corr_pipeline.defs.jobs`) still only requests the previous weekday.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from corr_pipeline import settings

PARTITION_FMT = "%Y-%m-%d"
WEEKDAY_CRON = "0 0 * * 1-5"
PARTITION_TIMEZONE = "UTC"


def build_partitions_def(start: dt.date | None = None) -> dg.TimeWindowPartitionsDefinition:
    """Weekday partitions starting at ``start`` (default :func:`corr_pipeline.settings.partition_start`)."""
    start = start or settings.partition_start()
    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=WEEKDAY_CRON,
        fmt=PARTITION_FMT,
        start=start.strftime(PARTITION_FMT),
        timezone=PARTITION_TIMEZONE,
        end_offset=1,
    )


snapshot_partitions = build_partitions_def()


def snapshot_date(partition_key: str) -> dt.date:
    """The snapshot date ``D`` a partition key stands for (SPEC §2)."""
    try:
        return dt.datetime.strptime(partition_key, PARTITION_FMT).date()
    except ValueError:
        raise ValueError(
            f"partition key {partition_key!r} is not a snapshot date in YYYY-MM-DD form"
        ) from None


def previous_weekday(day: dt.date) -> dt.date:
    """The last weekday strictly before ``day`` (Friday for a Saturday, Sunday or Monday)."""
    day = day - dt.timedelta(days=1)
    while day.weekday() >= 5:
        day -= dt.timedelta(days=1)
    return day


def weekday_on_or_before(day: dt.date) -> dt.date:
    """``day`` itself if it is a weekday, else the Friday before it."""
    while day.weekday() >= 5:
        day -= dt.timedelta(days=1)
    return day


def partition_key_for(day: dt.date) -> str:
    """The key of the partition whose snapshot date is the weekday on or before ``day``."""
    return weekday_on_or_before(day).strftime(PARTITION_FMT)
