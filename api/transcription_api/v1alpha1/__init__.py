"""`transcription.dev/v1alpha1` `TranscriptionDeployment`: spec and status.

These pydantic models are the single source of the CRD schema (`crds/` is generated from
them by `transcription_api.crd`). Every field carries a description; defaults, enums and
bounds here become the OpenAPI schema the API server enforces. Each cross-field rule is a
`Rule` placed just above the model it constrains, holding its CEL (so the API server
rejects bad objects at admission) beside its Python twin (so the operator can trust the
objects it reads); `spec_problems` runs the twins.

One module per part of the spec: `model`, `pools` (and the automatic split, traffic),
`frontend`, `containers` (resources, env, images, pod overrides), `observability`
(tracing, monitoring), `spec` (the whole, and the rules across its parts) and `status`;
`gateway` is the other kind, `TranscriptionGateway` (many deployments behind one frontend).
Import them from here. The frontend's limits and chunking are the frontend settings' own
models (`transcription_api.frontend`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..schema import CrdModel, NamedByMetadata
from .containers import DNS_SUBDOMAIN, EnvVar, ImagesSpec, PodOverrides, ResourcesSpec, SecretKeyRef
from .frontend import FrontendServiceSpec, FrontendSpec, ServiceType
from .gateway import (
    GATEWAY_KIND,
    GATEWAY_PLURAL,
    GATEWAY_SHORT_NAMES,
    GATEWAY_SINGULAR,
    GatewayImagesSpec,
    GatewayNamespaces,
    GatewayNetworkPolicySpec,
    LabelSelector,
    LabelSelectorRequirement,
    NamespacesFrom,
    RoutedDeployment,
    SelectorOperator,
    TranscriptionGateway,
    TranscriptionGatewaySpec,
    TranscriptionGatewayStatus,
    gateway_problems,
)
from .model import MAX_ALIASES, MODEL_NAME, MODEL_RULES, CacheSpec, ModelSpec, WeightsSource
from .observability import (
    OTLP_ENDPOINT,
    OTLP_ENDPOINT_MESSAGE,
    TRACING_RULES,
    MonitoringSpec,
    TracingSpec,
)
from .pools import (
    AUTOSCALING_RULES,
    DNS_LABEL,
    MAX_ENGINE_ARGS,
    POOL_RULES,
    WORKER_PROGRESS_DEADLINE,
    AutoscalingSpec,
    AutoSplitSpec,
    PoolSpec,
    TrafficSpec,
)
from .spec import (
    MAX_ALLOWED_GATEWAYS,
    MAX_POOLS,
    RESERVED_POOL_NAMES,
    SPEC_RULES,
    AllowedGateway,
    NetworkPolicySpec,
    TranscriptionDeploymentSpec,
    default_mode,
    spec_problems,
)
from .status import (
    Condition,
    ConditionStatus,
    FrontendStatus,
    GatewayRouting,
    NotReady,
    PoolStatus,
    TranscriptionDeploymentStatus,
    WeightsStatus,
)

__all__ = [
    "API_VERSION",
    "AUTOSCALING_RULES",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "GATEWAY_KIND",
    "GATEWAY_PLURAL",
    "GATEWAY_SHORT_NAMES",
    "GATEWAY_SINGULAR",
    "GROUP",
    "KIND",
    "MAX_ALIASES",
    "MAX_ALLOWED_GATEWAYS",
    "MAX_ENGINE_ARGS",
    "MAX_NAME",
    "MAX_POOLS",
    "MODEL_NAME",
    "MODEL_RULES",
    "OTLP_ENDPOINT",
    "OTLP_ENDPOINT_MESSAGE",
    "PLURAL",
    "POOL_RULES",
    "RESERVED_POOL_NAMES",
    "SHORT_NAMES",
    "SINGULAR",
    "SPEC_RULES",
    "TRACING_RULES",
    "VERSION",
    "WORKER_PROGRESS_DEADLINE",
    "AllowedGateway",
    "AutoSplitSpec",
    "AutoscalingSpec",
    "CacheSpec",
    "Condition",
    "ConditionStatus",
    "EnvVar",
    "FrontendServiceSpec",
    "FrontendSpec",
    "FrontendStatus",
    "GatewayImagesSpec",
    "GatewayNamespaces",
    "GatewayNetworkPolicySpec",
    "GatewayRouting",
    "ImagesSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "ModelSpec",
    "MonitoringSpec",
    "NamespacesFrom",
    "NetworkPolicySpec",
    "NotReady",
    "PodOverrides",
    "PoolSpec",
    "PoolStatus",
    "ResourcesSpec",
    "RoutedDeployment",
    "SecretKeyRef",
    "SelectorOperator",
    "ServiceType",
    "TracingSpec",
    "TrafficSpec",
    "TranscriptionDeployment",
    "TranscriptionDeploymentSpec",
    "TranscriptionDeploymentStatus",
    "TranscriptionGateway",
    "TranscriptionGatewaySpec",
    "TranscriptionGatewayStatus",
    "WeightsSource",
    "WeightsStatus",
    "default_mode",
    "gateway_problems",
    "spec_problems",
]

GROUP = "transcription.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TranscriptionDeployment"
PLURAL = "transcriptiondeployments"
SINGULAR = "transcriptiondeployment"
SHORT_NAMES = ["tdeploy"]
MAX_NAME = 30  # metadata.name; children are named <name>-<pool> and must fit a DNS label


class TranscriptionDeployment(NamedByMetadata, CrdModel):
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
