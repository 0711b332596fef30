"""Nothing a launchpad or a run config says chooses where a run connects, reads or writes.

The database, the matrix store's directory, the price source relation and the Dask scheduler
are deployment configuration (the code location's environment): no resource has a config
field for them, so Dagster refuses a run config naming one before a run exists (the launchpad
and GraphQL's ``launchRun`` validate against the same schema), and the project's own entry
points refuse run parameters naming one in one line. A Dask scheduler, on the loopback
interface too, is reached only over ``tls://`` with certificates from the settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from corr_pipeline import settings
from corr_pipeline.definitions import defs
from corr_pipeline.defs.run import open_instance, snapshot_run_config
from corr_pipeline.snapshot.scheduler import SchedulerError, scheduler_security
from corr_pipeline_tests.fixtures.commands import run_cli
from corr_pipeline_tests.fixtures.dask_tls import make_certificates
from corr_pipeline_tests.fixtures.project_copy import project_copy

#: (resource, config field, value): every way the run config of the reproduction (and its
#: siblings) tried to choose where a run goes.
LOCATIONS = [
    ("snapshot_params", "dask_scheduler", "tls://127.0.0.1:8786"),
    ("postgres", "database_url", "postgresql://someone@127.0.0.1:5432/theirs"),
    ("price_source", "table", "pg_catalog.pg_authid"),
    ("price_source", "columns", "rolname,rolvaliduntil,oid"),
    ("price_source", "timezone", "UTC"),
    ("matrix_io_manager", "base_dir", "/tmp/someone-else"),
    ("matrix_store", "base_dir", "/tmp/someone-else"),
]


@pytest.mark.parametrize(("resource", "field", "value"), LOCATIONS)
def test_a_run_config_naming_a_location_is_refused_by_the_job_schema(resource, field, value):
    job = defs.resolve_job_def("snapshot_job")
    run_config = {"resources": {resource: {"config": {field: value}}}}
    with pytest.raises(dg.DagsterInvalidConfigError) as refused:
        dg.validate_run_config(job, run_config)
    assert field in str(refused.value)
    # the numerical parameters stay the launchpad's
    dg.validate_run_config(
        job, {"resources": {"snapshot_params": {"config": {"lookback_days": 126}}}}
    )


def test_run_parameters_naming_a_location_are_refused_in_one_line():
    for name in ("dask_scheduler", "database_url", "store_dir", "table"):
        with pytest.raises(ValueError) as refused:
            snapshot_run_config(params={name: "x"})
        message = str(refused.value)
        assert "\n" not in message and name in message and "deployment configuration" in message


def test_the_cli_refuses_a_scheduler_given_as_a_parameter():
    result = run_cli(
        "backfill",
        "--from",
        "2026-11-24",
        "--to",
        "2026-11-25",
        "--param",
        "dask_scheduler=tcp://127.0.0.1:8786",
    )
    assert result.returncode != 0
    assert "dask_scheduler chooses where a run connects" in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_dg_launch_refuses_a_run_config_with_a_scheduler(tmp_path):
    """The reproduction's route: a run config handed to the instance with a scheduler address
    (here through ``dg launch --config-json``, which validates as the launchpad does): refused,
    and no run is created."""
    root = project_copy(tmp_path)  # the repository's project, without its .env
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes((root / "dagster.yaml").read_bytes())
    config = (
        '{"resources": {"snapshot_params": {"config": {"dask_scheduler": "tcp://127.0.0.1:1"}}}}'
    )
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "launch", "--job", "snapshot_job",
         "--partition", "2026-11-24", "--config-json", config],
        cwd=root, env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "dask_scheduler" in result.stdout + result.stderr
    instance = open_instance(home)
    try:
        assert instance.get_runs() == []
    finally:
        instance.dispose()


#: How the pipeline was told to use a scheduler on this machine before: plain text, whoever
#: reaches the port (every local user) runs code on its workers and in the run's process.
LOOPBACK_TCP = [
    "tcp://127.0.0.1:8786",
    "tcp://localhost:8786",
    "tcp://[::1]:8786",
    "tcp://127.3.4.5:1",
]


def _without_tls_files(monkeypatch) -> None:
    for name in (
        settings.ENV_DASK_TLS_CA_FILE,
        settings.ENV_DASK_TLS_CERT,
        settings.ENV_DASK_TLS_KEY,
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("address", LOOPBACK_TCP)
def test_plain_tcp_on_the_loopback_interface_is_refused_in_one_line(address, tmp_path, monkeypatch):
    """Even with a client certificate at hand: refused, saying to use tls:// and where the
    files come from."""
    files = make_certificates(tmp_path / "tls")
    monkeypatch.setenv(settings.ENV_DASK_TLS_CA_FILE, str(files["ca"]))
    monkeypatch.setenv(settings.ENV_DASK_TLS_CERT, str(files["client_cert"]))
    monkeypatch.setenv(settings.ENV_DASK_TLS_KEY, str(files["client_key"]))
    with pytest.raises(SchedulerError) as refused:
        scheduler_security(address)
    message = str(refused.value)
    assert "\n" not in message
    assert "plain tcp:// lets whoever reaches the port (on loopback: every user" in message
    assert (
        f"use {address.replace('tcp://', 'tls://')} with {settings.ENV_DASK_TLS_CA_FILE}" in message
    )
    assert "corr-pipeline dask certs makes them" in message


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("tcp://10.1.2.3:8786", "plain tcp:// lets whoever reaches the port"),
        ("tcp://scheduler.example:8786", "plain tcp:// lets whoever reaches the port"),
        ("ws://127.0.0.1:8786", "the scheme must be tls://; use tls://127.0.0.1:8786 with"),
        ("inproc://127.0.0.1/1/2", "the scheme must be tls://"),
        ("127.0.0.1:8786", "the scheme must be tls://; use tls://HOST:PORT with"),
        ("tls://10.1.2.3:8786", "tls:// needs CORR_PIPELINE_DASK_TLS_CA_FILE"),
        ("tls://127.0.0.1:8786", "tls:// needs CORR_PIPELINE_DASK_TLS_CA_FILE"),
    ],
)
def test_other_addresses_are_refused_in_one_line_before_connecting(address, says, monkeypatch):
    _without_tls_files(monkeypatch)
    with pytest.raises(SchedulerError) as refused:
        scheduler_security(address)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_tls_needs_a_private_client_key(tmp_path, monkeypatch):
    files = make_certificates(tmp_path / "tls")
    monkeypatch.setenv(settings.ENV_DASK_TLS_CA_FILE, str(files["ca"]))
    monkeypatch.setenv(settings.ENV_DASK_TLS_CERT, str(files["client_cert"]))
    monkeypatch.setenv(settings.ENV_DASK_TLS_KEY, str(files["client_key"]))
    pytest.importorskip("distributed")
    for address in ("tls://10.1.2.3:8786", "tls://127.0.0.1:8786"):
        security = scheduler_security(address)
        assert security.require_encryption
        assert security.tls_client_cert == str(files["client_cert"])
        assert security.tls_ca_file == str(files["ca"])
    files["client_key"].chmod(0o644)
    with pytest.raises(SchedulerError, match="readable by its owner alone"):
        scheduler_security("tls://10.1.2.3:8786")
