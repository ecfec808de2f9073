"""`transcription.dev/v1alpha1` `TranscriptionGateway`: one frontend and Service in front of
many TranscriptionDeployments, chosen by label.

The platform team owns the gateway (the entry point, its keys, its limits); model teams own
the deployments. A gateway looks in its own namespace by default; a deployment of another
namespace is routed only when its own `spec.allowedGateways` admits the gateway (the
target-side consent of Gateway API's ReferenceGrant). Its frontend runs the same image and
code as a deployment's, with the same `spec.frontend`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ..schema import CrdModel, NamedByMetadata, Rule, broken, validations
from .containers import FrontendImage, PodOverrides, PullPolicy, PullSecrets
from .frontend import FrontendSpec
from .observability import Tracing
from .spec import Egress, ScalerFrom
from .status import Condition, FrontendStatus

GATEWAY_KIND = "TranscriptionGateway"
GATEWAY_PLURAL = "transcriptiongateways"
GATEWAY_SINGULAR = "transcriptiongateway"
GATEWAY_SHORT_NAMES = ["tgw"]
MAX_MATCH_EXPRESSIONS = 16


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


REQUIREMENT_RULES: list[Rule[LabelSelectorRequirement]] = [
    Rule(
        "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
        "matchExpressions: operators In and NotIn need values, Exists and DoesNotExist take none",
        lambda r: bool(r.values) == (r.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)),
    )
]


class LabelSelectorRequirement(CrdModel):
    """One requirement of a label selector (metav1.LabelSelectorRequirement)."""

    model_config = ConfigDict(json_schema_extra=validations(REQUIREMENT_RULES))

    key: str = Field(description="The label's key.", min_length=1, max_length=317)
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(
        default_factory=list, description="The values of In and NotIn.", max_length=64
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == SelectorOperator.IN:
            return labels.get(self.key) in self.values
        if self.operator == SelectorOperator.NOT_IN:
            return labels.get(self.key) not in self.values
        return (self.key in labels) == (self.operator == SelectorOperator.EXISTS)


class LabelSelector(CrdModel):
    """A Kubernetes label selector (metav1.LabelSelector): every label of `matchLabels` and
    every requirement of `matchExpressions`; `{}` selects everything."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must all be present, with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        description="Requirements that must all hold.",
        max_length=MAX_MATCH_EXPRESSIONS,
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.match_labels.items() <= labels.items() and all(
            r.matches(labels) for r in self.match_expressions
        )


class NamespacesFrom(StrEnum):
    SAME = "Same"
    ALL = "All"
    SELECTOR = "Selector"


NAMESPACES_RULES: list[Rule[GatewayNamespaces]] = [
    Rule(
        "(has(self.from) && self.from == 'Selector') == has(self.selector)",
        "namespaces.selector is required with from: Selector, and only then",
        lambda n: (n.from_ == NamespacesFrom.SELECTOR) == (n.selector is not None),
    )
]


class GatewayNamespaces(CrdModel):
    """Where the gateway looks for deployments, as Gateway API's `allowedRoutes.namespaces`.
    A deployment of another namespace is routed only if its `spec.allowedGateways` admits
    the gateway."""

    model_config = ConfigDict(json_schema_extra=validations(NAMESPACES_RULES))

    from_: NamespacesFrom = Field(
        default=NamespacesFrom.SAME,
        alias="from",
        description="Same: the gateway's own namespace; All: every namespace the operator "
        "watches; Selector: the namespaces whose labels `selector` matches (the gateway's own "
        "only if it matches too). Selector needs the operator to read namespaces, which it "
        "does only when it watches every namespace (docs/install.md).",
    )
    selector: LabelSelector | None = Field(
        default=None, description="Namespace labels to match; with from: Selector only."
    )


class GatewayImagesSpec(CrdModel):
    """The frontend's image; unset: the operator's default."""

    frontend: FrontendImage = None
    pull_policy: PullPolicy = None
    pull_secrets: PullSecrets


class GatewayNetworkPolicySpec(CrdModel):
    """The frontend's internal ports: open only to its own replicas and `scalerFrom`."""

    enabled: bool = Field(
        default=True,
        description="Create a NetworkPolicy that admits only the frontend's peers (and "
        "`scalerFrom`) to its internal ports. The workers of each routed deployment admit "
        "the gateway's frontend through their own NetworkPolicy.",
    )
    scaler_from: ScalerFrom
    egress: Egress


GATEWAY_RULES: list[Rule[TranscriptionGatewaySpec]] = [
    Rule(
        "!has(self.frontend) || !has(self.frontend.enabled) || self.frontend.enabled",
        "frontend.enabled cannot be false on a gateway: its frontend is what it is",
        lambda s: s.frontend.enabled,
        field_path=".frontend.enabled",
    ),
    Rule(
        "!has(self.pod) || !has(self.pod.serviceAccountName)",
        "pod.serviceAccountName does not apply to a gateway: its frontend has its own "
        "ServiceAccount",
        lambda s: s.pod.service_account_name is None,
        field_path=".pod.serviceAccountName",
    ),
]


class TranscriptionGatewaySpec(CrdModel):
    """Desired state of a gateway: which deployments it routes, and its frontend."""

    model_config = ConfigDict(json_schema_extra=validations(GATEWAY_RULES))

    selector: LabelSelector = Field(
        description="The TranscriptionDeployments to route, by their labels; `{}`: every one "
        "in the namespaces looked at. Two that claim one model name (primary or alias): the "
        "later-created one is refused (NameConflict), named in both statuses."
    )
    namespaces: GatewayNamespaces = Field(
        default_factory=GatewayNamespaces,
        description="Where to look for deployments; default: the gateway's own namespace.",
    )
    frontend: FrontendSpec = Field(
        default_factory=FrontendSpec,
        description="The frontend, as a deployment's: replicas, Service, limits, chunking, "
        "API keys, resources.",
    )
    network_policy: GatewayNetworkPolicySpec = Field(
        default_factory=GatewayNetworkPolicySpec, description="Network isolation."
    )
    images: GatewayImagesSpec = Field(
        default_factory=GatewayImagesSpec, description="The frontend's image."
    )
    pod: PodOverrides = Field(
        default_factory=PodOverrides, description="Pod-level overrides of the frontend's pods."
    )
    tracing: Tracing

    @model_validator(mode="after")
    def _cross_field(self) -> TranscriptionGatewaySpec:
        problems = gateway_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def gateway_problems(spec: TranscriptionGatewaySpec) -> list[str]:
    """The cross-field problems of a gateway's spec, by the Python twins of its rules."""
    out = broken(GATEWAY_RULES, spec) + broken(NAMESPACES_RULES, spec.namespaces)
    for selector in (spec.selector, spec.namespaces.selector):
        for r in selector.match_expressions if selector else []:
            out += broken(REQUIREMENT_RULES, r)
    return list(dict.fromkeys(out))


class RoutedDeployment(CrdModel):
    """A deployment the gateway selected: routed or refused, and how it fares."""

    namespace: str = Field(description="The deployment's namespace.")
    name: str = Field(description="The deployment's name.")
    routed: bool = Field(description="Whether the gateway routes requests to it.")
    ready: bool = Field(description="Routed, and its own Ready condition is True.")
    reason: str = Field(
        description="Routed: its Ready condition's reason. Not routed: NameConflict, "
        "NotPermitted or InvalidSpec."
    )
    message: str = Field(
        default="", description="Its Ready condition's message, or why it is not routed."
    )
    models: list[str] = Field(
        default_factory=list, description="The model names it claims (primary first)."
    )


class TranscriptionGatewayStatus(CrdModel):
    """Observed state of a gateway."""

    observed_generation: int | None = Field(
        default=None, description="Generation of the spec the status reflects."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, ...")
    frontend: FrontendStatus | None = Field(default=None, description="Frontend state.")
    deployments: list[RoutedDeployment] = Field(
        default_factory=list, description="The deployments selected, in routing order."
    )
    routed_deployments: str | None = Field(
        default=None, description="Deployments routed, as routed/selected."
    )
    endpoint: str | None = Field(default=None, description="URL of the frontend Service.")


class TranscriptionGateway(NamedByMetadata, CrdModel):
    """One OpenAI-compatible endpoint in front of many TranscriptionDeployments: a frontend
    that routes each request by its model name."""

    api_version: Literal["transcription.dev/v1alpha1"] = Field(
        default="transcription.dev/v1alpha1", description="API version."
    )
    kind: Literal["TranscriptionGateway"] = Field(
        default="TranscriptionGateway", description="Kind."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: TranscriptionGatewaySpec = Field(description="Desired state.")
    status: TranscriptionGatewayStatus | None = Field(default=None, description="Observed state.")

    model_config = ConfigDict(extra="ignore")
