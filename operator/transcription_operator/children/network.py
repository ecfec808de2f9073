"""NetworkPolicies: who may reach the workers and the frontend's internal ports (ingress),
and what the workers and the frontend may reach (egress, `spec.networkPolicy.egress`).

Egress rules hold addresses as pods reach them once a Service is translated (the CNI sees
the pod behind a ClusterIP), and a NetworkPolicy cannot name a host, only addresses:
- DNS: port 53 (and 5353, where a cluster's DNS pods listen behind port 53) to any address.
- The API server (the frontend's discovery and Events): the addresses of the `kubernetes`
  Service's EndpointSlices (the operator's configuration), else any address on 443 and 6443.
- The model hub (workers whose weights come from it): any address on 443; the hub's
  addresses are not fixed.
- The tracing endpoint (`spec.tracing`): its address when it is one, else its port anywhere.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from transcription_api.frontend import FRONTEND_PORT, INTERNAL_PORT, SCALER_PORT
from transcription_api.v1alpha1 import TranscriptionDeployment, WeightsSource
from transcription_api.worker import WORKER_PORT

from ..config import OperatorConfig
from ..names import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAMESPACE_NAME_LABEL,
    GatewayRef,
    frontend_name,
    network_policy_name,
    selector,
)
from .meta import Fronted, Manifest, Owner, object_meta

Rule = dict[str, Any]


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


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def _cidr(address: str) -> str:
    ip = ipaddress.ip_address(address)
    return f"{ip}/{ip.max_prefixlen}"


DNS: Rule = {
    "ports": [{"protocol": proto, "port": port} for port in (53, 5353) for proto in ("UDP", "TCP")]
}


def _tracing(owner: Fronted) -> list[Rule]:
    """The OTLP collector of `spec.tracing`, when set."""
    if owner.spec.tracing.endpoint is None:
        return []
    url = urlsplit(owner.spec.tracing.endpoint)
    rule: Rule = {"ports": _tcp(url.port or (443 if url.scheme == "https" else 80))}
    with contextlib.suppress(ValueError):  # a name: its port, anywhere
        rule["to"] = [{"ipBlock": {"cidr": _cidr(url.hostname or "")}}]
    return [rule]


def _api_server(cfg: OperatorConfig) -> list[Rule]:
    if not cfg.api_server:
        return [{"ports": _tcp(443, 6443)}]
    ports = sorted({port for _, port in cfg.api_server})
    return [
        {
            "to": [{"ipBlock": {"cidr": _cidr(a)}} for a, p in cfg.api_server if p == port],
            "ports": _tcp(port),
        }
        for port in ports
    ]


def _egress(owner: Owner, name: str, component: str, pods: dict[str, str],
            rules: list[Rule]) -> Manifest:  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(owner, name, component),
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Egress"], "egress": rules},
    }


def worker_egress_policy(td: TranscriptionDeployment) -> Manifest:
    """The workers reach DNS, the model hub only when their weights come from it, and the
    tracing endpoint when set."""
    hub = [{"ports": _tcp(443)}] if td.spec.model.source == WeightsSource.HUB else []
    pods = {INSTANCE_LABEL: td.name, COMPONENT_LABEL: "worker"}
    return _egress(td, f"{network_policy_name(td)}-egress", "worker", pods,
                   [DNS, *hub, *_tracing(td)])  # fmt: skip


def frontend_egress_policy(
    owner: Fronted, cfg: OperatorConfig, deployments: Sequence[tuple[str, str]]
) -> Manifest:
    """The frontend reaches DNS, the API server, the workers of `deployments` ((namespace,
    name): its own deployment's, or those a gateway routes), its peers' internal port and
    the tracing endpoint when set."""
    workers = [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
            "podSelector": {"matchLabels": {INSTANCE_LABEL: name, COMPONENT_LABEL: "worker"}},
        }
        for namespace, name in deployments
    ]
    peers = [{"podSelector": {"matchLabels": selector(owner, "frontend")}}]
    rules = [
        DNS,
        *_api_server(cfg),
        # An empty `to` would admit everything: no rule when there are no workers.
        *([{"to": workers, "ports": _tcp(WORKER_PORT)}] if workers else []),
        {"to": peers, "ports": _tcp(INTERNAL_PORT)},
        *_tracing(owner),
    ]
    name = f"{frontend_name(owner)}-egress"
    return _egress(owner, name, "frontend", selector(owner, "frontend"), rules)
