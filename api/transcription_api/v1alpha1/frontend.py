"""`spec.frontend`: the OpenAI-compatible gateway. Its limits and chunking are the frontend
settings' own models (`transcription_api.frontend`), which the operator hands the pod.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from ..capabilities import MAX_UPLOAD
from ..frontend import (
    TENANTS_RULES,
    ChunkingSpec,
    FrontendLimits,
    MaxAudioSeconds,
    Tenants,
    check_tenants,
)
from ..schema import CrdModel, validations
from .containers import ResourcesSpec, SecretKeyRef


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class FrontendServiceSpec(CrdModel):
    type: ServiceType = Field(default=ServiceType.CLUSTER_IP, description="Service type.")
    port: int = Field(default=80, ge=1, le=65535, description="Service port.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations of the Service (e.g. for a load balancer)."
    )


class FrontendSpec(CrdModel):
    """The OpenAI-compatible gateway in front of the pools."""

    model_config = ConfigDict(json_schema_extra=validations(TENANTS_RULES))

    enabled: bool = Field(
        default=True,
        description="Run this deployment's own frontend and Service. false: none of its own "
        "(no frontend Deployment, Service, scaler Service, PodDisruptionBudget, NetworkPolicy "
        "or RBAC); it is served only through the TranscriptionGateways that route it, and is "
        "Ready only while one does (else reason NotRouted).",
    )
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
    max_audio_seconds: MaxAudioSeconds = None
    chunking: ChunkingSpec = Field(
        default_factory=ChunkingSpec, description="Long audio: cut, fanned out, stitched."
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding accepted API keys, one per line (blank lines and "
        "`#` comments ignored; a key may be followed by the models it may use and by "
        "`group=<tenant>`); when set, "
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
    tenants: Tenants = Field(default_factory=list)

    _tenants = model_validator(mode="after")(check_tenants)
