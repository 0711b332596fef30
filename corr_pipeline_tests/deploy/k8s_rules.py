"""Two rules of Kubernetes written out, to check manifests without a cluster.

- :func:`restricted_problems`: what the restricted Pod Security Standard (Kubernetes' "Pod
  Security Standards", profile *restricted*, which includes *baseline*) refuses in a pod spec:
  host namespaces, privileged containers, privilege escalation, capabilities beyond
  ``NET_BIND_SERVICE`` or not dropping ``ALL``, running as root (``runAsNonRoot`` unset or uid 0),
  no ``RuntimeDefault``/``Localhost`` seccomp profile, volume types outside the restricted list.
- :func:`allowed`: whether NetworkPolicies let a pod with labels ``source`` open a TCP connection
  to port ``port`` of a pod with labels ``target``: a target that no Ingress policy selects
  accepts everything; otherwise some rule of a policy selecting it must match both the source
  (``podSelector`` = pods of the policy's namespace, ``namespaceSelector`` = pods of the matching
  namespaces, both = their intersection, no ``from`` = anyone) and the port (no ``ports`` = any).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Pod", "allowed", "restricted_problems", "selects"]

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_problems(spec: dict[str, Any]) -> list[str]:
    """Every violation of the restricted Pod Security Standard in the pod spec ``spec``
    (camelCase, as in a manifest), one line each; empty when the pod would be admitted."""
    problems = []
    pod_context = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"pod: {key}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds)} not allowed")
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities.drop lacks ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as uid 0")
        seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: no RuntimeDefault or Localhost seccomp profile")
    return problems


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the label selector (``matchLabels`` and ``matchExpressions``; empty = every
    object) selects an object with ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


class Pod:
    """A pod as NetworkPolicies see it: its labels and its namespace's labels (the name label
    Kubernetes sets on every namespace, and ``namespace_labels``)."""

    def __init__(
        self,
        labels: dict[str, str],
        namespace: str,
        namespace_labels: dict[str, str] | None = None,
    ) -> None:
        self.labels = labels
        self.namespace = namespace
        self.namespace_labels = {
            **(namespace_labels or {}),
            "kubernetes.io/metadata.name": namespace,
        }


def _peer_matches(peer: dict[str, Any], source: Pod, policy_namespace: str) -> bool:
    pod_selector, namespace_selector = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespace_selector is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selects(namespace_selector, source.namespace_labels)
    return in_namespace and (pod_selector is None or selects(pod_selector, source.labels))


def allowed(policies: list[dict[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    """Whether ``policies`` let ``source`` connect to TCP ``port`` of ``target``."""
    governing = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], target.labels)
    ]
    if not governing:
        return True
    for policy in governing:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers is not None and not any(
                _peer_matches(peer, source, policy["metadata"]["namespace"]) for peer in peers
            ):
                continue
            ports = rule.get("ports")
            if ports is None or any(
                p.get("protocol", "TCP") == "TCP" and p.get("port") == port for p in ports
            ):
                return True
    return False
