"""One Deployment and one Service per pool, and the `WorkerSettings` its engine starts from."""

from __future__ import annotations

from typing import Any

from transcription_api.capabilities import Engine
from transcription_api.telemetry import telemetry_env
from transcription_api.units import cpu_threads
from transcription_api.v1alpha1 import TranscriptionDeployment, WeightsSource
from transcription_api.worker import CACHE_DIR, WEIGHTS_DIR, WORKER_PORT, WorkerSettings

from ..config import SPEAKER_MODEL_FILE, OperatorConfig
from ..names import ENGINE_LABEL, pool_object_name, selector
from ..plan import PlannedPool
from .meta import Manifest, object_meta
from .pods import (
    RESTRICTED_CONTAINER_SECURITY,
    image_for,
    pod_common,
    pod_meta,
    probe,
    resource_requirements,
)
from .tracing import traces_url, tracing_env

SPEAKERS_DIR = "/speakers"  # where a pool that runs the speaker stage mounts its model
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


# Loading weights can take many minutes: the startup probe allows 30 of them, and the
# Deployment's default progress deadline (spec.pools[].progressDeadlineSeconds, after which
# status reports the rollout as stuck) more. It asks every second: the kubelet probes
# readiness the moment it passes, so a worker serves within a second of answering (every
# 10 s, a faster-whisper worker answering 1.8 s after its pod was created was Ready at 11 s:
# on every scale-up, rollout and wake from zero).
STARTUP_PERIOD, STARTUP_FAILURES = 1, 1800


def worker_image(td: TranscriptionDeployment, cfg: OperatorConfig, pool: PlannedPool) -> str:
    """The engine's image for the pool's device: pools with GPUs get its GPU image (for
    faster-whisper, the CUDA one: the CPU image has no CUDA libraries)."""
    return image_for(td, cfg, pool.profile.image(pool.spec.resources.gpus))


def worker_settings(td: TranscriptionDeployment, pool: PlannedPool) -> WorkerSettings:
    m = td.spec.model
    p = pool.spec
    if m.source in (WeightsSource.PVC, WeightsSource.OCI):
        model = f"{WEIGHTS_DIR}/{(m.path or '').strip('/')}".rstrip("/")
    elif m.source == WeightsSource.IMAGE:
        model = m.path or m.name
    else:
        model = m.name
    decoding: dict[str, Any] = {}
    if pool.profile.decoding_settings:
        decoding = {
            "beam_size": p.beam_size,
            "vad_filter": p.vad_filter,
            "threads": p.threads or cpu_threads(p.resources.cpu),
            "max_batch_size": p.max_batch_size,
            "compute_type": "float16" if p.resources.gpus else "int8",
        }
    elif pool.engine == Engine.VLLM and not p.resources.gpus:  # vLLM's CPU build
        decoding = {"threads": p.threads or cpu_threads(p.resources.cpu)}
    return WorkerSettings(
        engine=pool.engine,
        mode=pool.mode,
        model=model,
        served_names=m.served_names,
        revision=m.revision,
        family=m.family,
        gpus=p.resources.gpus,
        gpu_memory_utilization=p.gpu_memory_utilization,
        max_model_len=p.max_model_len,
        max_queue=p.max_queue,
        extra_args=p.engine_args,
        otlp_traces_endpoint=traces_url(td) if pool.engine == Engine.VLLM else None,
        **decoding,
    )


def _worker_volumes(td: TranscriptionDeployment, pool: PlannedPool) -> tuple[list[Any], list[Any]]:
    m = td.spec.model
    cache: dict[str, Any]
    if m.cache.claim_name:
        cache = {"persistentVolumeClaim": {"claimName": m.cache.claim_name}}
    else:
        cache = {"emptyDir": {"sizeLimit": m.cache.size_limit}}
    volumes: list[Any] = [{"name": "model-cache", **cache}, {"name": "tmp", "emptyDir": {}}]
    mounts: list[Any] = [
        {"name": "model-cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if m.source == WeightsSource.PVC:
        volumes.append(
            {
                "name": "weights",
                "persistentVolumeClaim": {"claimName": m.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "weights", "mountPath": WEIGHTS_DIR, "readOnly": True})
    elif m.source == WeightsSource.OCI:
        # An image volume: the kubelet pulls the image (or artifact) like a container's and
        # mounts its file system read-only; every pool of the deployment mounts the same one.
        volumes.append({"name": "weights", "image": {"reference": m.image}})
        mounts.append({"name": "weights", "mountPath": WEIGHTS_DIR, "readOnly": True})
    if shm := pool.profile.shared_memory:
        # The engine's worker processes exchange tensors through shared memory.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def worker_deployment(
    td: TranscriptionDeployment, pool: PlannedPool, cfg: OperatorConfig
) -> Manifest:
    p = pool.spec
    own = [e.model_dump(by_alias=True, exclude_none=True) for e in p.env]
    taken = {e["name"] for e in own}
    # Telemetry off; no request to the hub at all unless the weights come from it. A
    # variable the pool's own `env` sets is left to it.
    quiet = telemetry_env(offline=td.spec.model.source != WeightsSource.HUB)
    env: list[dict[str, Any]] = [
        {"name": "TRANSCRIPTION_WORKER_SETTINGS", "value": worker_settings(td, pool).to_env()},
        {"name": "HF_HOME", "value": CACHE_DIR},
        {"name": "HOME", "value": "/tmp"},
        *(e for e in quiet if e["name"] not in taken),
    ]
    if td.spec.model.hub_token_secret:
        ref = td.spec.model.hub_token_secret
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    if pool.engine == Engine.VLLM:  # vLLM traces (--otlp-traces-endpoint, worker_settings)
        name = pool_object_name(td, pool.name)
        env += tracing_env(td, name, {"k8s.deployment.name": name, "transcription.pool": pool.name,
                                      "transcription.engine": pool.engine.value}, own)  # fmt: skip
    if pool.speakers:  # the speaker stage's model, from its image (speaker_volume)
        env.append({"name": "SPEAKER_MODEL", "value": f"{SPEAKERS_DIR}/{SPEAKER_MODEL_FILE}"})
    env += own
    volumes, mounts = _worker_volumes(td, pool)
    if pool.speakers:
        volumes.append({"name": "speakers", "image": {"reference": cfg.speaker_model}})
        mounts.append({"name": "speakers", "mountPath": SPEAKERS_DIR, "readOnly": True})
    container: dict[str, Any] = {
        "name": "engine",
        "image": worker_image(td, cfg, pool),
        "imagePullPolicy": td.spec.images.pull_policy or cfg.pull_policy,
        "ports": [{"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": resource_requirements(p.resources),
        "volumeMounts": mounts,
        "startupProbe": probe("/health", STARTUP_PERIOD, STARTUP_FAILURES),
        "readinessProbe": probe("/health", 5, 3),
        "livenessProbe": probe("/health", 15, 4),
        # Give endpoint controllers time to take the pod out of rotation before it stops.
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
        # A crash's last log lines become the termination message status reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    tolerations = list(p.tolerations)
    if p.resources.gpus and GPU_TOLERATION not in tolerations:
        tolerations.append(GPU_TOLERATION)
    pod_spec: dict[str, Any] = {
        **pod_common(td),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 60,
        "enableServiceLinks": False,
    }
    if td.spec.pod.service_account_name:
        pod_spec["serviceAccountName"] = td.spec.pod.service_account_name
    else:
        pod_spec["automountServiceAccountToken"] = False
    if p.node_selector:
        pod_spec["nodeSelector"] = dict(p.node_selector)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if p.affinity:
        pod_spec["affinity"] = p.affinity
    worker_pod_meta = pod_meta(td, "worker", pool.name)
    # The pods' engine, for the monitors' `engine` label (not in the selector: immutable).
    worker_pod_meta["labels"][ENGINE_LABEL] = pool.engine.value
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(td, pool_object_name(td, pool.name), "worker", pool.name),
        "spec": {
            # An autoscaled pool's replicas belong to its autoscaler (KEDA's HPA): never set.
            **({} if p.autoscaling else {"replicas": p.replicas}),
            "progressDeadlineSeconds": p.progress_deadline_seconds,
            "selector": {"matchLabels": selector(td, "worker", pool.name)},
            # Never drop below the desired capacity during a rollout.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": worker_pod_meta, "spec": pod_spec},
        },
    }


def worker_service(td: TranscriptionDeployment, pool: PlannedPool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(td, pool_object_name(td, pool.name), "worker", pool.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(td, "worker", pool.name),
            "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}],
        },
    }
