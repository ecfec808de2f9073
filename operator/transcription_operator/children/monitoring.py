"""Prometheus: a PodMonitor of the resource's pods (`spec.monitoring`)."""

from __future__ import annotations

from typing import Any

from transcription_api.v1alpha1 import TranscriptionDeployment

from ..names import COMPONENT_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, PART_OF
from .meta import Manifest, object_meta


def pod_monitor(td: TranscriptionDeployment) -> Manifest:
    """prometheus-operator's PodMonitor of the resource's frontend and worker pods, with the
    relabelling of the chart's monitors (templates/monitors.yaml): `deployment`, `pool` and
    `engine` from the pods' labels, `job` transcription-frontend or transcription-worker."""
    m = td.spec.monitoring
    meta = object_meta(td, f"{td.name}-metrics", "metrics")
    meta["labels"] = {**m.labels, **meta["labels"]}

    def replace(pod_label: str, target: str, replacement: str = "$1") -> dict[str, Any]:
        source = "__meta_kubernetes_pod_label_" + pod_label
        return {"action": "replace", "sourceLabels": [source], "targetLabel": target,
                "replacement": replacement}  # fmt: skip

    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {
                "matchLabels": {INSTANCE_LABEL: td.name, MANAGED_BY_LABEL: PART_OF},
                "matchExpressions": [
                    {"key": COMPONENT_LABEL, "operator": "In", "values": ["frontend", "worker"]}
                ],
            },
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": m.interval,
                    "relabelings": [
                        # `transformers serve` has no /metrics.
                        {"action": "drop", "regex": "transformers",
                         "sourceLabels": ["__meta_kubernetes_pod_label_transcription_dev_engine"]},
                        replace("app_kubernetes_io_component", "job", "transcription-$1"),
                        replace("app_kubernetes_io_instance", "deployment"),
                        replace("transcription_dev_pool", "pool"),
                        replace("transcription_dev_engine", "engine"),
                        {"action": "labeldrop", "regex": "endpoint"},
                    ],
                }
            ],
        },
    }  # fmt: skip
