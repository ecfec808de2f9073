"""NetworkPolicies: who may reach the workers, and the frontend's internal ports."""

from __future__ import annotations

from transcription_api.frontend import FRONTEND_PORT, INTERNAL_PORT, SCALER_PORT
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_api.worker import WORKER_PORT

from ..names import COMPONENT_LABEL, INSTANCE_LABEL, frontend_name, network_policy_name, selector
from .meta import Manifest, object_meta


def worker_network_policy(td: TranscriptionDeployment) -> Manifest:
    """Only this deployment's frontend (and metrics scrapers) may reach its workers."""
    port = [{"protocol": "TCP", "port": WORKER_PORT}]
    frontend_peer = {"podSelector": {"matchLabels": selector(td, "frontend")}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(td, network_policy_name(td), "worker"),
        "spec": {
            "podSelector": {"matchLabels": {INSTANCE_LABEL: td.name, COMPONENT_LABEL: "worker"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [frontend_peer], "ports": port},
                *(
                    [{"from": list(td.spec.network_policy.metrics_from), "ports": port}]
                    if td.spec.network_policy.metrics_from
                    else []
                ),
            ],
        },
    }


def frontend_network_policy(td: TranscriptionDeployment) -> Manifest:
    """The frontend's client-facing port is open to all; its internal ports (/internal/load
    for its peers, KEDA's external scaler) only to its own replicas and `scalerFrom`."""
    internal = [
        {"protocol": "TCP", "port": INTERNAL_PORT},
        {"protocol": "TCP", "port": SCALER_PORT},
    ]
    peers = [{"podSelector": {"matchLabels": selector(td, "frontend")}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(td, f"{frontend_name(td)}-internal", "frontend"),
        "spec": {
            "podSelector": {"matchLabels": selector(td, "frontend")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": FRONTEND_PORT}]},
                {"from": [*peers, *td.spec.network_policy.scaler_from], "ports": internal},
            ],
        },
    }
