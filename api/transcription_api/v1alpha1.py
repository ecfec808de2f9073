"""`transcription.dev/v1alpha1` `TranscriptionDeployment`: spec and status.

These pydantic models are the single source of the CRD schema (`crds/` is generated from
them by `transcription_api.crd`). Every field carries a description; defaults, enums and
bounds here become the OpenAPI schema the API server enforces. Cross-field rules are
written twice on purpose: as CEL (so the API server rejects bad objects at admission)
and as the Python validator below (so the operator can trust the objects it reads);
tests check that both agree.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .capabilities import MAX_UPLOAD, Capability, Engine, Mode, ModelFamily
from .engines import capability_set, family_engines, supported_modes
from .worker import MANAGED_FLAGS, managed_flag, managed_flag_message

GROUP = "transcription.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TranscriptionDeployment"
PLURAL = "transcriptiondeployments"
SINGULAR = "transcriptiondeployment"
SHORT_NAMES = ["tdeploy"]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_NAME = 30  # metadata.name; children are named <name>-<pool> and must fit a DNS label
# Names clients send as `model`: hub ids ("openai/whisper-large-v3") and simple aliases.
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
MAX_POOLS = 8
RESERVED_POOL_NAMES = ("frontend", "routes", "scaler")
MAX_ALIASES = 16
MAX_ENGINE_ARGS = 64
# A worker has 30 minutes to load its weights (its startup probe, in the operator's
# children.py); its rollout's default progress deadline leaves 5 more.
WORKER_PROGRESS_DEADLINE = 35 * 60


class _Model(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
    )


def cel(rule: str, message: str, *, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


# Objects that Kubernetes itself defines (affinity, tolerations, env valueFrom): the CRD
# keeps them as opaque objects and the API server validates them when the operator puts
# them into a pod template.
KubeObject = Annotated[
    dict[str, Any],
    Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}),
]


# --------------------------------------------------------------------------- model


class WeightsSource(StrEnum):
    HUB = "hub"
    PVC = "pvc"
    IMAGE = "image"


class SecretKeyRef(_Model):
    """A key in a Secret of the resource's namespace."""

    name: str = Field(description="Name of the Secret.", max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(description="Key within the Secret.", max_length=253, min_length=1)


class CacheSpec(_Model):
    """Where downloaded weights are cached on the worker."""

    size_limit: str = Field(
        default="50Gi",
        description="Size limit of the cache volume (an emptyDir unless claimName is set).",
        pattern=QUANTITY,
    )
    claim_name: str | None = Field(
        default=None,
        description="Use this PersistentVolumeClaim as the cache, shared across restarts.",
        max_length=253,
    )


class ModelSpec(_Model):
    """The model every pool serves, where its weights come from, and its aliases."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.source != 'pvc' || (has(self.claimName) && has(self.path))",
                "model.source 'pvc' needs model.claimName and model.path",
            ),
            cel(
                "self.source != 'image' || has(self.path)",
                "model.source 'image' needs model.path (the weights' directory in the image)",
            ),
            cel(
                "!has(self.aliases) || self.aliases.all(a, self.aliases.exists_one(b, b == a))",
                "model.aliases must be unique",
                field_path=".aliases",
            ),
            cel(
                "!has(self.aliases) || !self.aliases.exists(a, a == self.name)",
                "model.aliases must not repeat model.name",
                field_path=".aliases",
            ),
            cel(
                "!has(self.transcriptionPrompt) || (has(self.family) && self.family == 'audio-lm')",
                "model.transcriptionPrompt applies to family audio-lm only (a Whisper model "
                "transcribes without one)",
                field_path=".transcriptionPrompt",
            ),
        )
    )

    name: str = Field(
        description="Model name clients send as `model`, and the hub id the weights are "
        "fetched from when source is 'hub' (e.g. openai/whisper-large-v3-turbo).",
        max_length=200,
        pattern=MODEL_NAME,
    )
    revision: str | None = Field(
        default=None,
        description="Hub revision (branch, tag or commit) to fetch; default: the hub's main.",
        max_length=100,
    )
    aliases: list[Annotated[str, Field(max_length=200, pattern=MODEL_NAME)]] = Field(
        default_factory=list,
        description="Other names clients may send as `model` (e.g. whisper-1); they "
        "resolve to `name`.",
        max_length=MAX_ALIASES,
    )
    source: WeightsSource = Field(
        default=WeightsSource.HUB,
        description="Where weights come from: 'hub' (downloaded into the cache volume), "
        "'pvc' (a directory on a PersistentVolumeClaim) or 'image' (baked into the worker "
        "image).",
    )
    path: str | None = Field(
        default=None,
        description="Directory of the weights: within the claim for 'pvc', in the image for "
        "'image'.",
        max_length=1024,
    )
    claim_name: str | None = Field(
        default=None,
        description="PersistentVolumeClaim holding the weights (source 'pvc'); mounted read-only.",
        max_length=253,
    )
    hub_token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a hub token for gated or private models (HF_TOKEN).",
    )
    cache: CacheSpec = Field(
        default_factory=CacheSpec, description="The model cache volume of the workers."
    )
    family: ModelFamily = Field(
        default=ModelFamily.WHISPER,
        description="What kind of model it is, which decides what each engine serves with it: "
        "'whisper' (speech-to-text: the audio endpoints) or 'audio-lm' (a chat model that "
        "takes audio input, e.g. Qwen2-Audio or Voxtral: chat completions, and "
        "transcriptions through chat; engine transformers only).",
    )
    transcription_prompt: str | None = Field(
        default=None,
        description="Family audio-lm: the instruction sent with the audio to transcribe it "
        "through chat, e.g. Qwen2-Audio's 'Detect the language and recognize the speech: "
        "<|en|>'. Default: 'Transcribe the speech in this audio verbatim. Answer with the "
        "transcript only.' A request's `language` and `prompt` are added to it.",
        min_length=1,
        max_length=2000,
    )

    @property
    def served_names(self) -> list[str]:
        return [self.name, *self.aliases]


# --------------------------------------------------------------------------- pools


class ResourcesSpec(_Model):
    """Compute resources of one replica."""

    gpus: int = Field(
        default=0,
        ge=0,
        le=16,
        description="NVIDIA GPUs per replica (nvidia.com/gpu). More than one enables tensor "
        "parallelism across them.",
    )
    cpu: str | None = Field(
        default=None,
        description="CPU request. No CPU limit is set: a limit throttles inference in the "
        "middle of a request (CFS quota) while the node has idle cores, which costs latency "
        "and buys nothing; the request alone guarantees the share. Memory has a limit.",
        pattern=QUANTITY,
    )
    memory: str | None = Field(
        default=None, description="Memory request and limit.", pattern=QUANTITY
    )
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        description="Extended resource name of the GPU (e.g. nvidia.com/mig-1g.10gb).",
        max_length=253,
    )


class EnvVar(_Model):
    """An environment variable for the engine container."""

    name: str = Field(description="Variable name.", max_length=253, min_length=1)
    value: str | None = Field(default=None, description="Literal value.")
    value_from: KubeObject | None = Field(
        default=None, description="Source of the value (as in a pod's env[].valueFrom)."
    )


def _managed_flag_rules() -> list[dict[str, str]]:
    """One CEL rule per flag the operator manages, refusing it in engineArgs."""
    return [
        cel(
            "!has(self.engineArgs) || !self.engineArgs.exists(a, "
            f"a.replace('_', '-') == '{flag}' || a.replace('_', '-').startsWith('{flag}='))",
            managed_flag_message(flag),
            field_path=".engineArgs",
        )
        for flag in MANAGED_FLAGS
    ]


DURATION = r"^([0-9]+(s|m|h))+$"


def duration_seconds(value: str) -> int:
    """Seconds of a duration such as '90s', '5m' or '1h30m'."""
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)([smh])", value))


class AutoscalingSpec(_Model):
    """Scaling with demand, by KEDA, on the load the frontend reports for the pool."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.minReplicas <= self.maxReplicas",
                "minReplicas must not exceed maxReplicas",
            )
        )
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas. 0 lets the pool scale to zero when idle; the frontend "
        "holds requests while it wakes.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="Requests in flight plus queued per replica that the autoscaler aims "
        "at. Default: the engine's, by mode (vllm continuous 8; sequential pools 2).",
    )
    scale_down_delay: str = Field(
        default="5m",
        pattern=DURATION,
        max_length=20,
        description="How long load must stay low before replicas are removed, and how long "
        "a pool stays idle before it scales to zero (e.g. 90s, 5m).",
    )


class PoolSpec(_Model):
    """A set of identical workers with one engine and batching mode."""

    model_config = ConfigDict(json_schema_extra=cel_rules(*_managed_flag_rules()))

    name: str = Field(
        description="Pool name; part of the child objects' names.",
        max_length=30,
        pattern=DNS_LABEL,
    )
    engine: Engine | None = Field(
        default=None, description="Engine of this pool; default: spec.engine."
    )
    mode: Mode | None = Field(
        default=None,
        description="'continuous' (the engine batches concurrent requests) or 'sequential' "
        "(one request at a time per replica). Default: continuous where the engine supports "
        "it, else sequential.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Number of worker replicas (ignored when autoscaling is set).",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale with demand between minReplicas and maxReplicas (KEDA must be "
        "installed; status says when it is not).",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Resources of each replica."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the workers must run on."
    )
    tolerations: list[KubeObject] = Field(
        default_factory=list,
        description="Tolerations (as in a pod spec). GPU pools tolerate the nvidia.com/gpu "
        "taint automatically.",
    )
    affinity: KubeObject | None = Field(default=None, description="Affinity (as in a pod spec).")
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of each GPU's memory vLLM may use (vLLM default: 0.9).",
    )
    max_model_len: int | None = Field(
        default=None, gt=0, description="Maximum model length (vLLM); default: the model's."
    )
    max_queue: int = Field(
        default=16,
        ge=0,
        le=10000,
        description="faster-whisper: requests a replica queues beyond those it is decoding, "
        "before answering 503.",
    )
    beam_size: int = Field(
        default=5,
        ge=1,
        le=16,
        description="faster-whisper: beam size of decoding (1: greedy). Requests at "
        "temperature 0 fall back to sampling at rising temperatures when the text looks wrong.",
    )
    vad_filter: bool = Field(
        default=False,
        description="faster-whisper: decode only the speech Silero VAD finds, leaving out "
        "silence and music (fewer hallucinations on sparse audio, for some CPU).",
    )
    threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="faster-whisper, and vLLM on pools without GPUs: CPU threads of a "
        "replica; 0: its CPU request rounded up, or every CPU the container may use.",
    )
    max_batch_size: int = Field(
        default=8,
        ge=1,
        le=256,
        description="faster-whisper: 30 s windows of audio decoded together in one batch "
        "(continuous mode batches concurrent requests; sequential, one long request's).",
    )
    engine_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        description="Extra arguments for the engine, passed through last (e.g. "
        "--max-model-len=448). Flags the operator derives from the spec (--port, "
        "--tensor-parallel-size, --served-model-name, ...) are refused, naming the field to "
        "set instead.",
        max_length=MAX_ENGINE_ARGS,
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="Extra environment for the engine container."
    )
    progress_deadline_seconds: int = Field(
        default=WORKER_PROGRESS_DEADLINE,
        ge=10,
        le=86_400,
        description="Seconds a rollout of the pool may go without progress before status "
        "reports it failed (ProgressDeadlineExceeded, Degraded=True; the old replicas keep "
        "serving). The default is above the 30 minutes a worker has to load its weights.",
    )


class AutoSplitSpec(_Model):
    """The sequential pool the operator adds when no declared pool covers the traffic."""

    enabled: bool = Field(
        default=True,
        description="Add a sequential pool automatically for traffic no pool can serve.",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas of the added pool.")
    resources: ResourcesSpec | None = Field(
        default=None,
        description="Resources of the added pool; default: those of the pool it splits from, "
        "with no more GPUs than its engine can use (one for faster-whisper and transformers). "
        "Status and the SequentialPoolAdded Event say what it requests.",
    )


class TrafficSpec(_Model):
    """The traffic the deployment must serve; the operator makes sure some pool covers it."""

    endpoints: list[Literal["transcriptions", "translations", "chat"]] = Field(
        default_factory=lambda: ["transcriptions"],  # type: ignore[arg-type]
        description="OpenAI endpoints served: transcriptions, translations, chat "
        "(/v1/chat/completions).",
        max_length=3,
    )
    features: list[
        Literal["stream", "segment_timestamps", "word_timestamps", "language_detection"]
    ] = Field(
        default_factory=list,
        description="Options requests will use: stream, segment_timestamps (also needed for "
        "srt/vtt/verbose_json), word_timestamps, language_detection.",
        max_length=4,
    )


# --------------------------------------------------------------------------- frontend


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class FrontendServiceSpec(_Model):
    type: ServiceType = Field(default=ServiceType.CLUSTER_IP, description="Service type.")
    port: int = Field(default=80, ge=1, le=65535, description="Service port.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations of the Service (e.g. for a load balancer)."
    )


class FrontendLimits(_Model):
    """Limits per frontend process against clients that would exhaust it (docs/security.md).
    The frontend's own defaults are these (transcription_frontend/limits.py)."""

    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        le=1024**2,
        description="Bytes of a request's line and headers; more: 431.",
    )
    max_headers: int = Field(
        default=100, ge=8, le=1000, description="Headers per request; more: 431."
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds for a request's headers to arrive whole; then 408.",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds a request body may send nothing; then 408.",
    )
    body_min_bytes_per_second: int = Field(
        default=1024,
        ge=0,
        le=1024**3,
        description="Bytes/s a body must average once `bodyTimeoutSeconds` have passed "
        "(a rate, not a total: slow but honest uploads still get through); then 408.",
    )
    idle_timeout_seconds: int = Field(
        default=5,
        ge=1,
        le=3600,
        description="Seconds a connection may idle between requests before it is closed.",
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Bytes of a whole request body, however it is framed; more: 413. "
        "Default: `maxUploadBytes` plus 1 MiB.",
    )
    max_concurrency: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Requests in flight per frontend replica; more get 503 with Retry-After "
        "(probes and metrics are exempt).",
    )
    max_connections: int = Field(
        default=2048, ge=1, le=1_000_000,
        description="Open connections per frontend replica; more get 503.",
    )  # fmt: skip
    max_realtime_sessions: int = Field(
        default=100, ge=0, le=100_000,
        description="Realtime transcription sessions (WebSockets on /v1/realtime) open per "
        "frontend replica; more: the upgrade is refused with 503 and Retry-After.",
    )  # fmt: skip
    realtime_session_seconds: float = Field(
        default=3600.0, gt=0, le=86_400,
        description="Longest a realtime session lasts; then an error event "
        "`session_expired` and a close.",
    )  # fmt: skip
    realtime_idle_timeout_seconds: float = Field(
        default=60.0, gt=0, le=86_400,
        description="Seconds a realtime session may receive no client event; then an error "
        "event `session_idle_timeout` and a close.",
    )  # fmt: skip
    realtime_max_append_bytes: int = Field(
        default=15 * 1024 * 1024, ge=1024, le=1024**3,
        description="Bytes of audio (decoded from base64) in one `input_audio_buffer.append`; "
        "more: an error event `append_too_large`, and the session goes on.",
    )  # fmt: skip


class ChunkingSpec(_Model):
    """Long audio: cut on silence, its chunks transcribed across the pool's replicas at once,
    stitched into one answer (docs/api.md#long-audio)."""

    enabled: bool = Field(
        default=True,
        description="Chunk audio longer than `thresholdSeconds`, or longer (or larger) than "
        "every pool's engine takes whole. Requests with OpenAI's `chunking_strategy` are "
        "chunked either way.",
    )
    threshold_seconds: float = Field(
        default=120.0, gt=0, le=86_400,
        description="Audio longer than this (when its header tells its length) is chunked, "
        "so that its chunks run on every ready replica at once.",
    )  # fmt: skip
    max_chunk_seconds: float = Field(
        default=30.0, ge=5, le=600,
        description="Longest chunk (Whisper's window is 30 s); each is cut in the longest "
        "silence before it.",
    )  # fmt: skip
    max_parallel_chunks: int = Field(
        default=4, ge=1, le=256,
        description="Chunks of one request transcribed at once, so that one long file cannot "
        "starve short requests.",
    )  # fmt: skip
    previous_text: bool = Field(
        default=False,
        description="Prompt each chunk with the text of the chunk before it, as Whisper "
        "conditions each window on the text before it inside one file (Whisper pools only; "
        "after the request's own `prompt`). The chunks then form `maxParallelChunks` runs of "
        "consecutive chunks, each run in order. Off by default: it helped WER with 25 s "
        "chunks and not with the 28.5 s chunks cut by default (python -m bench "
        "longaudio-prompt, docs/benchmarks.md).",
    )


class FrontendSpec(_Model):
    """The OpenAI-compatible gateway in front of the pools."""

    replicas: int = Field(default=2, ge=0, le=100, description="Frontend replicas.")
    service: FrontendServiceSpec = Field(
        default_factory=FrontendServiceSpec, description="The frontend Service."
    )
    max_upload_bytes: int = Field(
        default=26_214_400,
        ge=1024,
        le=MAX_UPLOAD,
        description="Largest upload accepted; larger ones get 413 naming this limit.",
    )
    max_audio_seconds: float | None = Field(
        default=None, gt=0, le=7 * 86_400,
        description="Longest audio accepted; longer gets 413 naming this limit (default: no "
        "limit but maxUploadBytes).",
    )  # fmt: skip
    chunking: ChunkingSpec = Field(
        default_factory=ChunkingSpec, description="Long audio: cut, fanned out, stitched."
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding accepted API keys, one per line (blank lines and "
        "`#` comments ignored; a key may be followed by the models it may use); when set, "
        "requests need `Authorization: Bearer <key>`, and a Secret without a key keeps the "
        "frontend not ready (never open).",
    )
    resources: ResourcesSpec = Field(
        default_factory=lambda: ResourcesSpec(cpu="500m", memory="512Mi"),
        description="Resources of each frontend replica.",
    )
    limits: FrontendLimits = Field(
        default_factory=FrontendLimits,
        description="Limits against hostile clients: header size, count and timeout, body "
        "timeout and rate, whole body size, requests in flight, connections.",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=10,
        le=86_400,
        description="Seconds a rollout of the frontend may go without progress before "
        "status reports it failed (ProgressDeadlineExceeded, Degraded=True; the old replicas "
        "keep serving).",
    )


class NetworkPolicySpec(_Model):
    """Who may reach the workers (the deployment's own frontend, and metrics scrapers) and
    the frontend's internal ports (its peers, and KEDA)."""

    enabled: bool = Field(
        default=True,
        description="Create a NetworkPolicy that admits only the frontend (and `metricsFrom`) "
        "to the worker pods, and one that admits only the frontend's peers (and "
        "`scalerFrom`) to its internal ports.",
    )
    metrics_from: list[KubeObject] = Field(
        default_factory=lambda: [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        description="NetworkPolicy peers allowed to scrape worker metrics; default: pods "
        "labelled app.kubernetes.io/name=prometheus in any namespace.",
    )
    scaler_from: list[KubeObject] = Field(
        default_factory=lambda: [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app": "keda-operator"}},
            }
        ],
        description="NetworkPolicy peers allowed to reach the frontend's internal ports (KEDA's "
        "external scaler, gRPC) besides the frontend's own replicas; default: KEDA's operator "
        "(pods labelled app=keda-operator, as both KEDA's release manifests and its Helm chart "
        "label them) in any namespace. The client-facing port stays open to all.",
    )


class ImagesSpec(_Model):
    """Container images; unset ones come from the operator's defaults."""

    frontend: str | None = Field(default=None, description="Frontend image.")
    vllm: str | None = Field(default=None, description="vLLM worker image for pools with GPUs.")
    vllm_cpu: str | None = Field(
        default=None, description="vLLM worker image for pools without GPUs (vLLM's CPU build)."
    )
    faster_whisper: str | None = Field(
        default=None, description="faster-whisper worker image for pools without GPUs."
    )
    faster_whisper_cuda: str | None = Field(
        default=None, description="faster-whisper worker image for pools with GPUs (CUDA)."
    )
    transformers: str | None = Field(default=None, description="transformers worker image.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy of every container."
    )
    pull_secrets: list[str] = Field(
        default_factory=list, description="Names of image pull Secrets."
    )


class PodOverrides(_Model):
    """Pod-level settings applied to every pod the deployment runs."""

    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    priority_class_name: str | None = Field(
        default=None, description="PriorityClass of the pods.", max_length=253
    )
    service_account_name: str | None = Field(
        default=None,
        description="ServiceAccount of the worker pods (the frontend has its own).",
        max_length=253,
    )


# --------------------------------------------------------------------------- tracing


# An OTLP/HTTP collector's base URL: http(s), a host (name or IPv4) and port, an optional
# path; no query, fragment or credentials. CEL's `matches` (RE2) and Python's `re` read it
# alike: it has no backslash to escape in either.
OTLP_ENDPOINT = r"^https?://[A-Za-z0-9._-]+(:[0-9]{1,5})?(/[-A-Za-z0-9._~/%]*)?$"
OTLP_ENDPOINT_MESSAGE = (
    "tracing.endpoint must be the http:// or https:// base URL of an OTLP/HTTP collector, "
    "a host and port with no query or credentials (e.g. http://otel-collector.monitoring:4318)"
)


class MonitoringSpec(_Model):
    """Prometheus scraping of this resource's pods through prometheus-operator
    (docs/operations/metrics.md). The chart's `metrics.podMonitors` does the same for every
    resource at once; this is for clusters where the chart's is off."""

    pod_monitor: bool = Field(
        default=False,
        description="Create a PodMonitor (monitoring.coreos.com/v1) scraping the frontend and "
        "the workers (not `transformers serve`, which has no /metrics), whose series get "
        "`namespace`, `deployment`, `pool` and `engine` labels. Skipped where the cluster "
        "does not serve PodMonitors (prometheus-operator not installed).",
    )
    interval: str = Field(
        default="30s", pattern=DURATION, max_length=20, description="Scrape interval."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the PodMonitor: what Prometheus' podMonitorSelector matches.",
    )


class TracingSpec(_Model):
    """OpenTelemetry traces of each request, from the frontend into vLLM's engine
    (docs/operations/tracing.md). Off unless `endpoint` is set."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"!has(self.endpoint) || self.endpoint.matches('{OTLP_ENDPOINT}')",
                OTLP_ENDPOINT_MESSAGE,
                field_path=".endpoint",
            )
        )
    )

    endpoint: str | None = Field(
        default=None,
        max_length=512,
        description="Base URL of an OTLP/HTTP (protobuf) collector, e.g. "
        "http://otel-collector.monitoring:4318: the frontends and the vLLM workers export "
        "spans to its /v1/traces. Unset: no tracing (the default).",
    )
    sampling_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Fraction of new traces sampled. A request that brings a W3C "
        "`traceparent` follows its sampled flag instead (parent-based sampling).",
    )

    @model_validator(mode="after")
    def _endpoint(self) -> TracingSpec:
        if self.endpoint is not None and not re.match(OTLP_ENDPOINT, self.endpoint):
            raise ValueError(f"{OTLP_ENDPOINT_MESSAGE}; got {self.endpoint!r}")
        return self


# --------------------------------------------------------------------------- spec


def _family_rules() -> list[dict[str, str]]:
    """CEL rules rejecting engines that cannot serve the model family at all."""
    rules = []
    for family in ModelFamily:
        engines = family_engines(family)
        if set(engines) == set(Engine):
            continue
        allowed = "[" + ", ".join(f"'{e.value}'" for e in engines) + "]"
        rules.append(
            cel(
                f"!has(self.model.family) || self.model.family != '{family.value}' || "
                f"(self.engine in {allowed} && (!has(self.pools) || self.pools.all(p, "
                f"!has(p.engine) || p.engine in {allowed})))",
                _family_message(family),
                field_path=".engine",
            )
        )
    return rules


def _family_message(family: ModelFamily) -> str:
    engines = " or ".join(e.value for e in family_engines(family))
    return f"model.family {family.value} runs on engine {engines} only"


def _engine_mode_rules() -> list[dict[str, str]]:
    """CEL rules rejecting (engine, mode) pairs no engine profile has."""
    rules = []
    for engine in Engine:
        modes = supported_modes(engine)
        for mode in Mode:
            if mode in modes:
                continue
            rules.append(
                cel(
                    "!has(self.pools) || self.pools.all(p, "
                    "!((has(p.engine) ? p.engine : self.engine) == "
                    f"'{engine.value}' && has(p.mode) && p.mode == '{mode.value}'))",
                    f"engine {engine.value} cannot run in {mode.value} mode; use "
                    + " or ".join(m.value for m in modes),
                    field_path=".pools",
                )
            )
    return rules


class TranscriptionDeploymentSpec(_Model):
    """Desired state of a transcription service."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q.name == p.name))",
                "pool names must be unique",
                field_path=".pools",
            ),
            cel(
                "!has(self.pools) || self.pools.all(p, !(p.name in "
                + str(list(RESERVED_POOL_NAMES)).replace('"', "'")
                + "))",
                "pool names " + ", ".join(RESERVED_POOL_NAMES) + " are reserved",
                field_path=".pools",
            ),
            *_engine_mode_rules(),
            *_family_rules(),
        )
    )

    model: ModelSpec = Field(description="The model served and where its weights come from.")
    engine: Engine = Field(
        default=Engine.VLLM,
        description="Default engine of the pools: vllm (GPU), faster-whisper (CPU or GPU), "
        "transformers.",
    )
    pools: list[PoolSpec] = Field(
        default_factory=list,
        description="Worker pools; default: one pool named 'default' in the engine's "
        "preferred mode.",
        max_length=MAX_POOLS,
    )
    traffic: TrafficSpec = Field(
        default_factory=TrafficSpec,
        description="Traffic that must be served; drives the automatic sequential split.",
    )
    auto_split: AutoSplitSpec = Field(
        default_factory=AutoSplitSpec, description="The automatically added sequential pool."
    )
    frontend: FrontendSpec = Field(
        default_factory=FrontendSpec, description="The OpenAI-compatible frontend."
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Network isolation of the workers."
    )
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Container images.")
    pod: PodOverrides = Field(default_factory=PodOverrides, description="Pod-level overrides.")
    tracing: TracingSpec = Field(
        default_factory=TracingSpec,
        description="OpenTelemetry traces: the OTLP endpoint and sampling (off by default).",
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="Prometheus: a PodMonitor for this resource's pods (off by default).",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> TranscriptionDeploymentSpec:
        problems = spec_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def pool_engine(self, pool: PoolSpec) -> Engine:
        return pool.engine or self.engine


def default_mode(engine: Engine) -> Mode:
    modes = supported_modes(engine)
    return Mode.CONTINUOUS if Mode.CONTINUOUS in modes else modes[0]


def spec_problems(spec: TranscriptionDeploymentSpec) -> list[str]:
    """The Python twin of the CEL rules: the cross-field problems of a spec."""
    out = []
    m = spec.model
    if m.source == WeightsSource.PVC and not (m.claim_name and m.path):
        out.append("model.source 'pvc' needs model.claimName and model.path")
    if m.source == WeightsSource.IMAGE and not m.path:
        out.append("model.source 'image' needs model.path (the weights' directory in the image)")
    if len(set(m.aliases)) != len(m.aliases):
        out.append("model.aliases must be unique")
    if m.name in m.aliases:
        out.append("model.aliases must not repeat model.name")
    if m.transcription_prompt is not None and m.family != ModelFamily.AUDIO_LM:
        out.append(
            "model.transcriptionPrompt applies to family audio-lm only (a Whisper model "
            "transcribes without one)"
        )
    names = [p.name for p in spec.pools]
    if len(set(names)) != len(names):
        out.append("pool names must be unique")
    if set(names) & set(RESERVED_POOL_NAMES):
        out.append("pool names " + ", ".join(RESERVED_POOL_NAMES) + " are reserved")
    for p in spec.pools:
        engine = spec.pool_engine(p)
        if p.mode and capability_set(engine, p.mode) is None:
            modes = " or ".join(x.value for x in supported_modes(engine))
            out.append(f"engine {engine.value} cannot run in {p.mode.value} mode; use {modes}")
        for arg in p.engine_args:
            flag = managed_flag(arg)
            if flag and managed_flag_message(flag) not in out:
                out.append(managed_flag_message(flag))
        a = p.autoscaling
        if a and a.min_replicas > a.max_replicas:
            out.append("minReplicas must not exceed maxReplicas")
    engines = {spec.engine, *(p.engine for p in spec.pools if p.engine)}
    if not engines <= set(family_engines(m.family)):
        out.append(_family_message(m.family))
    return out


# --------------------------------------------------------------------------- status


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(description="Condition type: Ready, Progressing, Degraded, ...")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="Generation of the spec this condition was computed for."
    )


class NotReady(_Model):
    """Why some replicas are not ready, in the words the cluster used (scheduler, kubelet,
    probes): the dominant reason among the pods, how many pods have it, and the first pod's
    message."""

    reason: str = Field(
        description="Unschedulable, ImagePullBackOff, CrashLoopBackOff, OOMKilled, "
        "StartupProbeFailing, ReadinessProbeFailing, FailedCreate, a kubelet reason, ..."
    )
    message: str = Field(description="The first pod's message (the scheduler's, the kubelet's).")
    pods: int = Field(description="Pods with this reason.")


class PoolStatus(_Model):
    """Observed state of one pool."""

    name: str = Field(description="Pool name.")
    engine: Engine = Field(description="Engine of the pool.")
    mode: Mode = Field(description="Batching mode of the pool.")
    replicas: int = Field(description="Desired replicas.")
    ready_replicas: int = Field(description="Replicas that are ready.")
    capabilities: list[Capability] = Field(description="What the pool serves.")
    automatic: bool = Field(
        default=False, description="True when the operator added this pool (automatic split)."
    )
    reason: str | None = Field(
        default=None, description="Why an automatic pool was added: the capabilities it covers."
    )
    service: str = Field(description="Service the frontend reaches the pool through.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="What each replica requests."
    )
    not_ready: NotReady | None = Field(
        default=None, description="Why replicas are not ready (absent when all are)."
    )


class FrontendStatus(_Model):
    """Observed state of the frontend."""

    replicas: int = Field(description="Desired replicas.")
    ready_replicas: int = Field(description="Replicas that are ready.")
    not_ready: NotReady | None = Field(
        default=None, description="Why replicas are not ready (absent when all are)."
    )


class TranscriptionDeploymentStatus(_Model):
    """Observed state of a transcription service."""

    observed_generation: int | None = Field(
        default=None, description="Generation of the spec the status reflects."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, ...")
    pools: list[PoolStatus] = Field(default_factory=list, description="Per-pool state.")
    frontend: FrontendStatus | None = Field(default=None, description="Frontend state.")
    ready_pools: str | None = Field(
        default=None, description="Pools with every replica ready, as ready/total."
    )
    worker_replicas: str | None = Field(
        default=None, description="Worker replicas across all pools, as ready/desired."
    )
    endpoint: str | None = Field(default=None, description="URL of the frontend Service.")
    models: list[str] = Field(
        default_factory=list, description="Model names clients may send (primary first)."
    )


class TranscriptionDeployment(_Model):
    """A speech-to-text service: worker pools, an OpenAI-compatible frontend and routing."""

    api_version: Literal["transcription.dev/v1alpha1"] = Field(
        default="transcription.dev/v1alpha1", description="API version."
    )
    kind: Literal["TranscriptionDeployment"] = Field(
        default="TranscriptionDeployment", description="Kind."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: TranscriptionDeploymentSpec = Field(description="Desired state.")
    status: TranscriptionDeploymentStatus | None = Field(
        default=None, description="Observed state."
    )

    model_config = ConfigDict(extra="ignore")

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))
