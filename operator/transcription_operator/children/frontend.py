"""The frontend's Deployment and Service, and the URL clients reach it at."""

from __future__ import annotations

from typing import Any

from transcription_api.frontend import (
    FRONTEND_PORT,
    INTERNAL_PORT,
    SCALER_PORT,
    ChunkingSpec,
    FrontendLimits,
)
from transcription_api.routes import ROUTES_KEY
from transcription_api.v1alpha1 import FrontendSpec, TranscriptionDeployment

from ..config import FRONTEND_IMAGE, OperatorConfig
from ..names import frontend_name, frontend_service_name, routes_name, selector
from .meta import Manifest, object_meta
from .pods import (
    RESTRICTED_CONTAINER_SECURITY,
    image_for,
    pod_common,
    pod_meta,
    probe,
    resource_requirements,
)
from .tracing import tracing_env

ROUTES_MOUNT = "/etc/transcription"


API_KEYS_MOUNT = "/etc/transcription/api-keys"


def endpoint_url(td: TranscriptionDeployment, cfg: OperatorConfig) -> str:
    svc = td.spec.frontend.service
    port = "" if svc.port == 80 else f":{svc.port}"
    return f"http://{frontend_service_name(td)}.{td.namespace}.svc.{cfg.cluster_domain}{port}/v1"


LIMIT_FLAGS = {  # spec.frontend.limits -> the frontend's flags (transcription_frontend/limits.py)
    "max_header_bytes": "--max-header-bytes",
    "max_headers": "--max-headers",
    "header_timeout_seconds": "--header-timeout",
    "body_timeout_seconds": "--body-timeout",
    "body_min_bytes_per_second": "--body-min-rate",
    "idle_timeout_seconds": "--idle-timeout",
    "max_body_bytes": "--max-body-bytes",
    "max_concurrency": "--max-concurrency",
    "max_connections": "--max-connections",
    "max_realtime_sessions": "--max-realtime-sessions",
    "realtime_session_seconds": "--realtime-session-seconds",
    "realtime_idle_timeout_seconds": "--realtime-idle-timeout",
    "realtime_max_append_bytes": "--realtime-max-append-bytes",
}


def chunking_args(fe: FrontendSpec) -> list[str]:
    """The frontend's long-audio flags, for settings away from their defaults."""
    c, d = fe.chunking, ChunkingSpec()
    args = ["--no-chunking"] if not c.enabled else []
    for value, default, flag in (
        (c.threshold_seconds, d.threshold_seconds, "--chunk-threshold"),
        (c.max_chunk_seconds, d.max_chunk_seconds, "--max-chunk-seconds"),
        (c.max_parallel_chunks, d.max_parallel_chunks, "--max-parallel-chunks"),
    ):
        if value != default:
            args += [flag, f"{value:g}"]
    if c.previous_text:
        args.append("--chunk-previous-text")
    if fe.max_audio_seconds is not None:
        args += ["--max-audio-seconds", f"{fe.max_audio_seconds:g}"]
    return args


def limit_args(limits: FrontendLimits) -> list[str]:
    """The flags of the limits set away from their defaults (the frontend's defaults are
    the resource's: an unchanged resource keeps its frontend's command line)."""
    args = []
    for name, value in limits.model_dump(exclude_defaults=True).items():
        if value is not None:
            args += [LIMIT_FLAGS[name], f"{value:g}" if isinstance(value, float) else str(value)]
    return args


def frontend_deployment(
    td: TranscriptionDeployment, cfg: OperatorConfig, scaler: bool = False
) -> Manifest:
    fe = td.spec.frontend
    args = [
        "--routes",
        f"{ROUTES_MOUNT}/{ROUTES_KEY}",
        "--port",
        str(FRONTEND_PORT),
        "--discovery",
        "kubernetes",
    ]
    ports = [{"name": "http", "containerPort": FRONTEND_PORT, "protocol": "TCP"}]
    if scaler:
        # KEDA's scaler endpoint; each replica answers with the load of all of them, which
        # it learns from its peers (the pods behind the client-facing Service).
        args += ["--scaler-port", str(SCALER_PORT), "--peers-service", frontend_service_name(td),
                 "--internal-port", str(INTERNAL_PORT)]  # fmt: skip
        ports.append({"name": "scaler", "containerPort": SCALER_PORT, "protocol": "TCP"})
        ports.append({"name": "internal", "containerPort": INTERNAL_PORT, "protocol": "TCP"})
    volumes: list[Any] = [
        {"name": "routes", "configMap": {"name": routes_name(td)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[Any] = [
        {"name": "routes", "mountPath": ROUTES_MOUNT, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    args += limit_args(fe.limits)
    args += chunking_args(fe)
    if fe.api_key_secret:
        args += ["--api-keys", f"{API_KEYS_MOUNT}/{fe.api_key_secret.key}"]
        volumes.append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": fe.api_key_secret.name,
                    "items": [{"key": fe.api_key_secret.key, "path": fe.api_key_secret.key}],
                },
            }
        )
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_MOUNT, "readOnly": True})
    # spec.tracing (transcription_frontend/tracing.py); $(POD_NAME): the variable before it
    resource = {"k8s.deployment.name": frontend_name(td), "k8s.pod.name": "$(POD_NAME)"}
    traced = tracing_env(td, frontend_name(td), resource)
    container = {
        "name": "frontend",
        "image": image_for(td, cfg, FRONTEND_IMAGE),
        "imagePullPolicy": td.spec.images.pull_policy or cfg.pull_policy,
        "args": args,
        # The pod's identity: its Warning Events name it (transcription_frontend/events.py).
        "env": [
            {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{field}"}}}
            for env, field in (
                ("POD_NAMESPACE", "namespace"),
                ("POD_NAME", "name"),
                ("POD_UID", "uid"),
            )
        ]
        + traced,
        "ports": ports,
        "resources": resource_requirements(fe.resources),
        "volumeMounts": mounts,
        "readinessProbe": probe("/ready", 5, 2),
        "livenessProbe": probe("/health", 10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": {**RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        **pod_common(td),
        "serviceAccountName": frontend_name(td),
        "automountServiceAccountToken": True,
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        # preStop (5 s: endpoints drop it first) + the frontend's own drain on SIGTERM (up
        # to 5 s: kept-alive connections end after an answer; then --shutdown-grace, 30 s:
        # requests in flight and held finish), with room to spare.
        "terminationGracePeriodSeconds": 45,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(td, frontend_name(td), "frontend"),
        "spec": {
            "replicas": fe.replicas,
            "progressDeadlineSeconds": fe.progress_deadline_seconds,
            "selector": {"matchLabels": selector(td, "frontend")},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": pod_meta(td, "frontend", None), "spec": pod_spec},
        },
    }


def frontend_service(td: TranscriptionDeployment) -> Manifest:
    svc = td.spec.frontend.service
    meta = object_meta(td, frontend_service_name(td), "frontend")
    if svc.annotations:
        meta["annotations"] = dict(svc.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": svc.type.value,
            "selector": selector(td, "frontend"),
            "ports": [{"name": "http", "port": svc.port, "targetPort": "http"}],
        },
    }
