"""What the resource says about containers and pods: Secrets, compute resources,
environment, images and pod-level overrides.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..schema import CrdModel, KubeObject
from ..units import QUANTITY

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class SecretKeyRef(CrdModel):
    """A key in a Secret of the resource's namespace."""

    name: str = Field(description="Name of the Secret.", max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(description="Key within the Secret.", max_length=253, min_length=1)


class ResourcesSpec(CrdModel):
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


class EnvVar(CrdModel):
    """An environment variable for the engine container."""

    name: str = Field(description="Variable name.", max_length=253, min_length=1)
    value: str | None = Field(default=None, description="Literal value.")
    value_from: KubeObject | None = Field(
        default=None, description="Source of the value (as in a pod's env[].valueFrom)."
    )


# The images fields a deployment and a gateway share.
FrontendImage = Annotated[str | None, Field(description="Frontend image.")]
PullPolicy = Annotated[
    Literal["Always", "IfNotPresent", "Never"] | None,
    Field(description="Image pull policy of every container."),
]
PullSecrets = Annotated[
    list[str], Field(default_factory=list, description="Names of image pull Secrets.")
]


class ImagesSpec(CrdModel):
    """Container images; unset ones come from the operator's defaults."""

    frontend: FrontendImage = None
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
    pull_policy: PullPolicy = None
    pull_secrets: PullSecrets


class PodOverrides(CrdModel):
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
