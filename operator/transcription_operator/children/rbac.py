"""The frontend's ServiceAccount, Role and RoleBinding: least privilege."""

from __future__ import annotations

from transcription_api.v1alpha1 import TranscriptionDeployment

from ..names import frontend_name, routes_name
from .meta import Manifest, object_meta


def frontend_rbac(td: TranscriptionDeployment) -> list[Manifest]:
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
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                },
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
