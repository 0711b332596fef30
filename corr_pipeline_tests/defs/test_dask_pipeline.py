"""The snapshot graph with its stripes on a Dask LocalCluster (2 worker processes): the same
published rows as on threads, and the link to the cluster's dashboard in the run's metadata,
which serves it (bokeh, in the dask extra)."""

from __future__ import annotations

import urllib.request

import pytest
import sqlalchemy as sa

distributed = pytest.importorskip("distributed")

from corr_pipeline import settings  # noqa: E402
from corr_pipeline.db.schema import SNAPSHOT_CHILD_TABLES  # noqa: E402
from corr_pipeline.defs.resources import SnapshotParams  # noqa: E402
from corr_pipeline_tests.dask_tls import make_certificates  # noqa: E402
from corr_pipeline_tests.defs.test_pipeline import (  # noqa: E402, F401  (universe: a fixture)
    LAST,
    PARAMS,
    _materialize,
    _rows,
    universe,
)


@pytest.fixture(scope="module")
def scheduler():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address


def _published(engine: sa.Engine) -> dict[str, list[tuple]]:
    rows = {t: _rows(engine, t, LAST, "2, 3") for t in SNAPSHOT_CHILD_TABLES}
    with engine.connect() as conn:
        params = conn.execute(
            sa.text("SELECT params FROM snapshots WHERE snapshot_date = :d"), {"d": LAST}
        ).scalar_one()
    params.pop("dagster_run_id", None)
    rows["params"] = [(params,)]
    return rows


@pytest.mark.usefixtures("universe")
def test_stripes_on_a_cluster_publish_what_threads_publish(
    engine, tmp_path, scheduler, monkeypatch
):
    monkeypatch.delenv(settings.ENV_DASK_SCHEDULER, raising=False)
    threads = _materialize(tmp_path / "threads", LAST)
    assert threads.success
    on_threads = _published(engine)
    assert all(on_threads[t] for t in SNAPSHOT_CHILD_TABLES)
    assert not any(
        "dask_dashboard" in event.materialization.metadata
        for event in threads.get_asset_materialization_events()
    )

    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, scheduler)
    on_dask = _materialize(tmp_path / "dask", LAST)
    assert on_dask.success
    assert _published(engine) == on_threads
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


def test_the_scheduler_is_the_environments_never_a_resource_field(monkeypatch):
    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, "tcp://127.0.0.1:8786")
    params = SnapshotParams(**PARAMS).to_parameters()
    assert params.dask_scheduler == "tcp://127.0.0.1:8786"
    assert "dask_scheduler" not in params.as_dict()  # where it ran is not a result parameter
    assert "dask_scheduler" not in SnapshotParams.model_fields
    monkeypatch.delenv(settings.ENV_DASK_SCHEDULER)
    assert SnapshotParams(**PARAMS).to_parameters().dask_scheduler is None
    monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, "tcp://10.1.2.3:8786")
    with pytest.raises(ValueError, match="loopback interface only"):
        SnapshotParams(**PARAMS).to_parameters()


@pytest.mark.usefixtures("universe")
def test_stripes_on_a_tls_cluster_publish_what_threads_publish(engine, tmp_path, monkeypatch):
    """A cluster whose scheduler, workers and client hold certificates of one authority,
    encryption required: reached over tls:// with the settings' files, the snapshot is the
    same as on threads."""
    from distributed.security import Security

    monkeypatch.delenv(settings.ENV_DASK_SCHEDULER, raising=False)
    assert _materialize(tmp_path / "threads", LAST).success
    on_threads = _published(engine)
    files = make_certificates(tmp_path / "tls")
    cluster_security = Security(
        tls_ca_file=str(files["ca"]),
        tls_scheduler_cert=str(files["scheduler_cert"]),
        tls_scheduler_key=str(files["scheduler_key"]),
        tls_worker_cert=str(files["worker_cert"]),
        tls_worker_key=str(files["worker_key"]),
        tls_client_cert=str(files["client_cert"]),
        tls_client_key=str(files["client_key"]),
        require_encryption=True,
    )
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        protocol="tls://",
        host="127.0.0.1",
        security=cluster_security,
        dashboard_address=":0",
    ) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        monkeypatch.setenv(settings.ENV_DASK_SCHEDULER, cluster.scheduler_address)
        monkeypatch.setenv(settings.ENV_DASK_TLS_CA_FILE, str(files["ca"]))
        monkeypatch.setenv(settings.ENV_DASK_TLS_CERT, str(files["client_cert"]))
        monkeypatch.setenv(settings.ENV_DASK_TLS_KEY, str(files["client_key"]))
        on_tls = _materialize(tmp_path / "tls_store", LAST)
        assert on_tls.success
        assert _published(engine) == on_threads
        workers = [
            e.materialization.metadata.get("dask_workers")
            for e in on_tls.get_asset_materialization_events()
            if e.materialization.asset_key.to_user_string() == "correlation_matrix"
        ]
        assert workers and workers[0].value == 2
