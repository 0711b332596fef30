"""A missed night is visible: the freshness check on ``snapshot_publication``, the sensor that
evaluates it, and the run-failure sensor.

**Freshness.** ``publication_freshness`` (an asset check on ``snapshot_publication``) passes
when the latest session whose deadline has passed is published: it has its row in the
database's ``snapshots`` table (:func:`corr_pipeline.db.published_reads.published_at`). What is
published decides, never Dagster's event log: a materialization of ``snapshot_publication``
can be reported from the UI by anyone (a "runless" event) without anything published; it
makes the sensor evaluate the check again, and the check still fails. A database that cannot
be read fails the check (red), saying why. The deadline of a session is its close +
``$CORR_PIPELINE_SCHEDULE_DELAY_MINUTES`` + ``$CORR_PIPELINE_FRESHNESS_HOURS`` (default 90 min +
6 h: 23:30 New York on a regular XNYS day, 20:30 on a half day). A failure says why: with
severity ERROR (red in the UI) when the session's prices are there and its run is what is
missing; with severity WARN when the price source ends before the session, so that no run
could have published it (a price feed that stopped, or a fresh demo: its synthetic prices end
on a fixed date).

Why not ``dg.build_time_partition_freshness_checks``: it finds the expected partition as "the
last partition window as of the latest tick of ``deadline_cron``". With this project's partitions
(``end_offset=1``, so a session's partition exists from its morning) that is the partition of
the *deadline's* day — the next session whenever the deadline falls after midnight, always
under ``weekdays`` (a weekday "closes" at 24:00 UTC) — and on a holiday the next session's
partition already appears (dagster-io/dagster#33551), so the check would go red on every
holiday; one cron string cannot say "close + delay" when half days close early either. This
check asks the calendar (:meth:`~corr_pipeline.sessions.SessionCalendar.last_closed_session`)
instead, and otherwise follows the same conventions (metadata ``dagster/fresh_until_timestamp``,
``dagster/overdue_deadline_timestamp``, ``dagster/overdue_seconds``). It is not part of
``snapshot_job`` (it is about the latest session, not the run's partition: a backfill of an old
date would show it red). ``publication_freshness_sensor`` (created stopped; start it with the
schedule or the prices sensor; the same rules as Dagster's ``build_sensor_for_freshness_checks``,
which assumes the check runs with the asset) launches a check-only run when the result can have
changed: never evaluated; passed and its ``fresh_until`` time has come; failed and
``snapshot_publication`` was materialized since.

**Failures.** ``snapshot_failure_sensor`` (a ``@dg.run_failure_sensor``, running by default: it
only writes a log line) writes one line per failed run of this code location to the sensor's log
(and the daemon's output)::

    snapshot run 1a2b3c4d failed: partition 2025-06-10, step returns_matrix: PriceSourceError: ...

then calls :func:`notify_run_failure`, the one place to plug e-mail or chat alerts in.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import dagster as dg

from corr_pipeline import settings
from corr_pipeline.db.engine import hide_secrets
from corr_pipeline.db.price_reads import latest_trade_date
from corr_pipeline.db.published_reads import published_at
from corr_pipeline.defs.partitions import PARTITION_FMT, snapshot_calendar
from corr_pipeline.sessions import SessionCalendar
from corr_pipeline.snapshot import display

__all__ = [
    "FRESHNESS_CHECK_NAME",
    "build_publication_freshness_check",
    "evaluate_publication_freshness",
    "failure_line",
    "notify_run_failure",
    "publication_freshness_check",
    "publication_freshness_sensor",
    "snapshot_failure_sensor",
]

FRESHNESS_CHECK_NAME = "publication_freshness"
PUBLICATION = dg.AssetKey("snapshot_publication")


def freshness_lateness() -> dt.timedelta:
    """How long after its close a session must be published: schedule delay + freshness hours."""
    return dt.timedelta(minutes=settings.schedule_delay_minutes()) + dt.timedelta(
        hours=settings.freshness_hours()
    )


def build_publication_freshness_check(
    calendar: SessionCalendar | None = None,
    *,
    clock: Callable[[], dt.datetime] | None = None,
) -> dg.AssetChecksDefinition:
    """``publication_freshness`` for ``calendar`` (default the code location's); ``clock``
    (default: now, UTC) is what tests turn. See the module docstring."""
    cal = calendar or snapshot_calendar
    now_fn = clock or (lambda: dt.datetime.now(dt.UTC))

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                FRESHNESS_CHECK_NAME,
                asset=PUBLICATION,
                description="Red when the latest session has no publication by its close + "
                "CORR_PIPELINE_SCHEDULE_DELAY_MINUTES + CORR_PIPELINE_FRESHNESS_HOURS; a "
                "warning instead when the prices end before that session (no run could have "
                "published it).",
            )
        ],
        can_subset=True,
        name="publication_freshness_check",
        required_resource_keys={"postgres", "price_source"},
    )
    def publication_freshness_check(context):  # AssetCheckExecutionContext
        now = now_fn()
        late = freshness_lateness()
        session = cal.last_closed_session(now, late)
        following = cal.sessions((session or now.date()) + dt.timedelta(days=1), cal.horizon)
        fresh_until = cal.close(following[0]) + late if following else None
        meta: dict[str, dg.MetadataValue] = {}
        if fresh_until is not None:
            meta["dagster/fresh_until_timestamp"] = dg.MetadataValue.timestamp(fresh_until)
        if session is None or session < settings.partition_start():
            yield dg.AssetCheckResult(
                passed=True,
                severity=dg.AssetCheckSeverity.ERROR,
                description="no session of the partitions has reached its deadline yet",
                metadata=meta,
            )
            return
        yield _freshness(context, session, cal.close(session) + late, late, now, meta)

    return publication_freshness_check


def _freshness(
    context: dg.AssetCheckExecutionContext,
    session: dt.date,
    deadline: dt.datetime,
    late: dt.timedelta,
    now: dt.datetime,
    meta: dict[str, dg.MetadataValue],
) -> dg.AssetCheckResult:
    """The check's result for ``session`` due by ``deadline``: passed when it has its row in
    the ``snapshots`` table, else failed (a warning when the prices end before the session: no
    run could publish it); failed when the database cannot be read."""
    key = session.strftime(PARTITION_FMT)
    meta["expected_partition"] = dg.MetadataValue.text(key)
    meta["dagster/overdue_deadline_timestamp"] = dg.MetadataValue.timestamp(deadline)
    try:
        published = published_at(context.resources.postgres.get_engine(), session)
    except Exception as exc:  # no verdict without the database: red, saying why
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"cannot tell whether session {key} is published: the database "
            f"cannot be read ({type(exc).__name__}: {hide_secrets(' '.join(str(exc).split()))})",
            metadata=meta,
        )
    if published is not None:
        published = published.astimezone(dt.UTC)
        meta["published_at"] = dg.MetadataValue.timestamp(published)
        return dg.AssetCheckResult(
            passed=True,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"session {key} published ({published:%Y-%m-%d %H:%M} UTC)",
            metadata=meta,
        )
    overdue = (now - deadline).total_seconds()
    meta["dagster/overdue_seconds"] = dg.MetadataValue.float(display.seconds(overdue))
    last_prices = _last_trade_date(context)
    if last_prices is not None:
        meta["last_trade_date"] = dg.MetadataValue.text(last_prices.isoformat())
    no_prices = last_prices is not None and last_prices < session
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.WARN if no_prices else dg.AssetCheckSeverity.ERROR,
        description=f"session {key} has no publication {overdue / 3600:.1f} h after its "
        f"deadline ({deadline:%Y-%m-%d %H:%M} UTC = close + {late}): "
        + _why_unpublished(session, last_prices),
        metadata=meta,
    )


publication_freshness_check = build_publication_freshness_check()


def evaluate_publication_freshness(
    instance: dg.DagsterInstance, resources: dict[str, object]
) -> dg.AssetCheckEvaluation:
    """Evaluate ``publication_freshness`` now, in this process, and record its result in
    ``instance`` (what the sensor's check-only run does; the UI then shows a verdict instead of
    "not evaluated"). ``resources``: the code location's ``postgres`` and ``price_source``.
    Logs at INFO (no DEBUG lines on the console)."""
    from corr_pipeline.defs.partitions import snapshot_partitions

    result = dg.materialize(
        [
            dg.AssetSpec(PUBLICATION, partitions_def=snapshot_partitions),
            publication_freshness_check,
        ],
        instance=instance,
        selection=dg.AssetSelection.checks(publication_freshness_check),
        resources={key: resources[key] for key in ("postgres", "price_source")},
        run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def _last_trade_date(context: dg.AssetCheckExecutionContext) -> dt.date | None:
    """The price source's last trade date, or None when the database cannot tell (the
    verdict, read from the ``snapshots`` table, stands; only its reason is missing)."""
    try:
        engine = context.resources.postgres.get_engine()
        return latest_trade_date(engine, context.resources.price_source.source())
    except Exception as exc:  # the verdict stands; only its reason is missing
        context.log.warning(f"publication_freshness: the prices' last date is unknown: {exc}")
        return None


def _why_unpublished(session: dt.date, last_prices: dt.date | None) -> str:
    """Why ``session`` may have no publication: its prices are not loaded (the price source
    ends before it, as a fresh demo's synthetic prices do), or the night's run did not run."""
    if last_prices is not None and last_prices < session:
        return (
            f"the prices end on {last_prices}: no snapshot of {session} can be built before "
            "its prices are loaded (a fresh demo's synthetic prices end on their last weekday)"
        )
    return (
        "did the night's run start? (schedule or sensor on, the daemon running, the run not failed)"
    )


@dg.sensor(
    name="publication_freshness_sensor",
    asset_selection=dg.AssetSelection.checks(publication_freshness_check),
    minimum_interval_seconds=600,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Evaluates publication_freshness when it can have changed: never evaluated, "
    "passed but its fresh-until time has come, or failed and snapshot_publication has been "
    "materialized since.",
)
def publication_freshness_sensor(
    context: dg.SensorEvaluationContext,
) -> dg.RunRequest | dg.SkipReason:
    key = dg.AssetCheckKey(PUBLICATION, FRESHNESS_CHECK_NAME)
    summary = context.instance.event_log_storage.get_asset_check_summary_records([key])[key]
    latest, done = (
        summary.last_check_execution_record,
        summary.last_completed_check_execution_record,
    )
    if latest is not None and latest is not done and latest.status.value == "PLANNED":
        return dg.SkipReason("publication_freshness is being evaluated")
    event = done.event if done is not None else None
    evaluation = event.asset_check_evaluation if event is not None else None
    if event is None or evaluation is None:
        return dg.RunRequest(asset_check_keys=[key])
    if evaluation.passed:
        until = evaluation.metadata.get("dagster/fresh_until_timestamp")
        if until is not None and time.time() < float(until.value):  # type: ignore[arg-type]
            return dg.SkipReason("publication_freshness passed and cannot be stale yet")
        return dg.RunRequest(asset_check_keys=[key])
    records = context.instance.fetch_materializations(PUBLICATION, limit=1).records
    if records and records[0].timestamp > event.timestamp:
        return dg.RunRequest(asset_check_keys=[key])
    return dg.SkipReason("publication_freshness failed; waiting for a publication")


def notify_run_failure(line: str, run: dg.DagsterRun) -> None:
    """Called once per failed run with its :func:`failure_line`. Does nothing by default: the
    place to send an e-mail or a chat message, e.g.::

        import smtplib, email.message
        msg = email.message.EmailMessage()
        msg["Subject"], msg["From"], msg["To"] = line[:120], "dagster@desk", "quants@desk"
        msg.set_content(line)
        with smtplib.SMTP("mail.desk") as smtp:
            smtp.send_message(msg)

    (or ``requests.post(os.environ["SLACK_WEBHOOK_URL"], json={"text": line})``; read the
    address through :mod:`corr_pipeline.settings`). An exception here is logged by the sensor
    and does not stop it."""


def _first_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def failure_line(context: dg.RunFailureSensorContext) -> str:
    """``snapshot run <id> failed: partition <key>, step <step>: <the error's first line>``
    (every failed step, ``; ``-separated; the run's failure message when no step failed, e.g.
    a run terminated for exceeding its max runtime)."""
    run = context.dagster_run
    partition = run.tags.get("dagster/partition", "(none)")
    steps = []
    for event in context.get_step_failure_events():
        data = event.step_failure_data
        error = data.error if data is not None else None
        message = _first_line(error.message if error is not None else event.message)
        if message.startswith("dagster.") and ": " in message:  # dg.Failure's class path
            message = message.split(": ", 1)[1]
        steps.append(f"step {event.step_key}: {message}")
    what = "; ".join(steps) or _first_line(context.failure_event.message)
    return f"snapshot run {run.run_id[:8]} failed: partition {partition}, {what}"


@dg.run_failure_sensor(
    name="snapshot_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Writes one line per failed run (step, partition, the error's first line) to "
    "the log, then calls corr_pipeline.defs.monitoring.notify_run_failure (e-mail/chat hook).",
)
def snapshot_failure_sensor(context: dg.RunFailureSensorContext) -> None:
    line = failure_line(context)
    context.log.error(line)
    try:
        notify_run_failure(line, context.dagster_run)
    except Exception as exc:  # an alert channel down must not stop the sensor
        context.log.warning(f"notify_run_failure failed: {type(exc).__name__}: {exc}")
