"""What the frontend's and the workers' pods share: restricted security, pod metadata and
overrides, resources, images, probes, disruption budgets."""

from __future__ import annotations

from typing import Any

from transcription_api.engines import Image
from transcription_api.v1alpha1 import ResourcesSpec

from ..config import OperatorConfig
from ..names import labels, selector
from .meta import Fronted, Manifest, Owner, object_meta

RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}


def resource_requirements(res: ResourcesSpec) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpus:
        requests[res.gpu_resource_name] = limits[res.gpu_resource_name] = str(res.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def pod_meta(owner: Fronted, component: str, pool: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {**owner.spec.pod.labels, **labels(owner, component, pool)}}
    if owner.spec.pod.annotations:
        meta["annotations"] = dict(owner.spec.pod.annotations)
    return meta


def pod_common(owner: Fronted) -> dict[str, Any]:
    spec: dict[str, Any] = {"securityContext": RESTRICTED_POD_SECURITY}
    if owner.spec.pod.priority_class_name:
        spec["priorityClassName"] = owner.spec.pod.priority_class_name
    if owner.spec.images.pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in owner.spec.images.pull_secrets]
    return spec


def image_for(owner: Fronted, cfg: OperatorConfig, image: Image) -> str:
    """The resource's override (`spec.images.<key>`), else the operator's default."""
    override: str | None = getattr(owner.spec.images, image.field)
    return override or cfg.images[image.key]


def probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def pod_disruption_budget(owner: Owner, name: str, component: str, pool: str | None) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(owner, name, component, pool),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector(owner, component, pool)},
        },
    }
