"""`status`: what the operator observed and reports."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from ..capabilities import Capability, Engine, Mode
from ..schema import CrdModel
from .containers import ResourcesSpec


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(CrdModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(description="Condition type: Ready, Progressing, Degraded, ...")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="Generation of the spec this condition was computed for."
    )


class NotReady(CrdModel):
    """Why some replicas are not ready, in the words the cluster used (scheduler, kubelet,
    probes): the dominant reason among the pods, how many pods have it, and the first pod's
    message."""

    reason: str = Field(
        description="Unschedulable, ImagePullBackOff, CrashLoopBackOff, OOMKilled, "
        "StartupProbeFailing, ReadinessProbeFailing, FailedCreate, a kubelet reason, ..."
    )
    message: str = Field(description="The first pod's message (the scheduler's, the kubelet's).")
    pods: int = Field(description="Pods with this reason.")


class PoolStatus(CrdModel):
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


class FrontendStatus(CrdModel):
    """Observed state of the frontend."""

    replicas: int = Field(description="Desired replicas.")
    ready_replicas: int = Field(description="Replicas that are ready.")
    not_ready: NotReady | None = Field(
        default=None, description="Why replicas are not ready (absent when all are)."
    )


class GatewayRouting(CrdModel):
    """A gateway that selects this deployment: whether it routes it, and if not, why."""

    namespace: str = Field(description="The gateway's namespace.")
    name: str = Field(description="The gateway's name.")
    routed: bool = Field(description="Whether the gateway routes requests to this deployment.")
    reason: str = Field(
        description="Routed; NameConflict (a model name another deployment behind the gateway "
        "claims: the later one is refused), NotPermitted (a gateway of another namespace that "
        "spec.allowedGateways does not admit), InvalidSpec."
    )
    message: str = Field(default="", description="Why, naming the other resource.")


class WeightsStatus(CrdModel):
    """Source 'oci': the weights' image as the spec names it, and what the pools mount."""

    image: str = Field(description="spec.model.image.")
    pinned: bool = Field(
        description="Whether spec.model.image names a digest; a tag alone can move under "
        "running pools."
    )
    digests: list[str] = Field(
        default_factory=list,
        description="The image digests the worker pods' kubelets report mounting (one, but "
        "during a rollout); empty where the kubelet does not report image volumes' digests.",
    )


class TranscriptionDeploymentStatus(CrdModel):
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
    weights: WeightsStatus | None = Field(
        default=None, description="Source 'oci': the weights' image and its digests."
    )
    models: list[str] = Field(
        default_factory=list, description="Model names clients may send (primary first)."
    )
    gateways: list[GatewayRouting] = Field(
        default_factory=list,
        description="The TranscriptionGateways that select this deployment, routing it or not.",
    )
