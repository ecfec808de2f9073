"""The frontend's ServiceAccount, Role and RoleBinding, and what lets the frontends of
gateways in other namespaces read a deployment's EndpointSlices: least privilege."""

from __future__ import annotations

from collections.abc import Sequence

from ..names import GatewayRef, frontend_name, gateways_rbac_name, routes_name
from .meta import Manifest, Owner, object_meta

READ_ENDPOINT_SLICES = {
    "apiGroups": ["discovery.k8s.io"],
    "resources": ["endpointslices"],
    "verbs": ["get", "list", "watch"],
}


def frontend_rbac(td: Owner) -> list[Manifest]:
    name = frontend_name(td)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": object_meta(td, name, "frontend"),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(td, name, "frontend"),
            "rules": [
                READ_ENDPOINT_SLICES,
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [routes_name(td)],
                    "verbs": ["get", "list", "watch"],
                },
                # Warning Events about its own pod: why it is not ready (an API key file
                # without a key), which the operator names in the resource's status.
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(td, name, "frontend"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": td.namespace}],
        },
    ]


def gateways_rbac(td: Owner, routed_by: Sequence[GatewayRef]) -> list[Manifest]:
    """A Role to read EndpointSlices in the deployment's namespace, bound to the frontend
    ServiceAccount of every gateway of another namespace that routes it (a gateway of the
    deployment's own namespace reads them with its own Role). None without such a gateway."""
    foreign = [g for g in routed_by if g.namespace != td.namespace]
    if not foreign:
        return []
    name = gateways_rbac_name(td)
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(td, name, "gateway"),
            "rules": [READ_ENDPOINT_SLICES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(td, name, "gateway"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"kind": "ServiceAccount", "name": frontend_name(g), "namespace": g.namespace}
                for g in foreign
            ],
        },
    ]
