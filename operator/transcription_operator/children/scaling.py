"""Autoscaling with KEDA: a ScaledObject per autoscaled pool, pushed by the frontend's
external scaler through its own Service."""

from __future__ import annotations

from transcription_api.frontend import SCALER_PORT
from transcription_api.units import duration_seconds
from transcription_api.v1alpha1 import TranscriptionDeployment

from ..config import OperatorConfig
from ..names import pool_object_name, scaler_service_name, selector
from ..plan import Plan, PlannedPool
from .meta import Manifest, object_meta


def autoscaled(the_plan: Plan) -> bool:
    return any(p.spec.autoscaling for p in the_plan.pools)


def scaled_object(td: TranscriptionDeployment, pool: PlannedPool, cfg: OperatorConfig) -> Manifest:
    """KEDA scales the pool's Deployment on the work the frontend reports for it (its audio
    queued and in flight, in seconds of one replica's decoding), through KEDA's external-push
    scaler protocol: the frontend pushes "active" the moment a request waits for a pool at
    zero."""
    a = pool.spec.autoscaling
    assert a is not None
    delay = duration_seconds(a.scale_down_delay)
    scaler = f"{scaler_service_name(td)}.{td.namespace}.svc.{cfg.cluster_domain}:{SCALER_PORT}"
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
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": delay}}
                }
            },
            "triggers": [audio_trigger(pool, scaler, pool.name)],
        },
    }


def audio_trigger(pool: PlannedPool, scaler: str, name: str) -> Manifest:
    """The external-push trigger that asks the frontend whose scaler is at `scaler`
    (host:port) for the work of the pool it routes to as `name`. Its value is in seconds of
    one replica's decoding and its target `targetQueueSeconds` per replica, so triggers of
    several frontends add up (KEDA's scalingModifiers, `targetQueueSeconds` as their
    target)."""
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


def scaler_service(td: TranscriptionDeployment) -> Manifest:
    """The frontend's KEDA scaler endpoint: cluster-internal, apart from the client-facing
    Service (which may be a LoadBalancer)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(td, scaler_service_name(td), "frontend"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(td, "frontend"),
            "ports": [{"name": "scaler", "port": SCALER_PORT, "targetPort": "scaler"}],
        },
    }
