"""Autoscaling with KEDA: a ScaledObject per autoscaled pool, pushed by the external scaler
of every frontend that routes to the pool (the deployment's own, each gateway's), each
through its own Service."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from transcription_api.frontend import SCALER_PORT
from transcription_api.units import duration_seconds
from transcription_api.v1alpha1 import TranscriptionDeployment

from ..config import OperatorConfig
from ..names import (
    GatewayRef,
    Named,
    pool_object_name,
    qualified_pool_name,
    scaler_service_name,
    selector,
)
from ..plan import Plan, PlannedPool
from .meta import Fronted, Manifest, object_meta


def autoscaled(the_plan: Plan) -> bool:
    return any(p.spec.autoscaling for p in the_plan.pools)


def _trigger(pool: PlannedPool, scaler: str, name: str) -> dict[str, Any]:
    """One frontend's say: the work of the pool it routes to as `name`, asked of its scaler
    at `scaler` (host:port). Its value is in seconds of one replica's decoding, and its
    target `targetQueueSeconds` per replica, so several frontends' triggers add up."""
    a = pool.spec.autoscaling
    assert a is not None
    rate = a.audio_seconds_per_replica or pool.capabilities.audio_seconds_per_replica
    return {
        "type": "external-push",
        "metadata": {
            "scalerAddress": scaler,
            "pool": name,
            "targetQueueSeconds": f"{a.target_queue_seconds:g}",
            "audioSecondsPerReplica": f"{rate:g}",
        },
    }


def _trigger_name(gateway: GatewayRef, taken: set[str]) -> str:
    """A name KEDA's formula can use (letters, digits, underscores), unique in the object."""
    base = "gateway_" + re.sub(r"[^A-Za-z0-9]", "_", f"{gateway.namespace}_{gateway.name}")
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def scaled_object(
    td: TranscriptionDeployment,
    pool: PlannedPool,
    cfg: OperatorConfig,
    routed_by: Sequence[GatewayRef] = (),
) -> Manifest | None:
    """KEDA scales the pool's Deployment on the work the frontends report for it (its audio
    queued and in flight, in seconds of one replica's decoding), through KEDA's external-push
    scaler protocol: a frontend pushes "active" the moment a request waits for a pool at
    zero. One trigger per frontend that routes to the pool, summed (KEDA's
    scalingModifiers) when there are several; None when no frontend does (nothing would
    send it work)."""
    a = pool.spec.autoscaling
    assert a is not None
    delay = duration_seconds(a.scale_down_delay)

    def address(frontend: Named, namespace: str) -> str:
        service = scaler_service_name(frontend)
        return f"{service}.{namespace}.svc.{cfg.cluster_domain}:{SCALER_PORT}"

    triggers = []
    if td.spec.frontend.enabled:
        triggers.append(("frontend", _trigger(pool, address(td, td.namespace), pool.name)))
    taken = {"frontend"}
    for g in routed_by:
        name = qualified_pool_name(td.namespace, td.name, pool.name, g.namespace)
        triggers.append((_trigger_name(g, taken), _trigger(pool, address(g, g.namespace), name)))
    if not triggers:
        return None
    advanced: dict[str, Any] = {
        "horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": delay}}
        }
    }
    if len(triggers) > 1:
        advanced["scalingModifiers"] = {
            "formula": " + ".join(name for name, _ in triggers),
            "target": f"{a.target_queue_seconds:g}",
            "metricType": "AverageValue",
        }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": object_meta(td, pool_object_name(td, pool.name), "worker", pool.name),
        "spec": {
            "scaleTargetRef": {"name": pool_object_name(td, pool.name)},
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "pollingInterval": 5,
            "cooldownPeriod": delay,  # idle this long before scaling to zero
            "advanced": advanced,
            "triggers": [{"name": name, **t} if len(triggers) > 1 else t for name, t in triggers],
        },
    }


def scaler_service(owner: Fronted) -> Manifest:
    """The frontend's KEDA scaler endpoint: cluster-internal, apart from the client-facing
    Service (which may be a LoadBalancer)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner, scaler_service_name(owner), "frontend"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(owner, "frontend"),
            "ports": [{"name": "scaler", "port": SCALER_PORT, "targetPort": "scaler"}],
        },
    }
