"""Settings the operator hands the frontend pod, read once by the gateway at start-up.

The operator builds one `FrontendSettings` from the resource and writes it as JSON into the
`TRANSCRIPTION_FRONTEND_SETTINGS` environment variable of the frontend container;
`transcription-frontend` reads it (or a `--settings` file; every default without either).
One model, both ends, as `WorkerSettings` is for the workers. Field names are the
settings' names everywhere: in this JSON, in the gateway's code and (camelCased) in the
resource.

The limits, the long-audio chunking and the tenants are the resource's own sub-models
(`spec.frontend.limits`, `spec.frontend.chunking`, `spec.frontend.tenants`), defined here
and used by the resource's models: the CRD's schema and the frontend's settings cannot
drift apart, and the frontend never imports the resource's version module.

Tracing is not a setting: it stays in OpenTelemetry's standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER_ARG`, ...), which the operator sets from `spec.tracing` for the
frontend and the vLLM workers alike. They are the contract users and the OpenTelemetry SDK
already know, and a pod's own name reaches its resource attributes only through an
environment variable (Kubernetes' `$(POD_NAME)` substitution).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from .schema import CrdModel, Rule, broken

SETTINGS_ENV = "TRANSCRIPTION_FRONTEND_SETTINGS"
FRONTEND_PORT = 8080  # the client-facing port
SCALER_PORT = 9090  # KEDA's external scaler (gRPC)
INTERNAL_PORT = 9091  # /internal/load, for the frontend's peers (off the public port)
# Autoscaling: seconds one replica would take to decode the audio queued and in flight for
# it, that the autoscaler aims at (`autoscaling.targetQueueSeconds`; docs/operations/scaling.md).
TARGET_QUEUE_SECONDS = 10.0

Port = Annotated[int, Field(ge=1, le=65535)]


# --------------------------------------------------------------------------- in the resource


class FrontendLimits(CrdModel):
    """Limits per frontend process against clients that would exhaust it (docs/security.md);
    `spec.frontend.limits` and the frontend's settings alike."""

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
    body_deadline_bytes_per_second: int = Field(
        default=16 * 1024, ge=0, le=1024**3,
        description="A body must arrive whole within `bodyTimeoutSeconds` plus its declared "
        "length (Content-Length; without one, the whole body's cap) at this many bytes/s, so "
        "that the rate a large upload must keep grows with its size: 20 MB has about 21 "
        "minutes, however steadily it trickles; then 408. 0: no such deadline.",
    )  # fmt: skip
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
    max_uploads_per_key: int = Field(
        default=64, ge=1, le=100_000,
        description="Requests whose body is still arriving, per API key (per client address "
        "without API keys) per frontend replica, so that one key's slow uploads cannot hold "
        "every one of `maxConcurrency`'s slots; more: 429 with Retry-After.",
    )  # fmt: skip
    buffered_body_bytes: int = Field(
        default=128 * 1024**2, ge=1024**2, le=1024**4,
        description="Bytes of request bodies and realtime audio a frontend replica holds in "
        "memory, all requests and sessions together: a chat completion's JSON body is parsed "
        "whole and counts its length from when it has arrived (it is spooled while it arrives) "
        "until its answer has been sent; a realtime session's input audio buffer (16-bit PCM, "
        "not yet committed) counts its length, each append counted whole before it is decoded; "
        "a diarized request's known speaker references (data URLs) count their length until "
        "it is answered. Uploads are spooled and streamed, also to audio language models, "
        "and count nothing. "
        "A body that would pass it: 503 with Retry-After; an append: an error event "
        "`memory_budget_exceeded`, and the session goes on. The default keeps the frontend's "
        "default 512Mi memory limit safe (parsing takes about twice a body, briefly).",
    )  # fmt: skip
    max_connections: int = Field(
        default=2048, ge=1, le=1_000_000,
        description="Open connections per frontend replica (WebSockets count against "
        "`maxRealtimeSessions` instead); more: 503 with Retry-After, and the connection is "
        "closed.",
    )  # fmt: skip
    max_connections_per_client: int = Field(
        default=512, ge=1, le=1_000_000,
        description="Open connections per client address per frontend replica, so that one "
        "client cannot take every connection; more: 503 with Retry-After, and the connection "
        "is closed. Behind a proxy or an Ingress, the proxy is the client: raise it to "
        "`maxConnections`.",
    )  # fmt: skip
    drain_seconds: float = Field(
        default=30.0, ge=0, le=3600,
        description="After an answer sent before the whole request arrived (an early error, a "
        "refusal), seconds the rest is read and discarded before the connection is closed, so "
        "that the client reads the answer rather than a reset (nginx's lingering close); "
        "`idleTimeoutSeconds` at most between two reads.",
    )  # fmt: skip
    drain_max_bytes: int = Field(
        default=64 * 1024**2, ge=0, le=1024**4,
        description="Bytes read and discarded at most after such an answer; then the "
        "connection is closed.",
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
        default=1024**2, ge=1024, le=16 * 1024**2,
        description="Bytes of audio (decoded from base64) in one `input_audio_buffer.append` "
        "(1 MiB: 21 s of 24 kHz PCM16); more: an error event `append_too_large`, and the "
        "session goes on. A WebSocket message over twice that (base64-encoded) is not read: "
        "the session is closed with 1009.",
    )  # fmt: skip
    realtime_max_buffer_seconds: float = Field(
        default=60.0, ge=1, le=3600,
        description="Seconds of audio a realtime session's input buffer holds uncommitted "
        "(a turn's longest): with server VAD a longer turn is committed there; with manual "
        "commits an append past it gets an error event `input_audio_buffer_full`, and the "
        "session goes on.",
    )  # fmt: skip


class ChunkingSpec(CrdModel):
    """Long audio: cut on silence, its chunks transcribed across the pool's replicas at once,
    stitched into one answer (docs/api.md#long-audio); `spec.frontend.chunking` and the
    frontend's settings alike."""

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


# `spec.frontend.maxAudioSeconds` and the frontend's setting of the same name.
MaxAudioSeconds = Annotated[
    float | None,
    Field(
        gt=0,
        le=7 * 86_400,
        description="Longest audio accepted; longer gets 413 naming this limit (default: no "
        "limit but maxUploadBytes).",
    ),
]


class Priority(StrEnum):
    """A tenant's class: interactive work is always served before batch work."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


# A tenant's name: a metrics label and a key file's `group=<name>` (no spaces or commas).
TENANT_NAME = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
# The tenant of keys without a group (and of every request when there is no key file).
DEFAULT_TENANT = "default"
MAX_TENANTS = 100


class TenantQuota(CrdModel):
    """How much audio a tenant may send, in audio seconds, as token buckets; unset: no
    limit; 0: every request is refused."""

    audio_seconds_per_minute: int | None = Field(
        default=None, ge=0, le=10**9,
        description="Audio seconds per minute: a bucket that holds this many and refills at "
        "this many a minute.",
    )  # fmt: skip
    audio_seconds_per_day: int | None = Field(
        default=None, ge=0, le=10**12,
        description="Audio seconds per day: a bucket that holds this many and refills at "
        "this many a day (rolling, not reset at midnight).",
    )  # fmt: skip


class TenantSpec(CrdModel):
    """A group of API keys that share a scope, a quota and a share of the workers
    (docs/gateway.md); `spec.frontend.tenants[]` and the frontend's settings alike."""

    name: str = Field(
        max_length=63, pattern=TENANT_NAME,
        description="The tenant's name: keys join it with `group=<name>` in the key file. "
        "`default` applies to keys without a group.",
    )  # fmt: skip
    models: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=1, max_length=64,
        description="Models (names or aliases) its keys may use, within each key's own "
        "scope; unset: every model.",
    )  # fmt: skip
    quota: TenantQuota = Field(
        default_factory=TenantQuota, description="Audio seconds it may send; unset: no limit."
    )
    priority: Priority = Field(
        default=Priority.INTERACTIVE,
        description="interactive or batch: a batch tenant's requests wait while interactive "
        "ones wait for the same pool.",
    )
    weight: int = Field(
        default=1, ge=1, le=1000,
        description="Its share of a busy pool against the other tenants of its priority, in "
        "audio seconds (weighted fair queuing): weight 3 gets three times weight 1's.",
    )  # fmt: skip


class HasTenants(Protocol):
    @property
    def tenants(self) -> list[TenantSpec]: ...


T = TypeVar("T", bound=HasTenants)


TENANTS_RULES: list[Rule[HasTenants]] = [
    Rule(
        "!has(self.tenants) || self.tenants.all(t, self.tenants.exists_one(u, u.name == t.name))",
        "tenant names must be unique",
        lambda f: len({t.name for t in f.tenants}) == len(f.tenants),
        field_path=".tenants",
    )
]


def check_tenants(owner: T) -> T:
    """`owner` (spec.frontend, the frontend's settings) if its tenants keep TENANTS_RULES."""
    it: HasTenants = owner
    problems = broken(TENANTS_RULES, it)
    if problems:
        raise ValueError("; ".join(problems))
    return owner


# `spec.frontend.tenants` and the frontend's setting of the same name.
Tenants = Annotated[
    list[TenantSpec],
    Field(
        default_factory=list,
        max_length=MAX_TENANTS,
        description="Tenants: groups of API keys with their models, quota, priority and "
        "weight (docs/gateway.md). Keys without a group, and every request without keys, "
        "are tenant `default`: unlimited unless declared here.",
    ),
]


# --------------------------------------------------------------------------- the frontend's own


class HoldLimits(BaseModel):
    """Bounds of holding requests while their pool has no ready worker (scale from zero);
    past one, a request gets 503 with `Retry-After`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_requests: int = Field(default=100, gt=0, description="Requests held per pool.")
    max_bytes: int = Field(
        default=1024**3, gt=0, description="Bytes of held uploads (on disk), all pools together."
    )
    max_memory_bytes: int = Field(
        default=64 * 1024**2,
        gt=0,
        description="Bytes of held chat bodies (in memory), all pools together.",
    )
    timeout_seconds: float = Field(
        default=300.0, gt=0, description="Seconds one request may be held, in all."
    )


class WorkerTimeouts(BaseModel):
    """How long the gateway waits for a worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_seconds: float = Field(
        default=3.0, gt=0, description="Seconds to connect to a worker before trying another."
    )
    read_seconds: float = Field(
        default=900.0,
        gt=0,
        description="Seconds a worker may send nothing, before or during its answer; then 504 "
        "(or a stream's error event), not retried.",
    )


class Discovery(StrEnum):
    STATIC = "static"  # the route table's endpoints
    KUBERNETES = "kubernetes"  # the pool Services' EndpointSlices


class Balancer(StrEnum):
    LEAST_IN_FLIGHT = "least-in-flight"
    ROUND_ROBIN = "round-robin"


class SettingsError(ValueError):
    """Settings that do not parse: the message names each bad field and what to do."""


class FrontendSettings(BaseModel):
    """Everything the frontend needs to start serving, but its route table."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="0.0.0.0", description="Address every port listens on.")
    port: Port = Field(default=FRONTEND_PORT, description="The client-facing HTTP port.")
    scaler_port: Port | None = Field(
        default=SCALER_PORT,
        description="KEDA's external scaler (gRPC externalscaler.ExternalScaler); null: off.",
    )
    internal_port: Port | None = Field(
        default=INTERNAL_PORT,
        description="/internal/load (this replica's load, for its peers), off the public "
        "port; null: served on the public port (one process, development).",
    )
    discovery: Discovery = Field(
        default=Discovery.STATIC,
        description="Worker endpoints from the route table (static) or from the pool "
        "Services' EndpointSlices (kubernetes).",
    )
    namespace: str | None = Field(
        default=None,
        description="Namespace of the pool Services; default: the pod's (POD_NAMESPACE), "
        "else the route table's.",
    )
    peers_service: str | None = Field(
        default=None,
        description="The frontend's own Service: its other endpoints' load is summed into "
        "the scaler's metric (with discovery kubernetes; else this replica's load is the "
        "total).",
    )
    balancer: Balancer = Field(
        default=Balancer.LEAST_IN_FLIGHT, description="Endpoint choice within a pool."
    )
    api_keys_path: Path | None = Field(
        default=None, description="File of accepted API keys, one per line; null: no keys."
    )
    api_docs: bool = Field(
        default=False,
        description="Serve Swagger UI at /docs and ReDoc at /redoc. Off by default: their pages "
        "load scripts and styles from a CDN (cdn.jsdelivr.net), so a browser that opens them "
        "fetches third-party code. /openapi.json is served either way.",
    )
    shutdown_grace_seconds: int = Field(
        default=30,
        gt=0,
        description="On SIGTERM: seconds for requests in flight and held to finish, after up "
        "to 5 s in which kept-alive connections end after an answer (keep both below the "
        "pod's terminationGracePeriodSeconds minus its preStop delay).",
    )
    max_audio_seconds: MaxAudioSeconds = None
    limits: FrontendLimits = Field(
        default_factory=FrontendLimits, description="Limits against hostile clients."
    )
    chunking: ChunkingSpec = Field(
        default_factory=ChunkingSpec, description="Long audio: cut, fanned out, stitched."
    )
    hold: HoldLimits = Field(
        default_factory=HoldLimits, description="Holding requests while a pool scales up."
    )
    worker_timeouts: WorkerTimeouts = Field(
        default_factory=WorkerTimeouts, description="Waiting for workers."
    )
    tenants: Tenants = Field(default_factory=list)

    _tenants = model_validator(mode="after")(check_tenants)

    def to_env(self) -> str:
        """The JSON of the settings away from their defaults."""
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_json(cls, text: str, source: str = SETTINGS_ENV) -> FrontendSettings:
        """The settings in `text` (from `source`); `SettingsError` naming every problem."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as e:
            problems = "; ".join(_problem(err) for err in e.errors())
            raise SettingsError(
                f"{source} is not valid frontend settings: {problems}. It holds the JSON of "
                "transcription_api.frontend.FrontendSettings (the operator writes it from the "
                "resource's spec.frontend); fix it, or leave it out for every default"
            ) from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FrontendSettings:
        """The settings in `SETTINGS_ENV`; every default when it is unset or empty."""
        env = os.environ if environ is None else environ
        raw = env.get(SETTINGS_ENV, "").strip()
        return cls.from_json(raw) if raw else cls()

    @classmethod
    def from_file(cls, path: Path) -> FrontendSettings:
        try:
            text = path.read_text()
        except OSError as e:
            raise SettingsError(f"cannot read the frontend settings {path}: {e}") from None
        return cls.from_json(text, str(path))


def _problem(error: ErrorDetails) -> str:
    where = ".".join(str(x) for x in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if error["type"] == "json_invalid":
        return f"not JSON ({error['msg']})"
    got = json.dumps(error.get("input"), default=str)
    return f"{where or 'the settings'}: {error['msg']} (got {got})"
