"""``prices_ready_sensor``: run a session's snapshot when its prices are in (an alternative to the
nightly schedule; both are created stopped, start one of them).

Every evaluation (every :data:`SENSOR_INTERVAL_SECONDS`) looks at the latest *closed* session of
the code location's calendar (:meth:`corr_pipeline.sessions.SessionCalendar.last_closed_session`)
and reads, through :func:`corr_pipeline.db.price_reads.session_prices`, how complete its prices are in
the configured price source (the ``price_source`` resource): the share of the symbols priced on
the previous trade date that also have a price on the session. It requests ``snapshot_job`` for
that partition

- when the share reaches ``min_share`` (default 95 %, ``$CORR_PIPELINE_SENSOR_MIN_SHARE``), tag
  ``corr_pipeline/trigger=complete``;
- or, however incomplete, once ``cutoff_minutes`` (default 180,
  ``$CORR_PIPELINE_SENSOR_CUTOFF_MINUTES``) have passed since the close: tag
  ``corr_pipeline/trigger=cutoff``, and the sensor's log says how complete the day was. A
  session with no price at all is never run (its snapshot would be the previous session's,
  under this date): the sensor skips, saying so.

Every request carries ``corr_pipeline/completeness`` (e.g. ``0.973``), the counts
(``corr_pipeline/symbols`` = priced on the session / priced on the previous trade date) and
``corr_pipeline/prices_fingerprint`` (row count and md5 of the session's rows); the
``returns_matrix`` step repeats them in the run's log.

A session is requested once. The cursor (JSON) remembers the fingerprint each recent session was
requested with; when a later evaluation finds different prices for it (a correction, or prices
that arrived after a cut-off run), it waits one more evaluation for the prices to settle (the
same new fingerprint twice in a row), then requests a re-run: ``run_key`` =
``<session>:<fingerprint>``, tag ``corr_pipeline/rerun=correction``. Only the latest closed
session is watched: a correction of an older session is re-run by hand (a backfill of that
partition; later snapshots whose window holds the corrected day are not re-run either).

The runs carry ``snapshot_job``'s tags (max runtime); the run queue limits them like any snapshot run.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
from pydantic import ConfigDict, Field

from corr_pipeline import settings
from corr_pipeline.db.price_reads import SessionPrices, session_prices
from corr_pipeline.defs.jobs import snapshot_job
from corr_pipeline.defs.partitions import PARTITION_FMT, snapshot_calendar
from corr_pipeline.defs.resources import PostgresResource, PriceSourceResource
from corr_pipeline.sessions import SessionCalendar

__all__ = [
    "COMPLETENESS_TAG",
    "FINGERPRINT_TAG",
    "RERUN_TAG",
    "SENSOR_INTERVAL_SECONDS",
    "TRIGGER_TAG",
    "PricesSensorSettings",
    "build_prices_ready_sensor",
    "prices_ready_sensor",
]

SENSOR_INTERVAL_SECONDS = 300
COMPLETENESS_TAG = "corr_pipeline/completeness"
SYMBOLS_TAG = "corr_pipeline/symbols"
FINGERPRINT_TAG = "corr_pipeline/prices_fingerprint"
TRIGGER_TAG = "corr_pipeline/trigger"
RERUN_TAG = "corr_pipeline/rerun"
#: How many sessions the cursor remembers.
CURSOR_SESSIONS = 10


class PricesSensorSettings(dg.ConfigurableResource):
    """When ``prices_ready_sensor`` considers a session's prices in (fields left unset take
    their environment variable when the sensor evaluates)."""

    model_config = ConfigDict(hide_input_in_errors=True)  # pydantic's errors leave the input out

    min_share: float | None = Field(
        default=None,
        description="Request the snapshot once this share (0 < share <= 1) of the symbols "
        "priced on the previous trade date have a price on the session. Default: "
        "$CORR_PIPELINE_SENSOR_MIN_SHARE or 0.95.",
    )
    cutoff_minutes: int | None = Field(
        default=None,
        description="... or, however incomplete, this many minutes after the session's close. "
        "Default: $CORR_PIPELINE_SENSOR_CUTOFF_MINUTES or 180.",
    )

    def share(self) -> float:
        value = settings.sensor_min_share() if self.min_share is None else self.min_share
        if not 0.0 < value <= 1.0:
            raise ValueError(f"prices_sensor_settings.min_share={value!r} must be in (0, 1]")
        return value

    def cutoff(self) -> dt.timedelta:
        value = (
            settings.sensor_cutoff_minutes() if self.cutoff_minutes is None else self.cutoff_minutes
        )
        if value < 0:
            raise ValueError(f"prices_sensor_settings.cutoff_minutes={value!r} must be >= 0")
        return dt.timedelta(minutes=value)


@dataclass
class _Cursor:
    """``requested``: session -> fingerprint it was last requested with; ``pending``: session ->
    a changed fingerprint seen once (waiting to settle)."""

    requested: dict[str, str]
    pending: dict[str, str]

    @classmethod
    def parse(cls, text: str | None) -> _Cursor:
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {}
        return cls(dict(data.get("requested", {})), dict(data.get("pending", {})))

    def dump(self) -> str:
        keep = sorted(self.requested)[-CURSOR_SESSIONS:]
        return json.dumps(
            {
                "requested": {k: self.requested[k] for k in keep},
                "pending": {k: v for k, v in self.pending.items() if k in keep},
            },
            sort_keys=True,
        )


def _tags(prices: SessionPrices, trigger: str) -> dict[str, str]:
    return {
        COMPLETENESS_TAG: f"{prices.completeness:.3f}",
        SYMBOLS_TAG: f"{prices.carried}/{prices.previous_symbols}",
        FINGERPRINT_TAG: prices.fingerprint,
        TRIGGER_TAG: trigger,
    }


def _describe(prices: SessionPrices) -> str:
    if prices.previous is None:
        return f"{prices.symbols} symbols priced on {prices.session} (no earlier trade date)"
    return (
        f"{prices.completeness:.1%} complete: {prices.carried} of the {prices.previous_symbols} "
        f"symbols priced on {prices.previous} have a price on {prices.session} "
        f"({prices.symbols} in all)"
    )


def build_prices_ready_sensor(
    calendar: SessionCalendar | None = None,
    *,
    clock: Callable[[], dt.datetime] | None = None,
    name: str = "prices_ready_sensor",
) -> dg.SensorDefinition:
    """The sensor for ``calendar`` (default the code location's); ``clock`` (default: now, UTC)
    is what tests turn."""
    cal = calendar or snapshot_calendar
    now_fn = clock or (lambda: dt.datetime.now(dt.UTC))

    @dg.sensor(
        name=name,
        job=snapshot_job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Alternative to nightly_snapshot_schedule: requests the latest closed "
        "session's snapshot once its prices look complete (min_share of the previous trade "
        "date's symbols) or the cut-off after the close has passed; re-runs a session whose "
        "prices were corrected.",
    )
    def prices_ready_sensor(
        context: dg.SensorEvaluationContext,
        postgres: PostgresResource,
        price_source: PriceSourceResource,
        prices_sensor_settings: PricesSensorSettings,
    ) -> dg.SensorResult | dg.SkipReason:
        now = now_fn()
        session = cal.last_closed_session(now)
        if session is None or session < settings.partition_start():
            return dg.SkipReason(
                f"no closed {cal.name} session on or after the first partition "
                f"({settings.partition_start()}) yet"
            )
        key = session.strftime(PARTITION_FMT)
        prices = session_prices(postgres.get_engine(), session, price_source.source())
        cursor = _Cursor.parse(context.cursor)
        done = cursor.requested.get(key)

        if done is not None:
            return _requested_before(context, cursor, key, done, prices)
        share = prices_sensor_settings.share()
        cutoff_at = cal.close(session) + prices_sensor_settings.cutoff()
        return _new_session(context, cursor, key, prices, share, cutoff_at, now)

    return prices_ready_sensor


def _request(
    cursor: _Cursor, key: str, prices: SessionPrices, tags: dict[str, str]
) -> dg.SensorResult:
    """Run the session ``key`` for ``prices`` (its run key: the session and the fingerprint)."""
    cursor.requested[key] = prices.fingerprint
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(run_key=f"{key}:{prices.fingerprint}", partition_key=key, tags=tags)
        ],
        cursor=cursor.dump(),
    )


def _requested_before(
    context: dg.SensorEvaluationContext, cursor: _Cursor, key: str, done: str, prices: SessionPrices
) -> dg.SensorResult:
    """A session already requested with the prices fingerprinted ``done``: nothing while they
    are unchanged; once they changed, a re-run when the next evaluation finds them settled."""
    if done == prices.fingerprint:
        cursor.pending.pop(key, None)
        return dg.SensorResult(
            skip_reason=f"session {key} already requested; its prices are unchanged "
            f"({_describe(prices)})",
            cursor=cursor.dump(),
        )
    if cursor.pending.get(key) != prices.fingerprint:
        cursor.pending[key] = prices.fingerprint
        return dg.SensorResult(
            skip_reason=f"the prices of session {key} changed since its run "
            f"({done} -> {prices.fingerprint}); re-running once they settle (the "
            "next evaluation finds them unchanged)",
            cursor=cursor.dump(),
        )
    cursor.pending.pop(key, None)
    context.log.info(
        f"session {key}: prices corrected since its run ({done} -> "
        f"{prices.fingerprint}), {_describe(prices)}: requesting a re-run"
    )
    return _request(cursor, key, prices, {**_tags(prices, "correction"), RERUN_TAG: "correction"})


def _new_session(
    context: dg.SensorEvaluationContext,
    cursor: _Cursor,
    key: str,
    prices: SessionPrices,
    share: float,
    cutoff_at: dt.datetime,
    now: dt.datetime,
) -> dg.SensorResult | dg.SkipReason:
    """A session not requested yet: run it once ``share`` of the symbols are priced, or at the
    cut-off if any is; never without a single price (it would be the previous session's)."""
    if prices.completeness >= share and prices.symbols > 0:
        context.log.info(f"session {key}: {_describe(prices)} >= {share:.0%}: requesting it")
        return _request(cursor, key, prices, _tags(prices, "complete"))
    if now >= cutoff_at and prices.symbols > 0:
        context.log.warning(
            f"session {key}: cut-off {cutoff_at:%Y-%m-%d %H:%M} UTC passed with the prices "
            f"{_describe(prices)} (< {share:.0%}): requesting it anyway"
        )
        return _request(cursor, key, prices, _tags(prices, "cutoff"))
    if now >= cutoff_at:
        return dg.SkipReason(
            f"session {key}: cut-off {cutoff_at:%Y-%m-%d %H:%M} UTC passed but the price "
            "source has no price for it at all: not running (the snapshot would be the "
            "previous session's)"
        )
    return dg.SkipReason(
        f"session {key}: prices {_describe(prices)}, below {share:.0%}; waiting (cut-off "
        f"{cutoff_at:%Y-%m-%d %H:%M} UTC)"
    )


prices_ready_sensor = build_prices_ready_sensor()
