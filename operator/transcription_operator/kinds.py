"""The kinds the operator touches, in one registry: what it owns (its children, in apply
order), reads and writes, and so the RBAC rules it needs.

The REST client (`kube.py`), the watches (`handlers.py`), pruning (`reconciler.py`) and
the Helm chart's RBAC (checked against `rbac_rules()` by a test) all read this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transcription_api.v1alpha1 import API_VERSION, GATEWAY_KIND, GATEWAY_PLURAL, KIND, PLURAL

ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
READ = ("get", "list", "watch")


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    verbs: tuple[str, ...] = ALL_VERBS  # what the operator may do with it
    optional: bool = False  # its API may not be served (a CRD of another project)
    cluster_scoped: bool = False

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def base(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        if self.cluster_scoped:
            return f"{self.base}/{self.plural}" + (f"/{name}" if name else "")
        if namespace is None:  # every namespace (lists only)
            return f"{self.base}/{self.plural}"
        p = f"{self.base}/namespaces/{namespace}/{self.plural}"
        if name:
            p += f"/{name}"
        if sub:
            p += f"/{sub}"
        return p


# Owned by a TranscriptionDeployment or a TranscriptionGateway, applied in this order; stale
# ones are deleted.
CHILDREN: tuple[Kind, ...] = (
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    # KEDA's, for autoscaled pools: an API that may be missing (KEDA not installed).
    Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", optional=True),
    # prometheus-operator's, when spec.monitoring.podMonitor asks (skipped where missing).
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors", optional=True),
)
RESOURCE = Kind(API_VERSION, KIND, PLURAL, READ)
# Optional: a cluster whose CRDs predate it lists none (and the operator still starts).
GATEWAY = Kind(API_VERSION, GATEWAY_KIND, GATEWAY_PLURAL, READ, optional=True)
RESOURCES = (RESOURCE, GATEWAY)  # the kinds the operator reconciles
RESOURCE_KIND_NAMES = frozenset(k.kind for k in RESOURCES)
# A gateway's `namespaces.from: Selector` matches namespaces by their labels: read-only, and
# only where the operator watches every namespace (a namespaced one never reads them).
NAMESPACE = Kind("v1", "Namespace", "namespaces", READ, cluster_scoped=True)
SECRET = Kind("v1", "Secret", "secrets", ("get",))  # existence checks, by name only
EVENT = Kind("v1", "Event", "events", ("create", "patch"))
# Status says why pods are not ready: the operator's pods and the Warning Events about pods
# are watched (read-only; never a request per pod).
POD = Kind("v1", "Pod", "pods", READ)
EVENT_READS = READ  # core/v1 Events only
# Leader election (`leader.py`): one Lease, in the operator's own namespace.
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases", ("get", "create", "update"))
# The `kubernetes` Service's, read at start for the frontends' egress to the API server (the
# operator holds this read anyway: the frontends' Roles grant it).
ENDPOINT_SLICE = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", READ)

KINDS: dict[str, Kind] = {
    k.kind: k for k in (*CHILDREN, *RESOURCES, SECRET, EVENT, POD, LEASE, NAMESPACE, ENDPOINT_SLICE)
}
CHILD_KIND_NAMES = frozenset(k.kind for k in CHILDREN)


def rbac_rules(
    secret_names: list[str] | None = None, cluster_wide: bool = True
) -> list[dict[str, Any]]:
    """The rules the operator's ClusterRole (or each namespace's Role) must grant: its
    children, its resources and their status subresources, Events (through either Events
    API) and, only by name, the Secrets that resources reference; `cluster_wide`, reading
    namespaces too. The rules of the Roles the operator creates come on top (RBAC lets it
    grant only what it holds)."""

    def rule(groups: list[str], resource: str, verbs: tuple[str, ...]) -> dict[str, Any]:
        return {"apiGroups": groups, "resources": [resource], "verbs": list(verbs)}

    rules = []
    for kind in RESOURCES:
        rules.append(rule([kind.group], kind.plural, kind.verbs))
        rules.append(rule([kind.group], f"{kind.plural}/status", ("get", "patch", "update")))
    rules += [rule([k.group], k.plural, k.verbs) for k in CHILDREN]
    if secret_names:
        rules.append(rule([SECRET.group], SECRET.plural, SECRET.verbs))
        rules[-1]["resourceNames"] = list(secret_names)
    rules.append(rule([EVENT.group, "events.k8s.io"], EVENT.plural, EVENT.verbs))
    rules.append(rule([POD.group], POD.plural, POD.verbs))
    rules.append(rule([EVENT.group], EVENT.plural, EVENT_READS))
    if cluster_wide:
        rules.append(rule([NAMESPACE.group], NAMESPACE.plural, NAMESPACE.verbs))
    return rules


def leader_election_rules(lease_name: str) -> list[dict[str, Any]]:
    """The rules of the Role, in the operator's own namespace only, that leader election
    needs: create the Lease (RBAC cannot restrict `create` by name), then read and renew
    only that one."""
    group, plural = LEASE.group, LEASE.plural
    return [
        {"apiGroups": [group], "resources": [plural], "verbs": ["create"]},
        {
            "apiGroups": [group],
            "resources": [plural],
            "resourceNames": [lease_name],
            "verbs": [v for v in LEASE.verbs if v != "create"],
        },
    ]
