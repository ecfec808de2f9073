"""Cluster add-ons of the test bed, run as pods on its real node: cluster DNS (CoreDNS) and
KEDA, the event-driven autoscaler the operator's ScaledObjects need.

Both are built here from Go modules (the pinned tools, `toolchain/`) into images (images.py), like everything
else; their manifests are applied with server-side apply under one field manager.

- CoreDNS serves `cluster.local` from the API server (Services resolve in pods as on any
  cluster) and nothing else: there is no upstream to forward to.
- KEDA's manifests are its own (`config/minimal` of the pinned module: CRDs, RBAC, the
  operator, the metrics API server and its APIService), with the test bed's images and
  smaller CPU requests for a 2-core node.

Only the standard library is used (like the rest of the test bed's start-up code).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

DNS_NAMESPACE = "kube-system"
KEDA_NAMESPACE = "keda"
CLUSTER_DOMAIN = "cluster.local"
# Port 53, as in kubeadm's clusters (where the operator's egress policies expect DNS pods):
# as a non-root user, through the pod's net.ipv4.ip_unprivileged_port_start (a safe sysctl).
DNS_PORT = 53

Manifest = dict[str, Any]


def coredns(image: str, service_ip: str) -> list[Manifest]:
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": DNS_NAMESPACE, "labels": labels}
    corefile = f"""\
{CLUSTER_DOMAIN}:{DNS_PORT} in-addr.arpa:{DNS_PORT} ip6.arpa:{DNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
.:{DNS_PORT} {{
    errors
}}
"""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "testbed:coredns", "labels": labels},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "testbed:coredns", "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "testbed:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": DNS_NAMESPACE}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}
                            ],
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "command": ["/coredns"],
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                                    {
                                        "name": "dns-tcp",
                                        "containerPort": DNS_PORT,
                                        "protocol": "TCP",
                                    },
                                ],
                                "resources": {
                                    "requests": {"cpu": "20m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta},
            "spec": {
                "clusterIP": service_ip,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
                ],
            },
        },
    ]


ARGS = "/spec/template/spec/containers/0/args/0"


def keda_kustomization(config: Path, images: dict[str, str]) -> Manifest:
    """KEDA's own minimal install (no admission webhooks), on the test bed's images."""
    small = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}
    ops = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy",
         "value": "Never"},
        # A 2-core node: ask for little, as the add-ons of small clusters do.
        {"op": "replace", "path": "/spec/template/spec/containers/0/resources", "value": small},
    ]  # fmt: skip
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(config)],
        "images": [
            _image("ghcr.io/kedacore/keda", images["keda"]),
            _image("ghcr.io/kedacore/keda-metrics-apiserver", images["keda-adapter"]),
        ],
        "patches": [
            {"target": {"kind": "Deployment"}, "patch": json.dumps(ops)},
            # One replica, so no leader election: with it, the operator exits whenever the
            # API server is away longer than the renew deadline (the e2e API-server restart).
            {
                "target": {"kind": "Deployment", "name": "keda-operator"},
                "patch": json.dumps(
                    [
                        {"op": "test", "path": ARGS, "value": "--leader-elect"},
                        {"op": "replace", "path": ARGS, "value": "--leader-elect=false"},
                    ]
                ),
            },
        ],
    }


def _image(name: str, ref: str) -> dict[str, str]:
    new_name, _, tag = ref.rpartition(":")
    return {"name": name, "newName": new_name, "newTag": tag}


def apply(kubectl: Callable[..., str], manifests: list[Manifest]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=testbed", "-f", "-",
            input=body)  # fmt: skip
