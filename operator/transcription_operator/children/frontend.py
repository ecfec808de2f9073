"""The frontend's Deployment and Service, and the URL clients reach it at: one builder for a
deployment's own frontend and a gateway's (`Fronted`: what both kinds have)."""

from __future__ import annotations

from typing import Any

from transcription_api.frontend import (
    FRONTEND_PORT,
    INTERNAL_PORT,
    SCALER_PORT,
    SETTINGS_ENV,
    Discovery,
    FrontendSettings,
)
from transcription_api.routes import ROUTES_KEY
from transcription_api.telemetry import telemetry_env

from ..config import FRONTEND_IMAGE, OperatorConfig
from ..names import frontend_name, frontend_service_name, routes_name, selector
from .meta import Fronted, Manifest, object_meta
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


def endpoint_url(owner: Fronted, cfg: OperatorConfig) -> str:
    svc = owner.spec.frontend.service
    port = "" if svc.port == 80 else f":{svc.port}"
    return (
        f"http://{frontend_service_name(owner)}.{owner.namespace}.svc.{cfg.cluster_domain}{port}/v1"
    )


def frontend_settings(owner: Fronted, scaler: bool = False) -> FrontendSettings:
    """The frontend's settings: spec.frontend's, and the pod's wiring. `scaler`: KEDA asks
    the replicas for the load, and each answers with that of all of them, learnt from its
    peers (the pods behind the client-facing Service). Tenants need the peers too: each
    replica enforces its share of their quotas, quota / the replicas it knows."""
    fe = owner.spec.frontend
    keys = fe.api_key_secret
    return FrontendSettings(
        port=FRONTEND_PORT,
        scaler_port=SCALER_PORT,
        internal_port=INTERNAL_PORT,
        discovery=Discovery.KUBERNETES,
        peers_service=frontend_service_name(owner) if scaler or fe.tenants else None,
        api_keys_path=f"{API_KEYS_MOUNT}/{keys.key}" if keys else None,
        max_audio_seconds=fe.max_audio_seconds,
        limits=fe.limits,
        chunking=fe.chunking,
        tenants=fe.tenants,
    )


def frontend_deployment(owner: Fronted, cfg: OperatorConfig, scaler: bool = False) -> Manifest:
    fe = owner.spec.frontend
    ports = [{"name": "http", "containerPort": FRONTEND_PORT, "protocol": "TCP"}]
    if scaler:
        ports.append({"name": "scaler", "containerPort": SCALER_PORT, "protocol": "TCP"})
        ports.append({"name": "internal", "containerPort": INTERNAL_PORT, "protocol": "TCP"})
    volumes: list[Any] = [
        {"name": "routes", "configMap": {"name": routes_name(owner)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[Any] = [
        {"name": "routes", "mountPath": ROUTES_MOUNT, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if fe.api_key_secret:
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
    settings = frontend_settings(owner, scaler)
    # The pod's identity: its Warning Events name it (the frontend's events).
    identity = [
        {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{field}"}}}
        for env, field in (("POD_NAMESPACE", "namespace"), ("POD_NAME", "name"), ("POD_UID", "uid"))
    ]
    # spec.tracing, in OpenTelemetry's own variables; $(POD_NAME): the variable before it
    resource = {"k8s.deployment.name": frontend_name(owner), "k8s.pod.name": "$(POD_NAME)"}
    traced = tracing_env(owner, frontend_name(owner), resource)
    container = {
        "name": "frontend",
        "image": image_for(owner, cfg, FRONTEND_IMAGE),
        "imagePullPolicy": owner.spec.images.pull_policy or cfg.pull_policy,
        "args": ["--routes", f"{ROUTES_MOUNT}/{ROUTES_KEY}"],
        # Telemetry off; the frontend never downloads weights: no request to the hub at all.
        "env": [
            {"name": SETTINGS_ENV, "value": settings.to_env()},
            *identity,
            *traced,
            *telemetry_env(offline=True),
        ],
        "ports": ports,
        "resources": resource_requirements(fe.resources),
        "volumeMounts": mounts,
        # Every second until it answers, then readiness at once (the kubelet probes it the
        # moment the startup probe passes) and every 5 s.
        "startupProbe": probe("/health", 1, 120),
        "readinessProbe": probe("/ready", 5, 2),
        "livenessProbe": probe("/health", 10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": {**RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        **pod_common(owner),
        "serviceAccountName": frontend_name(owner),
        "automountServiceAccountToken": True,
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        # preStop (5 s: endpoints drop it first) + the frontend's own drain on SIGTERM (up
        # to 5 s: kept-alive connections end after an answer; then the settings'
        # shutdown_grace_seconds, 30: requests in flight and held finish), with room to spare.
        "terminationGracePeriodSeconds": 45,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner, frontend_name(owner), "frontend"),
        "spec": {
            "replicas": fe.replicas,
            "progressDeadlineSeconds": fe.progress_deadline_seconds,
            "selector": {"matchLabels": selector(owner, "frontend")},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": pod_meta(owner, "frontend", None), "spec": pod_spec},
        },
    }


def frontend_service(owner: Fronted) -> Manifest:
    svc = owner.spec.frontend.service
    meta = object_meta(owner, frontend_service_name(owner), "frontend")
    if svc.annotations:
        meta["annotations"] = dict(svc.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": svc.type.value,
            "selector": selector(owner, "frontend"),
            "ports": [{"name": "http", "port": svc.port, "targetPort": "http"}],
        },
    }
