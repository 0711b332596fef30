"""Run config holds values only, and a run's events never hold the database password.

The launchpad is open to anyone who can open the UI, the run worker's environment holds
``$CORR_PIPELINE_DATABASE_URL`` with its password, and a run's event log is readable by anyone
who opens the UI. So:

- every field of the run config takes literals only: ``{env: VAR}`` is refused by Dagster's
  config check and no run is created (:mod:`corr_pipeline.defs.literal_config`);
- a refused text value is never repeated in the error a run records;
- the project's instance stores every event with the database password hidden
  (:mod:`corr_pipeline.defs.event_secrets`).

Each test runs the code location's ``snapshot_job`` (or a one-asset job) on a real instance
configured like the project's (``open_instance``: the repository's ``dagster.yaml``) and reads
every stored event of every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from corr_pipeline import settings
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.defs.run import open_instance, snapshot_job_def
from corr_pipeline_tests.fixtures.project_copy import project_copy

PASSWORD = "Pw-9f3k2x-SECRET"
SECRET_URL = f"postgresql://pipeline:{PASSWORD}@db.internal:5432/corr"

#: (where in the run config, the field, what the variable holds): a text field reading the
#: database URL, number fields of three resources and of the snapshot op's own config reading
#: a number (which a number field would take as it is), and the default IO manager's directory.
ENV_FIELDS = [
    (("resources", "snapshot_params"), "linkage_method", SECRET_URL),
    (("resources", "snapshot_params"), "lookback_days", "7"),
    (("resources", "snapshot_params"), "n_clusters", "7"),
    (("resources", "matrix_store"), "keep_matrices", "7"),
    (("resources", "prices_sensor_settings"), "cutoff_minutes", "7"),
    (("ops", "snapshot"), "top_m", "7"),
    (("resources", "io_manager"), "base_dir", "/tmp/elsewhere"),
]


def _run_config(where: tuple[str, str], field: str, value: object) -> dict:
    return {where[0]: {where[1]: {"config": {field: value}}}}


def _stored_events(instance: dg.DagsterInstance) -> list[str]:
    """Every stored event of every run of ``instance``, serialized."""
    return [
        dg.serialize_value(entry)
        for run in instance.get_runs()
        for entry in instance.all_logs(run.run_id)
    ]


@pytest.fixture
def instance(tmp_path: Path):
    instance = open_instance(tmp_path / "dagster_home")
    try:
        yield instance
    finally:
        instance.dispose()


@pytest.mark.parametrize(("where", "field", "held"), ENV_FIELDS)
def test_env_in_run_config_is_refused_before_a_run_exists(
    where, field, held, instance, monkeypatch
):
    monkeypatch.setenv("SOME_VAR", held)
    run_config = _run_config(where, field, {"env": "SOME_VAR"})
    with pytest.raises(dg.DagsterInvalidConfigError) as refused:
        dg.execute_job(
            dg.reconstructable(snapshot_job_def),
            instance=instance,
            run_config=run_config,
            tags={"dagster/partition": "2025-06-10"},
        )
    assert field in str(refused.value) and held not in str(refused.value)
    assert instance.get_runs() == []  # refused before a run exists: no event at all
    assert not [text for text in _stored_events(instance) if PASSWORD in text]


def test_a_refused_text_value_is_not_repeated(instance):
    """A literal text the snapshot parameters refuse fails the run at its start, naming the
    field and what it allows; the value itself is in no stored event."""
    given = f"average-{PASSWORD}"
    result = dg.execute_job(
        dg.reconstructable(snapshot_job_def),
        instance=instance,
        run_config=_run_config(("resources", "snapshot_params"), "linkage_method", given),
        tags={"dagster/partition": "2025-06-10"},
        raise_on_error=False,
    )
    assert not result.success
    (run,) = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.FAILURE
    events = _stored_events(instance)
    assert any("linkage_method must be one of average" in text for text in events)
    assert not [text for text in events if PASSWORD in text]


def test_a_refused_parameter_is_not_repeated_in_python():
    with pytest.raises(ValidationError) as refused:
        SnapshotParams(linkage_method=SECRET_URL)
    assert "linkage_method must be one of" in str(refused.value)
    assert PASSWORD not in str(refused.value) and "input_value" not in str(refused.value)


@dg.asset
def quotes_the_database_url() -> None:
    """Fails as a library might: its error quoting the URL it was given and the password it
    read from it (decoded)."""
    url = settings.database_url_from_env()
    raise RuntimeError(f"could not connect with {url}: password {make_url(url).password} refused")


def quoting_job() -> dg.JobDefinition:
    return dg.Definitions(
        assets=[quotes_the_database_url],
        jobs=[dg.define_asset_job("quoting_job")],
    ).resolve_job_def("quoting_job")


@pytest.mark.parametrize(
    ("url", "password"),
    [(SECRET_URL, PASSWORD), ("postgresql://pipeline:%C3%A9%22q%40@db.internal/corr", 'é"q@')],
)
def test_the_instance_stores_no_database_password(url, password, instance, monkeypatch):
    """A step whose error holds the database password (percent-encoded in the URL, decoded
    after it): the run's stored events (the step's failure, its error and the run's failure)
    say ``***`` in its place, in whichever form it appeared."""
    monkeypatch.setenv(settings.ENV_DATABASE_URL, url)
    result = dg.execute_job(
        dg.reconstructable(quoting_job), instance=instance, raise_on_error=False
    )
    assert not result.success
    events = _stored_events(instance)
    failures = [dg.deserialize_value(text) for text in events if "could not connect with" in text]
    assert failures
    for entry in failures:  # decoded from JSON: the texts as the UI shows them
        shown = repr(entry)
        assert "pipeline:***@db.internal" in shown and "password *** refused" in shown
        assert password not in shown and url not in shown


def test_dg_launch_refuses_env_in_run_config(tmp_path, monkeypatch):
    """The launchpad's route: a run config validated against the code location's job schema
    (here ``dg launch --config-json``, validated as the launchpad does) with a field reading the
    database URL from the environment: refused, no run, the password nowhere in the output."""
    root = project_copy(tmp_path)  # the repository's project, without its .env
    home = tmp_path / "dagster_home"
    instance = open_instance(home)  # the repository's dagster.yaml
    instance.dispose()
    config = (
        '{"resources": {"snapshot_params": {"config": {"linkage_method": {"env": "SOME_VAR"}}}}}'
    )
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "launch", "--job", "snapshot_job",
         "--partition", "2025-06-10", "--config-json", config],
        cwd=root, env={**os.environ, "DAGSTER_HOME": str(home), "SOME_VAR": SECRET_URL},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "linkage_method" in result.stdout + result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    instance = open_instance(home)
    try:
        assert instance.get_runs() == []
        assert not [text for text in _stored_events(instance) if PASSWORD in text]
    finally:
        instance.dispose()
