"""The Kubernetes deploy admits no one it should not.

- Every pod of ``deploy/`` (the manifests' workloads; the webserver, daemon, code server and run
  pods of the Helm values, as the chart's templates build them) passes the restricted Pod
  Security Standard, which the namespace enforces; the pods that need no Kubernetes API mount no
  token; ours have a read-only root file system.
- The NetworkPolicies, evaluated for every pair of pods and port: only run pods and workers reach
  the Dask scheduler, only the webserver and daemon reach the code server, only pods of the
  namespace labelled ``corr-pipeline/ui-proxy=true`` reach the webserver, nothing else reaches
  anything.
- The Dask commands of ``deploy/k8s/dask.yaml``, run here as processes with certificates made
  as ``secret.example.yaml`` says: a cluster that the runs' settings reach over TLS and that
  refuses a plain TCP client and a client of another authority.
(The run pod that ``deploy/dagster.yaml``'s launcher really submits is checked against the same
rules in ``test_deploy.py``.)
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster_k8s.utils import get_common_labels

from corr_pipeline import settings
from corr_pipeline.compute.parallel.dask_runner import connect
from corr_pipeline.snapshot.scheduler import scheduler_security
from corr_pipeline_tests.deploy.k8s_rules import Pod, allowed, restricted_problems
from corr_pipeline_tests.fixtures.dask_tls import make_certificates

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "corr-pipeline"
TLS_DIR = "/etc/corr-pipeline/dask-tls"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for doc in _docs(path)]


def _workloads() -> dict[str, dict[str, Any]]:
    """The pod templates of the manifests, by workload name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in _manifests()
        if d["kind"] in ("Deployment", "Job")
    }


def _helm() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())


def _instance_launcher() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["run_launcher"]["config"]


def _helm_launcher() -> dict[str, Any]:
    """The config of the run launcher the values give the chart (a custom launcher)."""
    return _helm()["runLauncher"]["config"]["customRunLauncher"]["config"]


def _helm_pods() -> dict[str, dict[str, Any]]:
    """The pod specs the Dagster chart builds from the values (its deployment-webserver,
    deployment-daemon and deployment-user templates: the pod's securityContext from
    ``podSecurityContext``, every container's, init containers included, from
    ``securityContext``), and the run pod of the launcher's ``run_k8s_config``."""
    values = _helm()
    pods = {}
    for component, inits in (
        ("dagsterWebserver", ["check-db-ready", "init-user-deployment-corr-pipeline"]),
        ("dagsterDaemon", ["check-db-ready"]),
    ):
        v = values[component]
        pods[component] = {
            "securityContext": v["podSecurityContext"],
            "initContainers": [{"name": n, "securityContext": v["securityContext"]} for n in inits],
            "containers": [{"name": "dagster", "securityContext": v["securityContext"]}],
        }
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    pods["code-server"] = {
        "securityContext": deployment["podSecurityContext"],
        "containers": [{"name": "dagster", "securityContext": deployment["securityContext"]}],
        "volumes": deployment["volumes"],
    }
    run = _helm_launcher()
    pods["run"] = {
        **run["run_k8s_config"]["pod_spec_config"],
        "containers": [
            {
                "name": "dagster",
                "securityContext": run["run_k8s_config"]["container_config"]["securityContext"],
            }
        ],  # fmt: skip
        "volumes": run["volumes"],
    }
    return pods


# ------------------------------------------------------------------------------------------------
# Pod Security
# ------------------------------------------------------------------------------------------------


def test_the_namespace_enforces_the_restricted_standard():
    (namespace,) = [d for d in _manifests() if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("name", sorted(_workloads()))
def test_every_manifest_pod_is_restricted_read_only_and_without_a_token(name):
    spec = _workloads()[name]["spec"]
    assert restricted_problems(spec) == []
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "corr-pipeline-workload"
    for container in spec["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts  # the one writable place besides the store


def test_the_workload_account_has_no_token_and_no_role():
    docs = _manifests()
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    assert not [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]


@pytest.mark.parametrize("name", ["dagsterWebserver", "dagsterDaemon", "code-server", "run"])
def test_every_dagster_pod_is_restricted(name):
    assert restricted_problems(_helm_pods()[name]) == []


def test_the_run_pods_are_read_only_without_a_token_in_both_launcher_configs():
    helm_run = _helm_launcher()["run_k8s_config"]
    instance_run = _instance_launcher()["run_k8s_config"]
    assert helm_run == instance_run
    assert instance_run["pod_spec_config"]["automountServiceAccountToken"] is False
    assert instance_run["container_config"]["securityContext"]["readOnlyRootFilesystem"] is True
    code_server = _helm_pods()["code-server"]
    assert code_server["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in _instance_launcher()["volume_mounts"]}
    assert {"/tmp", "/data/store", TLS_DIR} <= mounts


def test_the_rules_refuse_what_the_standard_refuses():
    """The check can fail: root, a kept capability, escalation or no seccomp profile each
    make a problem, as a hostPath volume does."""
    good = _workloads()["corr-pipeline-dask-worker"]["spec"]
    assert restricted_problems(good) == []
    for change in (
        lambda s: s["securityContext"].pop("runAsNonRoot"),
        lambda s: s["securityContext"].pop("seccompProfile"),
        lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        lambda s: s["containers"][0]["securityContext"].update(runAsUser=0),
        lambda s: s["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
    ):
        bad = copy.deepcopy(good)
        change(bad)
        assert restricted_problems(bad), change


# ------------------------------------------------------------------------------------------------
# NetworkPolicies
# ------------------------------------------------------------------------------------------------


def _pods() -> dict[str, Pod]:
    """Every kind of pod of the deploy, with the labels its template gives it, the UI's proxy
    (a namespace labelled for it), and two outsiders: an unlabelled pod in the namespace and a
    pod of another namespace."""
    chart = {"app.kubernetes.io/name": "dagster", "app.kubernetes.io/instance": "dagster"}
    run_labels = {
        **get_common_labels(),
        "app.kubernetes.io/component": "run_worker",
        **_instance_launcher()["run_k8s_config"]["pod_template_spec_metadata"]["labels"],
    }
    workloads = _workloads()
    return {
        "dask-scheduler": Pod(
            workloads["corr-pipeline-dask-scheduler"]["metadata"]["labels"], NAMESPACE
        ),
        "dask-worker": Pod(workloads["corr-pipeline-dask-worker"]["metadata"]["labels"], NAMESPACE),
        "db-upgrade": Pod(workloads["corr-pipeline-db-upgrade"]["metadata"]["labels"], NAMESPACE),
        "webserver": Pod({**chart, "component": "dagster-webserver"}, NAMESPACE),
        "daemon": Pod({**chart, "component": "dagster-daemon", "deployment": "daemon"}, NAMESPACE),
        "code-server": Pod(
            {**chart, "component": "user-deployments", "deployment": "corr-pipeline"}, NAMESPACE
        ),
        "run": Pod(run_labels, NAMESPACE),
        "stranger": Pod({"app": "debug"}, NAMESPACE),
        "ui-proxy": Pod({"app": "proxy"}, "ingress-nginx", {"corr-pipeline/ui-proxy": "true"}),
        "other-namespace": Pod({"app": "ingress"}, "monitoring"),
    }


#: (target, port) -> the pods that may connect; every other pair is refused.
EXPECTED = {
    ("dask-scheduler", 8786): {"run", "dask-worker"},
    ("dask-worker", 8788): {"run", "dask-scheduler", "dask-worker"},
    ("dask-worker", 8789): {"run", "dask-scheduler", "dask-worker"},
    ("code-server", 3030): {"webserver", "daemon"},
    ("webserver", 8080): {"ui-proxy"},
}
PORTS = (8786, 8787, 8788, 8789, 3030, 8080, 5432)


def _policies() -> list[dict[str, Any]]:
    return [d for d in _manifests() if d["kind"] == "NetworkPolicy"]


def _reachable(policies: list[dict[str, Any]]) -> dict[tuple[str, int], set[str]]:
    pods = _pods()
    return {
        (target, port): {
            source
            for source, pod in pods.items()
            if allowed(policies, pod, pods[target], port)  # a pod of another replica, too
        }
        for target in pods
        if pods[target].namespace == NAMESPACE
        for port in PORTS
    }


def test_each_policy_lets_in_exactly_the_pods_it_should():
    for (target, port), sources in _reachable(_policies()).items():
        assert sources == EXPECTED.get((target, port), set()), (target, port)


def test_the_policy_check_can_fail():
    """Without the default deny, a stranger reaches the code server; with a policy that lets
    every pod reach the scheduler, so does the code server; with the webserver's peer any
    namespace, a pod of another namespace reaches the UI."""
    policies = _policies()
    without_deny = [p for p in policies if p["metadata"]["name"] != "default-deny-ingress"]
    assert (
        "stranger"
        in _reachable(without_deny)[("run", 8786)] | _reachable(without_deny)[("db-upgrade", 3030)]
    )
    opened = copy.deepcopy(policies)
    (scheduler,) = [p for p in opened if p["metadata"]["name"].startswith("dask-scheduler")]
    scheduler["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]
    assert "code-server" in _reachable(opened)[("dask-scheduler", 8786)]
    (webserver,) = [p for p in opened if p["metadata"]["name"] == "webserver-from-the-proxy"]
    webserver["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]
    assert "other-namespace" in _reachable(opened)[("webserver", 8080)]


# ------------------------------------------------------------------------------------------------
# Dask over TLS, as the manifests start it
# ------------------------------------------------------------------------------------------------


def _container(workload: str) -> dict[str, Any]:
    (container,) = _workloads()[workload]["spec"]["containers"]
    return container


def _local(command: list[str], replace: dict[str, str]) -> list[str]:
    """``command`` run by this interpreter, each argument that is a key of ``replace`` swapped
    for its value, and in the others the first key that is a path or address part."""
    out = [sys.executable, "-m", "distributed.cli.dask_" + command[1]]
    for arg in command[2:]:
        if arg in replace:
            arg = replace[arg]
        else:
            for old, new in replace.items():
                if ("/" in old or ".svc" in old) and old in arg:
                    arg = arg.replace(old, new)
                    break
        out.append(arg)
    return out


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports (held open together while they are picked, so
    that no two are the same)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_for_workers(address: str, security: Any, count: int, timeout: float = 60) -> None:
    from distributed import Client

    with Client(address, security=security, timeout=timeout, set_as_default=False) as client:
        client.wait_for_workers(count, timeout=timeout)


def test_the_manifests_dask_cluster_speaks_tls_only(tmp_path, monkeypatch):
    from distributed import Client
    from distributed.security import Security

    files = make_certificates(tmp_path / "tls")  # one authority, one certificate, as the secret
    tls = tmp_path / "dask-tls"
    tls.mkdir()
    (tls / "ca.crt").write_bytes(files["ca"].read_bytes())
    (tls / "tls.crt").write_bytes(files["worker_cert"].read_bytes())
    (tls / "tls.key").write_bytes(files["worker_key"].read_bytes())
    (tls / "tls.key").chmod(0o600)
    port, worker_port, nanny_port, dashboard = _distinct_free_ports(4)
    replace = {
        TLS_DIR: str(tls),
        "corr-pipeline-dask-scheduler.corr-pipeline.svc:8786": f"127.0.0.1:{port}",
        "8786": str(port),
        ":8787": f"127.0.0.1:{dashboard}",
        "8788": str(worker_port),
        "8789": str(nanny_port),
        "/tmp/dask-worker": str(tmp_path / "worker"),
        "6GiB": "1GiB",
    }
    scheduler, worker = (
        _container("corr-pipeline-dask-scheduler"),
        _container("corr-pipeline-dask-worker"),
    )
    env = {**os.environ, **{e["name"]: e["value"] for e in scheduler["env"]}}
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "true"
    worker_command = _local(worker["command"], replace)
    worker_command[worker_command.index("--nthreads") + 1] = "1"
    processes = [
        subprocess.Popen(_local(scheduler["command"], replace), env=env, cwd=tmp_path),
    ]
    try:
        time.sleep(1)
        processes.append(subprocess.Popen(worker_command, env=env, cwd=tmp_path))
        config = _docs(DEPLOY / "k8s" / "config.yaml")[2]["data"]
        for key in ("CA_FILE", "CERT", "KEY"):  # the run pods' settings, at this mount
            name = f"CORR_PIPELINE_DASK_TLS_{key}"
            monkeypatch.setenv(name, config[name].replace(TLS_DIR, str(tls)))
        address = config[settings.ENV_DASK_SCHEDULER].replace(
            "corr-pipeline-dask-scheduler.corr-pipeline.svc:8786", f"127.0.0.1:{port}"
        )
        assert address.startswith("tls://")
        security = scheduler_security(address)
        _wait_for_workers(address, security, 1)
        with connect(address, security) as runner:
            assert runner.client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
            (worker_address,) = runner.client.scheduler_info()["workers"]
            assert worker_address == f"tls://127.0.0.1:{worker_port}"

        with pytest.raises(OSError):  # plain TCP: no connection
            Client(f"tcp://127.0.0.1:{port}", timeout=5, set_as_default=False)
        other = make_certificates(tmp_path / "other")  # another authority's client
        stranger = Security(
            tls_ca_file=str(other["ca"]),
            tls_client_cert=str(other["client_cert"]),
            tls_client_key=str(other["client_key"]),
            require_encryption=True,
        )
        with pytest.raises(OSError):
            Client(address, security=stranger, timeout=5, set_as_default=False)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
