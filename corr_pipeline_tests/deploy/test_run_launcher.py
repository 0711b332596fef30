"""Whoever may launch a run does not choose its pod.

The run launcher of ``deploy/dagster.yaml`` and the one of ``deploy/helm/dagster-values.yaml``
(each block loaded as it stands, as a Dagster instance's ``run_launcher``) launch runs of
``snapshot_job`` through :class:`~corr_pipeline_tests.deploy.k8s_api.JobRecorder`, a stand-in
Kubernetes API reached over HTTPS by dagster-k8s's own client, with ``instance.launch_run`` (what
the daemon's run queue calls):

- a run with the pipeline's own tags becomes one Job: the code location's image, the workload
  account without a token, the restricted pod, the run label, valid against the Kubernetes schema;
- a run whose tags set ``dagster-k8s/config`` (image, command, environment, the Dagster account's
  token, labels, a host path, the Job's spec) or ``dagster-k8s/resource_requirements``, and a run
  whose code location reports a container context, are refused by dagster-k8s's allow-list: the
  run fails at launch and no request reaches the API;
- no job of the code location runs its steps in pods of their own (``k8s_job_executor`` reads
  per-step pod settings from the run config, which the launchpad writes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import kubernetes_validate
import pytest
import yaml

from corr_pipeline.defs.executor import snapshot_executor
from corr_pipeline.defs.run import snapshot_job_def
from corr_pipeline_tests.deploy.k8s_api import JobRecorder
from corr_pipeline_tests.deploy.k8s_rules import restricted_problems

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IMAGE = "registry.example.com/corr-pipeline:TAG"
K8S_VERSION = "1.37.0"


def _launcher_block(source: str) -> dict[str, Any]:
    """The ``run_launcher`` entry (module, class, config) that ``source`` gives the instance."""
    if source == "instance file":
        return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_launcher"]
    values = yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())
    assert values["runLauncher"]["type"] == "CustomRunLauncher"
    return values["runLauncher"]["config"]["customRunLauncher"]


@pytest.fixture(params=["instance file", "helm values"])
def launching(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dg.DagsterInstance, JobRecorder]]:
    """An instance whose run launcher is the deploy's, and the API server it reaches."""
    monkeypatch.setenv("DAGSTER_K8S_INSTANCE_CONFIG_MAP", "dagster-instance")
    monkeypatch.setenv("DAGSTER_K8S_PG_PASSWORD_SECRET", "dagster-postgresql-secret")
    with JobRecorder(tmp_path / "api") as api:
        api.serve_in_cluster(monkeypatch)
        overrides = {"run_launcher": _launcher_block(request.param)}
        with dg.instance_for_test(overrides=overrides) as instance:
            yield instance, api


def _run(
    instance: dg.DagsterInstance,
    tags: dict[str, str],
    container_context: dict[str, Any] | None = None,
) -> dg.DagsterRun:
    """A run of ``snapshot_job`` with the job's tags, a partition and ``tags``, from a code
    location that serves ``IMAGE`` and reports ``container_context``."""
    job_def = snapshot_job_def()
    origin = dg.reconstructable(snapshot_job_def).get_python_origin()
    origin = origin._replace(
        repository_origin=origin.repository_origin._replace(
            container_image=IMAGE, container_context=container_context
        )
    )
    return instance.create_run_for_job(
        job_def=job_def,
        run_config={},
        tags={**job_def.tags, "dagster/partition": "2026-11-27", **tags},
        job_code_origin=origin,
    )


def test_a_run_of_the_pipeline_launches_the_deploys_job(launching):
    instance, api = launching
    run = _run(instance, {})
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    ((namespace, job),) = api.jobs
    assert (namespace, api.refused) == ("corr-pipeline", [])
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert pod["serviceAccountName"] == "corr-pipeline-workload"
    assert pod["automountServiceAccountToken"] is False
    assert restricted_problems(pod) == []
    assert container["resources"]["limits"]["memory"] == "10Gi"
    assert job["spec"]["template"]["metadata"]["labels"]["corr-pipeline/role"] == "run"


def _config_tag(config: dict[str, Any]) -> dict[str, str]:
    return {"dagster-k8s/config": json.dumps(config)}


#: What a run's tags may try to set, each refused.
TAGS = {
    "image, command, environment": _config_tag(
        {
            "container_config": {
                "image": "attacker.example/tool:1",
                "command": ["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"],
                "env": [{"name": "LD_PRELOAD", "value": "/data/store/x.so"}],
            }
        }
    ),
    "an environment variable alone": _config_tag(
        {"container_config": {"env": [{"name": "CORR_PIPELINE_STORE_DIR", "value": "/tmp"}]}}
    ),
    "the Dagster account's token": _config_tag(
        {
            "pod_spec_config": {
                "service_account_name": "dagster",
                "automount_service_account_token": True,
            }
        }
    ),
    "another role's label": _config_tag(
        {"pod_template_spec_metadata": {"labels": {"corr-pipeline/role": "dask-worker"}}}
    ),
    "a host path": _config_tag(
        {"pod_spec_config": {"volumes": [{"name": "host", "host_path": {"path": "/"}}]}}
    ),
    "the Job's spec": _config_tag({"job_spec_config": {"backoff_limit": 100}}),
    "resource requirements": {
        "dagster-k8s/resource_requirements": json.dumps({"limits": {"memory": "500Gi"}})
    },
}


def _assert_refused(instance: dg.DagsterInstance, api: JobRecorder, run: dg.DagsterRun) -> None:
    with pytest.raises(Exception, match="violated the allowed list"):
        instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    assert api.jobs == [] and api.refused == []  # nothing reached the API
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE


@pytest.mark.parametrize("name", sorted(TAGS))
def test_a_run_whose_tags_set_its_pod_is_refused(launching, name):
    instance, api = launching
    _assert_refused(instance, api, _run(instance, TAGS[name]))


def test_a_code_locations_container_context_is_refused(launching):
    """What the chart's ``includeConfigInLaunchedRuns`` (off in the values) would report."""
    instance, api = launching
    context = {
        "k8s": {
            "service_account_name": "dagster",
            "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
        }
    }
    _assert_refused(instance, api, _run(instance, {}, container_context=context))


def test_no_job_runs_its_steps_in_pods_of_their_own():
    """Every job's executor is the pipeline's (in the run pod: ``in_process`` or
    ``multiprocess``), so the launchpad's run config sets no step pod."""
    from corr_pipeline.definitions import defs

    jobs = defs.get_repository_def().get_all_jobs()
    assert jobs
    assert {job.executor_def for job in jobs} == {snapshot_executor}
