"""NetworkPolicies: who may reach the workers, and the frontend's internal ports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transcription_api.frontend import FRONTEND_PORT, INTERNAL_PORT, SCALER_PORT
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_api.worker import WORKER_PORT

from ..names import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAMESPACE_NAME_LABEL,
    GatewayRef,
    frontend_name,
    network_policy_name,
    selector,
)
from .meta import Fronted, Manifest, object_meta


def worker_network_policy(
    td: TranscriptionDeployment, routed_by: Sequence[GatewayRef] = ()
) -> Manifest:
    """Only this deployment's frontend (when it has one), the frontends of the gateways that
    route it, and metrics scrapers may reach its workers."""
    port = [{"protocol": "TCP", "port": WORKER_PORT}]
    frontends: list[dict[str, Any]] = []
    if td.spec.frontend.enabled:
        frontends.append({"podSelector": {"matchLabels": selector(td, "frontend")}})
    frontends += [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: g.namespace}},
            "podSelector": {"matchLabels": selector(g, "frontend")},
        }
        for g in routed_by
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(td, network_policy_name(td), "worker"),
        "spec": {
            "podSelector": {"matchLabels": {INSTANCE_LABEL: td.name, COMPONENT_LABEL: "worker"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                # An empty `from` would admit everyone: no rule when no frontend routes here.
                *([{"from": frontends, "ports": port}] if frontends else []),
                *(
                    [{"from": list(td.spec.network_policy.metrics_from), "ports": port}]
                    if td.spec.network_policy.metrics_from
                    else []
                ),
            ],
        },
    }


def frontend_network_policy(owner: Fronted) -> Manifest:
    """The frontend's client-facing port is open to all; its internal ports (/internal/load
    for its peers, KEDA's external scaler) only to its own replicas and `scalerFrom`."""
    internal = [
        {"protocol": "TCP", "port": INTERNAL_PORT},
        {"protocol": "TCP", "port": SCALER_PORT},
    ]
    peers = [{"podSelector": {"matchLabels": selector(owner, "frontend")}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(owner, f"{frontend_name(owner)}-internal", "frontend"),
        "spec": {
            "podSelector": {"matchLabels": selector(owner, "frontend")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": FRONTEND_PORT}]},
                {"from": [*peers, *owner.spec.network_policy.scaler_from], "ports": internal},
            ],
        },
    }
