"""``deploy/``, checked as far as a machine without a cluster allows.

- ``deploy/dagster.yaml`` is loaded by Dagster: every field validated by the config schemas of
  Dagster, dagster-postgres and dagster-k8s; its PostgreSQL storage created on a real server (the
  test server, reached over TCP); its K8s run launcher built with its in-cluster configuration,
  which reaches a stand-in API server over HTTPS (``k8s_api.py``); and the Kubernetes Job it
  submits for a ``snapshot_job`` run captured there and validated against the Kubernetes 1.37
  schema (strict: no unknown field).
- Every manifest of ``deploy/k8s/`` validates strictly against the same schema, and every name
  the instance and the Helm values refer to (ConfigMap, Secret, volume claim) is defined there.
- ``deploy/helm/dagster-values.yaml`` says what ``deploy/dagster.yaml`` says (limits, the whole
  launcher but the chart's own names, volumes, resources), and its Kubernetes objects validate
  inside a Pod.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import dagster as dg
import kubernetes_validate
import pytest
import yaml
from sqlalchemy.engine import make_url

from corr_pipeline.defs.concurrency import instance_limits
from corr_pipeline.defs.run import snapshot_job_def
from corr_pipeline.snapshot.sizing import run_memory
from corr_pipeline_tests.deploy.k8s_api import JobRecorder
from corr_pipeline_tests.deploy.k8s_rules import Pod, allowed, restricted_problems
from corr_pipeline_tests.reliability import helpers as h

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.37.0"
IMAGE = "registry.example.com/corr-pipeline:TAG"
#: the release name of the install command (deploy/helm/dagster-values.yaml): the chart names its
#: instance ConfigMap after it
RELEASE = "dagster"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in _docs(path):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


# ------------------------------------------------------------------------------------------------
# Manifests
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(_manifests()), ids=lambda k: f"{k[0]}/{k[1]}")
def test_manifest_validates_against_the_kubernetes_schema(key):
    _validate(_manifests()[key])


def test_the_validator_rejects_a_misspelled_field():
    """The check above can fail: strict validation refuses an unknown field, and a wrong type."""
    job = copy.deepcopy(_manifests()[("Job", "corr-pipeline-db-upgrade")])
    job["spec"]["template"]["spec"]["containers"][0]["envFromm"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(job)
    pvc = copy.deepcopy(_manifests()[("PersistentVolumeClaim", "corr-pipeline-store")])
    pvc["spec"]["accessModes"] = "ReadWriteMany"  # a string, not a list
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(pvc)


def test_the_store_is_shared_and_every_reference_is_defined():
    manifests = _manifests()
    pvc = manifests[("PersistentVolumeClaim", "corr-pipeline-store")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    config = manifests[("ConfigMap", "corr-pipeline-config")]["data"]
    assert config["CORR_PIPELINE_STORE_DIR"] == "/data/store/matrices"
    scheduler = manifests[("Service", "corr-pipeline-dask-scheduler")]
    port = scheduler["spec"]["ports"][0]["port"]
    assert config["CORR_PIPELINE_DASK_SCHEDULER"].endswith(
        f"corr-pipeline-dask-scheduler.corr-pipeline.svc:{port}"
    )
    assert (
        "CORR_PIPELINE_DATABASE_URL" in manifests[("Secret", "corr-pipeline-secrets")]["stringData"]
    )
    namespaces = {name for kind, name in manifests if kind == "Namespace"}
    assert {
        d["metadata"].get("namespace") for d in manifests.values() if d["kind"] != "Namespace"
    } == namespaces
    for doc in manifests.values():  # every pod mounting the store mounts it where the config says
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if not spec:
            continue
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in spec.get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        assert set(claims.values()) <= {"corr-pipeline-store"}
        for container in spec["containers"]:
            assert container["image"] == IMAGE
            for mount in container.get("volumeMounts", []):
                if mount["name"] in claims:
                    store = config["CORR_PIPELINE_STORE_DIR"]
                    assert store.startswith(mount["mountPath"] + "/"), doc["metadata"]
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                assert (kind, ref["name"]) in manifests


# ------------------------------------------------------------------------------------------------
# The Helm values say what the instance file says
# ------------------------------------------------------------------------------------------------


def _instance_yaml() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


def _helm() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())


def test_helm_values_agree_with_the_instance_file():
    instance, values = _instance_yaml(), _helm()
    concurrency = values["concurrency"]
    assert instance["concurrency"] == {
        "runs": {
            "max_concurrent_runs": concurrency["runs"]["maxConcurrentRuns"],
            "tag_concurrency_limits": concurrency["runs"]["tagConcurrencyLimits"],
        },
        "pools": {
            "granularity": concurrency["pools"]["granularity"],
            "default_limit": concurrency["pools"]["defaultLimit"],
        },
    }
    # the launcher: the same class and config, but for the names the chart gives its instance
    # ConfigMap, its storage secret and DAGSTER_HOME, where the instance file reads variables
    assert values["runLauncher"]["type"] == "CustomRunLauncher"
    custom = values["runLauncher"]["config"]["customRunLauncher"]
    assert (custom["module"], custom["class"]) == ("dagster_k8s", "K8sRunLauncher")
    assert (custom["module"], custom["class"]) == (
        instance["run_launcher"]["module"],
        instance["run_launcher"]["class"],
    )
    launcher, helm_launcher = instance["run_launcher"]["config"], custom["config"]
    chart_names = {
        "dagster_home": values["global"]["dagsterHome"],
        "instance_config_map": f"{RELEASE}-instance",
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
    }
    assert {k: helm_launcher[k] for k in chart_names} == chart_names
    assert {k: v for k, v in helm_launcher.items() if k not in chart_names} == {
        k: v for k, v in launcher.items() if k not in chart_names
    }
    storage = instance["storage"]["postgres"]["postgres_db"]
    assert storage["scheme"] == values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert instance["run_monitoring"]["start_timeout_seconds"] == monitoring["startTimeoutSeconds"]
    assert instance["run_monitoring"]["poll_interval_seconds"] == monitoring["pollIntervalSeconds"]

    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["--module-name", "corr_pipeline.definitions"]
    # the run pods get their settings from the launcher alone (the values say why)
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": False}
    assert deployment["volumes"] == helm_launcher["volumes"]
    assert deployment["volumeMounts"] == helm_launcher["volume_mounts"]
    assert [c["name"] for c in deployment["envConfigMaps"]] == helm_launcher["env_config_maps"]
    assert [s["name"] for s in deployment["envSecrets"]] == helm_launcher["env_secrets"]
    assert f"{deployment['image']['repository']}:{deployment['image']['tag']}" == IMAGE
    manifests = _manifests()
    for name in helm_launcher["env_config_maps"]:
        assert ("ConfigMap", name) in manifests
    for name in helm_launcher["env_secrets"]:
        assert ("Secret", name) in manifests
    assert ("Secret", values["global"]["postgresqlSecretName"]) in manifests
    assert ("ServiceAccount", helm_launcher["service_account_name"]) in manifests


def test_helm_kubernetes_objects_validate_in_a_pod():
    values = _helm()
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    container = {
        "name": "code-server",
        "image": IMAGE,
        "args": ["dagster", "api", "grpc", *deployment["dagsterApiGrpcArgs"]],
        "ports": [{"containerPort": deployment["port"]}],
        "resources": deployment["resources"],
        "volumeMounts": deployment["volumeMounts"],
        "envFrom": [{"configMapRef": c} for c in deployment["envConfigMaps"]]
        + [{"secretRef": s} for s in deployment["envSecrets"]],
    }
    _validate(
        _pod(
            containers=[container],
            volumes=deployment["volumes"],
            securityContext=deployment["podSecurityContext"],
        )
    )
    for component in ("dagsterWebserver", "dagsterDaemon"):
        _validate(
            _pod(
                containers=[
                    {"name": "c", "image": IMAGE, "resources": values[component]["resources"]}
                ]
            )
        )
    run = values["runLauncher"]["config"]["customRunLauncher"]["config"]
    _validate(
        _pod(
            containers=[
                {
                    "name": "run",
                    "image": IMAGE,
                    "volumeMounts": run["volume_mounts"],
                    **run["run_k8s_config"]["container_config"],
                }
            ],
            volumes=run["volumes"],
        )
    )


# ------------------------------------------------------------------------------------------------
# The instance file, loaded by Dagster
# ------------------------------------------------------------------------------------------------


def test_the_instance_file_loads_creates_its_storage_and_launches_a_valid_job(
    new_database, tmp_path, monkeypatch
):
    url = make_url(new_database())  # Dagster's own database on the test server
    socket_dir = (
        parse_qs(url.render_as_string(hide_password=False).split("?", 1)[1]).get("host")
        if url.query
        else None
    )
    proxy = None
    if socket_dir:  # the embedded server has no TCP port; Dagster's URL needs one
        port = h.free_tcp_port()
        proxy = h.TcpToUnixProxy(port, Path(socket_dir[0]) / ".s.PGSQL.5432")
        proxy.start()
        host = "127.0.0.1"
    else:
        host, port = url.host, url.port or 5432
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes((DEPLOY / "dagster.yaml").read_bytes())
    for name, value in {
        "DAGSTER_HOME": str(home),
        "DAGSTER_K8S_INSTANCE_CONFIG_MAP": "dagster-instance",
        "DAGSTER_K8S_PG_PASSWORD_SECRET": "dagster-postgresql-secret",
        "DAGSTER_PG_HOST": host,
        "DAGSTER_PG_PORT": str(port),
        "DAGSTER_PG_USER": url.username or "postgres",
        "DAGSTER_PG_PASSWORD": url.password or "",
        "DAGSTER_PG_DB": url.database,
    }.items():
        monkeypatch.setenv(name, value)
    try:
        with JobRecorder(tmp_path / "api") as api:
            api.serve_in_cluster(monkeypatch)
            instance = dg.DagsterInstance.from_config(str(home))
            try:
                _check_instance(instance, api)
            finally:
                instance.dispose()
    finally:
        if proxy is not None:
            proxy.stop()


def _check_instance(instance: dg.DagsterInstance, api: JobRecorder) -> None:
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
    assert instance.get_runs() == []  # its tables exist on the server
    assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
    limits = instance_limits(instance)
    assert (limits.granularity, limits.per_partition, limits.snapshot_runs) == ("run", 1, 4)
    launcher = instance.run_launcher
    assert isinstance(launcher, K8sRunLauncher)

    job_def = snapshot_job_def()
    origin = dg.reconstructable(snapshot_job_def).get_python_origin()
    # the image a code server reports (`dagster api grpc` reads $DAGSTER_CURRENT_IMAGE, which
    # the chart sets on the user deployment): the image of the run pods
    origin = origin._replace(
        repository_origin=origin.repository_origin._replace(container_image=IMAGE)
    )
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config={},
        tags={"dagster/partition": "2026-11-27"},
        job_code_origin=origin,
    )
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    ((namespace, doc),) = api.jobs  # the Job as the API server received it
    assert namespace == "corr-pipeline"
    _validate(doc)
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["resources"]["limits"]["memory"] == "10Gi"
    per_run = run_memory(24_000, 252, 512).per_run  # the comment's figure
    assert 9 * 2**30 < per_run <= 10 * 2**30
    assert {"mountPath": "/data/store", "name": "matrix-store"} in container["volumeMounts"]
    sources = {next(iter(s.values()))["name"] for s in container["envFrom"]}
    assert {"corr-pipeline-config", "corr-pipeline-secrets"} <= sources
    assert doc["spec"]["backoffLimit"] == 0
    assert "dagster" in container["args"] and run.run_id in " ".join(container["args"])
    # the pod the namespace admits: restricted, read-only root, no token, reached by nobody
    # and reaching the Dask scheduler (test_k8s_security.py checks the same from the files)
    assert restricted_problems(pod) == []
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    labels = doc["spec"]["template"]["metadata"]["labels"]
    assert labels["corr-pipeline/role"] == "run"
    policies = [d for d in _manifests().values() if d["kind"] == "NetworkPolicy"]
    run_pod = Pod(labels, namespace)
    scheduler = _manifests()[("Deployment", "corr-pipeline-dask-scheduler")]
    assert allowed(policies, run_pod, Pod(scheduler["spec"]["template"]["metadata"]["labels"],
                                          namespace), 8786)  # fmt: skip
    assert not allowed(policies, Pod({"app": "debug"}, namespace), run_pod, 8786)
