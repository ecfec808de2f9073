"""Desired state: `build(resource) -> manifests`, a pure function.

Every child carries an owner reference to the resource (so garbage collection removes it
with the resource) and the `app.kubernetes.io/*` labels (`names.py`); the operator applies
the list with server-side apply and deletes owned children that are no longer in it. The
kinds of child are registered in `kinds.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from transcription_api.capabilities import Engine
from transcription_api.engines import Asked, Image
from transcription_api.routes import ROUTES_KEY, PoolRoute, RouteTable, is_english_only
from transcription_api.v1alpha1 import (
    API_VERSION,
    KIND,
    ChunkingSpec,
    FrontendLimits,
    FrontendSpec,
    ResourcesSpec,
    TranscriptionDeployment,
    WeightsSource,
    duration_seconds,
)
from transcription_api.worker import CACHE_DIR, WEIGHTS_DIR, WORKER_PORT, WorkerSettings

from .config import FRONTEND_IMAGE, OperatorConfig
from .names import (
    COMPONENT_LABEL,
    ENGINE_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    PART_OF,
    frontend_name,
    frontend_service_name,
    labels,
    network_policy_name,
    pool_object_name,
    routes_name,
    scaler_service_name,
    selector,
)
from .plan import Plan, PlannedPool, plan

Manifest = dict[str, Any]

FRONTEND_PORT = 8080
SCALER_PORT = 9090  # the frontend's KEDA external scaler (gRPC)
INTERNAL_PORT = 9091  # the frontend's /internal/load, for its peers (off the public port)
ROUTES_MOUNT = "/etc/transcription"
API_KEYS_MOUNT = "/etc/transcription/api-keys"


def endpoint_url(td: TranscriptionDeployment, cfg: OperatorConfig) -> str:
    svc = td.spec.frontend.service
    port = "" if svc.port == 80 else f":{svc.port}"
    return f"http://{frontend_service_name(td)}.{td.namespace}.svc.{cfg.cluster_domain}{port}/v1"


def owner_reference(td: TranscriptionDeployment) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": td.name,
        "uid": td.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(
    td: TranscriptionDeployment, name: str, component: str, pool: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": td.namespace,
        "labels": labels(td, component, pool),
        "ownerReferences": [owner_reference(td)],
    }


# --------------------------------------------------------------------------- pods


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
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# Loading weights can take many minutes: the startup probe allows 30 of them, and the
# Deployment's default progress deadline (spec.pools[].progressDeadlineSeconds, after which
# status reports the rollout as stuck) more.
STARTUP_PERIOD, STARTUP_FAILURES = 10, 180


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


def _pod_meta(td: TranscriptionDeployment, component: str, pool: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {**td.spec.pod.labels, **labels(td, component, pool)}}
    if td.spec.pod.annotations:
        meta["annotations"] = dict(td.spec.pod.annotations)
    return meta


def _pod_common(td: TranscriptionDeployment) -> dict[str, Any]:
    spec: dict[str, Any] = {"securityContext": RESTRICTED_POD_SECURITY}
    if td.spec.pod.priority_class_name:
        spec["priorityClassName"] = td.spec.pod.priority_class_name
    if td.spec.images.pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in td.spec.images.pull_secrets]
    return spec


def image_for(td: TranscriptionDeployment, cfg: OperatorConfig, image: Image) -> str:
    """The resource's override (`spec.images.<key>`), else the operator's default."""
    override: str | None = getattr(td.spec.images, image.field)
    return override or cfg.images[image.key]


def worker_image(td: TranscriptionDeployment, cfg: OperatorConfig, pool: PlannedPool) -> str:
    """The engine's image for the pool's device: pools with GPUs get its GPU image (for
    faster-whisper, the CUDA one: the CPU image has no CUDA libraries)."""
    return image_for(td, cfg, pool.profile.image(pool.spec.resources.gpus))


QUANTITY_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                     "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
MAX_THREADS = 256


def quantity(text: str) -> float:
    """A Kubernetes quantity's value ("500m" -> 0.5, "2Gi" -> 2147483648)."""
    number = text.rstrip("kKMGTim")
    return float(number) * QUANTITY_SUFFIXES.get(text[len(number) :], 1)


def cpu_threads(cpu: str | None) -> int:
    """A CPU quantity rounded up to whole threads ("500m" -> 1, "2" -> 2); 0 when unset."""
    if not cpu:
        return 0
    return min(MAX_THREADS, max(1, math.ceil(quantity(cpu))))


def worker_settings(td: TranscriptionDeployment, pool: PlannedPool) -> WorkerSettings:
    m = td.spec.model
    p = pool.spec
    if m.source == WeightsSource.PVC:
        model = f"{WEIGHTS_DIR}/{(m.path or '').strip('/')}"
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


def traces_url(td: TranscriptionDeployment) -> str | None:
    """Where spans go (OTLP/HTTP: the collector's /v1/traces), or None: tracing is off."""
    endpoint = td.spec.tracing.endpoint
    return None if endpoint is None else endpoint.rstrip("/") + "/v1/traces"


def tracing_env(
    td: TranscriptionDeployment, service: str, resource: dict[str, str],
    taken: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """OpenTelemetry's standard variables for spec.tracing, none when it is off: the
    frontend reads them (transcription_frontend/tracing.py), and vLLM's OpenTelemetry SDK
    (its exporter: OTLP/HTTP, not its default gRPC; its sampler; the resource). A variable
    the pool's own `env` sets is left to it."""
    t = td.spec.tracing
    if t.endpoint is None:
        return []
    attributes = {"k8s.namespace.name": td.namespace, **resource}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": t.endpoint.rstrip("/"),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service,
        "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in attributes.items()),
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": f"{t.sampling_ratio:g}",
    }
    names = {e["name"] for e in taken}
    return [{"name": k, "value": v} for k, v in env.items() if k not in names]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


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
    if shm := pool.profile.shared_memory:
        # The engine's worker processes exchange tensors through shared memory.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def worker_deployment(
    td: TranscriptionDeployment, pool: PlannedPool, cfg: OperatorConfig
) -> Manifest:
    p = pool.spec
    env: list[dict[str, Any]] = [
        {"name": "TRANSCRIPTION_WORKER_SETTINGS", "value": worker_settings(td, pool).to_env()},
        {"name": "HF_HOME", "value": CACHE_DIR},
        {"name": "HOME", "value": "/tmp"},
    ]
    if td.spec.model.hub_token_secret:
        ref = td.spec.model.hub_token_secret
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    own = [e.model_dump(by_alias=True, exclude_none=True) for e in p.env]
    if pool.engine == Engine.VLLM:  # vLLM traces (--otlp-traces-endpoint, worker_settings)
        name = pool_object_name(td, pool.name)
        env += tracing_env(td, name, {"k8s.deployment.name": name, "transcription.pool": pool.name,
                                      "transcription.engine": pool.engine.value}, own)  # fmt: skip
    env += own
    volumes, mounts = _worker_volumes(td, pool)
    container: dict[str, Any] = {
        "name": "engine",
        "image": worker_image(td, cfg, pool),
        "imagePullPolicy": td.spec.images.pull_policy or cfg.pull_policy,
        "ports": [{"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": resource_requirements(p.resources),
        "volumeMounts": mounts,
        "startupProbe": _probe("/health", STARTUP_PERIOD, STARTUP_FAILURES),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 15, 4),
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
        **_pod_common(td),
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
    worker_pod_meta = _pod_meta(td, "worker", pool.name)
    # The pods' engine, for the monitors' `engine` label (not in the selector: immutable).
    worker_pod_meta["labels"][ENGINE_LABEL] = pool.engine.value
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(td, pool_object_name(td, pool.name), "worker", pool.name),
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
        "metadata": _meta(td, pool_object_name(td, pool.name), "worker", pool.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(td, "worker", pool.name),
            "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}],
        },
    }


def scaled_object(td: TranscriptionDeployment, pool: PlannedPool, cfg: OperatorConfig) -> Manifest:
    """KEDA scales the pool's Deployment on the load the frontend reports for it (requests in
    flight plus held), through KEDA's external-push scaler protocol: the frontend pushes
    "active" the moment a request waits for a pool at zero."""
    a = pool.spec.autoscaling
    assert a is not None
    delay = duration_seconds(a.scale_down_delay)
    target = a.target or pool.capabilities.scale_target
    scaler = f"{scaler_service_name(td)}.{td.namespace}.svc.{cfg.cluster_domain}:{SCALER_PORT}"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(td, pool_object_name(td, pool.name), "worker", pool.name),
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
            "triggers": [
                {
                    "type": "external-push",
                    "metadata": {
                        "scalerAddress": scaler,
                        "pool": pool.name,
                        "target": f"{target:g}",
                    },
                }
            ],
        },
    }


def scaler_service(td: TranscriptionDeployment) -> Manifest:
    """The frontend's KEDA scaler endpoint: cluster-internal, apart from the client-facing
    Service (which may be a LoadBalancer)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(td, scaler_service_name(td), "frontend"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(td, "frontend"),
            "ports": [{"name": "scaler", "port": SCALER_PORT, "targetPort": "scaler"}],
        },
    }


def pod_disruption_budget(
    td: TranscriptionDeployment, name: str, component: str, pool: str | None
) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(td, name, component, pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(td, component, pool)}},
    }


def worker_network_policy(td: TranscriptionDeployment) -> Manifest:
    """Only this deployment's frontend (and metrics scrapers) may reach its workers."""
    port = [{"protocol": "TCP", "port": WORKER_PORT}]
    frontend_peer = {"podSelector": {"matchLabels": selector(td, "frontend")}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(td, network_policy_name(td), "worker"),
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
        "metadata": _meta(td, f"{frontend_name(td)}-internal", "frontend"),
        "spec": {
            "podSelector": {"matchLabels": selector(td, "frontend")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": FRONTEND_PORT}]},
                {"from": [*peers, *td.spec.network_policy.scaler_from], "ports": internal},
            ],
        },
    }


# --------------------------------------------------------------------------- frontend


def route_table(td: TranscriptionDeployment, the_plan: Plan) -> RouteTable:
    return RouteTable(
        model=td.spec.model.name,
        aliases=td.spec.model.aliases,
        namespace=td.namespace,
        max_upload_bytes=td.spec.frontend.max_upload_bytes,
        pools=[
            PoolRoute(
                name=p.name,
                engine=p.engine,
                mode=p.mode,
                service=pool_object_name(td, p.name),
                port=WORKER_PORT,
                automatic=p.automatic,
                family=p.family,
                english_only=is_english_only(td.spec.model.name, td.spec.model.path),
                worker_model=None if p.profile.aliases else worker_settings(td, p).model_reference,
                transcription_prompt=td.spec.model.transcription_prompt
                if p.serving.asked == Asked.CHAT
                else None,
            )
            for p in the_plan.pools
        ],
    )


def routes_configmap(td: TranscriptionDeployment, table: RouteTable) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(td, routes_name(td), "routes"),
        "data": {ROUTES_KEY: table.dumps()},
    }


def frontend_rbac(td: TranscriptionDeployment) -> list[Manifest]:
    name = frontend_name(td)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(td, name, "frontend"),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(td, name, "frontend"),
            "rules": [
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [routes_name(td)],
                    "verbs": ["get", "list", "watch"],
                },
                # Warning Events about its own pod: why it is not ready (an API key file
                # without a key), which the operator names in the resource's status.
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(td, name, "frontend"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": td.namespace}],
        },
    ]


def autoscaled(the_plan: Plan) -> bool:
    return any(p.spec.autoscaling for p in the_plan.pools)


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
        "readinessProbe": _probe("/ready", 5, 2),
        "livenessProbe": _probe("/health", 10, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "securityContext": {**RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        **_pod_common(td),
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
        "metadata": _meta(td, frontend_name(td), "frontend"),
        "spec": {
            "replicas": fe.replicas,
            "progressDeadlineSeconds": fe.progress_deadline_seconds,
            "selector": {"matchLabels": selector(td, "frontend")},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {"metadata": _pod_meta(td, "frontend", None), "spec": pod_spec},
        },
    }


def frontend_service(td: TranscriptionDeployment) -> Manifest:
    svc = td.spec.frontend.service
    meta = _meta(td, frontend_service_name(td), "frontend")
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


# --------------------------------------------------------------------------- all


def build(
    td: TranscriptionDeployment, cfg: OperatorConfig, the_plan: Plan | None = None
) -> list[Manifest]:
    """Every child the resource should have, in apply order."""
    the_plan = the_plan or plan(td.spec)
    out: list[Manifest] = [*frontend_rbac(td), routes_configmap(td, route_table(td, the_plan))]
    for pool in the_plan.pools:
        out.append(worker_service(td, pool))
    out.append(frontend_service(td))
    if autoscaled(the_plan):
        out.append(scaler_service(td))
    for pool in the_plan.pools:
        out.append(worker_deployment(td, pool, cfg))
    out.append(frontend_deployment(td, cfg, scaler=autoscaled(the_plan)))
    for pool in the_plan.pools:
        if pool.spec.autoscaling:
            out.append(scaled_object(td, pool, cfg))
    for pool in the_plan.pools:
        a = pool.spec.autoscaling
        if (a.max_replicas if a else pool.spec.replicas) > 1:
            out.append(
                pod_disruption_budget(td, pool_object_name(td, pool.name), "worker", pool.name)
            )
    if td.spec.frontend.replicas > 1:
        out.append(pod_disruption_budget(td, frontend_name(td), "frontend", None))
    if td.spec.network_policy.enabled:
        out.append(worker_network_policy(td))
        out.append(frontend_network_policy(td))
    if td.spec.monitoring.pod_monitor:
        out.append(pod_monitor(td))
    return out


def pod_monitor(td: TranscriptionDeployment) -> Manifest:
    """prometheus-operator's PodMonitor of the resource's frontend and worker pods, with the
    relabelling of the chart's monitors (templates/monitors.yaml): `deployment`, `pool` and
    `engine` from the pods' labels, `job` transcription-frontend or transcription-worker."""
    m = td.spec.monitoring
    meta = _meta(td, f"{td.name}-metrics", "metrics")
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
