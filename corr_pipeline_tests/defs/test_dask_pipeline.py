"""The snapshot graph with its stripes on a Dask LocalCluster (2 worker processes) reached over
``tls://`` with certificates made by ``corr-pipeline dask certs``: the same published rows as on
threads, and the link to the cluster's dashboard in the run's metadata, which serves it (bokeh,
in the dask extra)."""

from __future__ import annotations

import urllib.request

import pytest
import sqlalchemy as sa

distributed = pytest.importorskip("distributed")

from corr_pipeline import settings  # noqa: E402
from corr_pipeline.db.schema import SNAPSHOT_CHILD_TABLES  # noqa: E402
from corr_pipeline.defs.resources import SnapshotParams  # noqa: E402
from corr_pipeline.snapshot.scheduler_certs import (  # noqa: E402
    ClusterCertificates,
    client_environment,
)
from corr_pipeline_tests.fixtures.commands import run_cli  # noqa: E402
from corr_pipeline_tests.fixtures.dask_tls import tls_local_cluster  # noqa: E402
from corr_pipeline_tests.fixtures.pipeline import LAST, SIXTY_DAYS, materialize, table_rows  # noqa: E402


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> ClusterCertificates:
    """The files ``corr-pipeline dask certs DIR`` makes."""
    directory = tmp_path_factory.mktemp("dask") / "tls"
    made = run_cli("dask", "certs", str(directory))
    assert made.returncode == 0, made.stderr
    return ClusterCertificates(directory)


@pytest.fixture(scope="module")
def scheduler(certificates):
    with tls_local_cluster(certificates, 2) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        yield cluster.scheduler_address


def _published(engine: sa.Engine) -> dict[str, list[tuple]]:
    rows = {t: table_rows(engine, t, LAST, "2, 3") for t in SNAPSHOT_CHILD_TABLES}
    with engine.connect() as conn:
        params = conn.execute(
            sa.text("SELECT params FROM snapshots WHERE snapshot_date = :d"), {"d": LAST}
        ).scalar_one()
    params.pop("dagster_run_id", None)
    rows["params"] = [(params,)]
    return rows


@pytest.mark.usefixtures("universe")
def test_stripes_on_a_tls_cluster_publish_what_threads_publish(
    engine, tmp_path, scheduler, certificates, monkeypatch
):
    monkeypatch.delenv(settings.ENV_DASK_SCHEDULER, raising=False)
    threads = materialize(tmp_path / "threads", LAST)
    assert threads.success
    on_threads = _published(engine)
    assert all(on_threads[t] for t in SNAPSHOT_CHILD_TABLES)
    assert not any(
        "dask_dashboard" in event.materialization.metadata
        for event in threads.get_asset_materialization_events()
    )

    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, scheduler)
    for name, value in client_environment(certificates).items():  # as the command prints
        monkeypatch.setenv(name, value)
    on_dask = materialize(tmp_path / "dask", LAST)
    assert on_dask.success
    assert _published(engine) == on_threads
    workers = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata.get("dask_workers")
        for e in on_dask.get_asset_materialization_events()
    }
    assert workers["correlation_matrix"] is not None
    assert workers["correlation_matrix"].value == 2
    links = {
        event.materialization.asset_key.to_user_string(): event.materialization.metadata.get(
            "dask_dashboard"
        )
        for event in on_dask.get_asset_materialization_events()
    }
    for asset in ("correlation_matrix", "top_k_neighbors", "lead_lag_pairs"):
        assert links[asset] is not None and links[asset].value.startswith("http"), asset
    with urllib.request.urlopen(links["correlation_matrix"].value, timeout=30) as page:
        served = page.read()
    # without bokeh, distributed answers the link with "Dask needs bokeh... for the dashboard"
    assert page.status == 200 and b"Dask needs" not in served and b"bokeh" in served.lower()


def test_the_scheduler_is_the_environments_never_a_resource_field(certificates, monkeypatch):
    for name, value in client_environment(certificates).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, "tls://127.0.0.1:8786")
    params = SnapshotParams(**SIXTY_DAYS).to_parameters()
    assert params.dask_scheduler == "tls://127.0.0.1:8786"
    assert "dask_scheduler" not in params.as_dict()  # where it ran is not a result parameter
    assert "dask_scheduler" not in SnapshotParams.model_fields
    monkeypatch.delenv(settings.ENV_DASK_SCHEDULER)
    assert SnapshotParams(**SIXTY_DAYS).to_parameters().dask_scheduler is None
    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, "tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="plain tcp:// lets whoever reaches the port"):
        SnapshotParams(**SIXTY_DAYS).to_parameters()
