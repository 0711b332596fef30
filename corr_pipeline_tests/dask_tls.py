"""Dask clusters over TLS for tests, with certificates made as ``corr-pipeline dask certs`` makes
them (:mod:`corr_pipeline.snapshot.scheduler_certs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corr_pipeline.snapshot.scheduler_certs import ClusterCertificates, cluster_security
from corr_pipeline.snapshot.scheduler_certs import make_certificates as make_cluster_certificates


def make_certificates(directory: Path) -> dict[str, Path]:
    """A new authority's files in ``directory``: ``ca`` and ``<role>_cert`` / ``<role>_key`` for
    the roles scheduler and worker (the cluster's certificate) and client."""
    certs = make_cluster_certificates(directory)
    return {
        "ca": certs.ca,
        "scheduler_cert": certs.cluster_cert,
        "scheduler_key": certs.cluster_key,
        "worker_cert": certs.cluster_cert,
        "worker_key": certs.cluster_key,
        "client_cert": certs.client_cert,
        "client_key": certs.client_key,
    }


def tls_local_cluster(certs: ClusterCertificates, n_workers: int, **kwargs: Any) -> Any:
    """A ``distributed.LocalCluster`` of ``n_workers`` processes x 1 thread on
    ``tls://127.0.0.1``, its workers' files in ``certs.worker_space``, the dashboard on a free
    port of 127.0.0.1 (use it as a context manager)."""
    import distributed

    return distributed.LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        protocol="tls://",
        host="127.0.0.1",
        security=cluster_security(certs),
        local_directory=str(certs.worker_space),
        dashboard_address="127.0.0.1:0",  # any free port: never another cluster's 8787
        **kwargs,
    )
