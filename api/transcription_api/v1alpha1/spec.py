"""`spec`: the whole desired state, its cross-field rules across sections, and
`spec_problems`, which runs the Python twin of every rule.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from ..capabilities import Engine, Mode, ModelFamily
from ..engines import family_engines, supported_modes
from ..schema import CrdModel, KubeObject, Rule, broken, validations
from .containers import DNS_SUBDOMAIN, ImagesSpec, PodOverrides
from .frontend import FrontendSpec
from .model import MODEL_RULES, ModelSpec
from .observability import MonitoringSpec, Tracing
from .pools import AUTOSCALING_RULES, POOL_RULES, AutoSplitSpec, PoolSpec, TrafficSpec

MAX_POOLS = 8
MAX_ALLOWED_GATEWAYS = 32
RESERVED_POOL_NAMES = ("frontend", "routes", "scaler")

# `networkPolicy.egress`, of a deployment and of a gateway alike.
Egress = Annotated[
    bool,
    Field(
        default=True,
        description="Also limit what the pods may reach (egress NetworkPolicies): DNS; for "
        "workers, the model hub (any address on 443) only with model.source hub; for the "
        "frontend, the API server, its workers (a gateway's: those of the deployments it "
        "routes) and its peers; the tracing endpoint when set. false: anything outbound, for "
        "a CNI that does not enforce egress policies.",
    ),
]
# `networkPolicy.scalerFrom`, of a deployment's frontend and of a gateway's alike.
ScalerFrom = Annotated[
    list[KubeObject],
    Field(
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
    ),
]


class AllowedGateway(CrdModel):
    """A gateway (or all of a namespace's) that may route to this deployment."""

    # The consent of the deployment's owners, as Gateway API's ReferenceGrant gives it.

    namespace: str = Field(
        description="The gateways' namespace; `*`: any namespace.",
        max_length=63,
        pattern=r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$",
    )
    name: str | None = Field(
        default=None,
        description="The gateway's name; unset: every gateway of that namespace.",
        max_length=253,
        pattern=DNS_SUBDOMAIN,
    )

    def admits(self, namespace: str, name: str) -> bool:
        return self.namespace in ("*", namespace) and self.name in (None, name)


class NetworkPolicySpec(CrdModel):
    """Who may reach the workers (the deployment's own frontend, and metrics scrapers) and
    the frontend's internal ports (its peers, and KEDA); what the pods may reach."""

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
    scaler_from: ScalerFrom
    egress: Egress


def _family_rule(family: ModelFamily) -> Rule[TranscriptionDeploymentSpec]:
    """Engines that cannot serve the model family at all are refused."""
    engines = family_engines(family)
    allowed = "[" + ", ".join(f"'{e.value}'" for e in engines) + "]"
    return Rule(
        f"!has(self.model.family) || self.model.family != '{family.value}' || "
        f"(self.engine in {allowed} && (!has(self.pools) || self.pools.all(p, "
        f"!has(p.engine) || p.engine in {allowed})))",
        f"model.family {family.value} runs on engine {' or '.join(e.value for e in engines)} only",
        lambda s: (
            s.model.family != family
            or {s.engine, *(p.engine for p in s.pools if p.engine)} <= set(engines)
        ),
        field_path=".engine",
    )


def _engine_mode_rule(engine: Engine, mode: Mode) -> Rule[TranscriptionDeploymentSpec]:
    """An (engine, mode) pair no engine profile has is refused."""
    return Rule(
        "!has(self.pools) || self.pools.all(p, "
        "!((has(p.engine) ? p.engine : self.engine) == "
        f"'{engine.value}' && has(p.mode) && p.mode == '{mode.value}'))",
        f"engine {engine.value} cannot run in {mode.value} mode; use "
        + " or ".join(m.value for m in supported_modes(engine)),
        lambda s: not any(s.pool_engine(p) == engine and p.mode == mode for p in s.pools),
        field_path=".pools",
    )


SPEC_RULES: list[Rule[TranscriptionDeploymentSpec]] = [
    Rule(
        "!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q.name == p.name))",
        "pool names must be unique",
        lambda s: len({p.name for p in s.pools}) == len(s.pools),
        field_path=".pools",
    ),
    Rule(
        "!has(self.pools) || self.pools.all(p, !(p.name in "
        + str(list(RESERVED_POOL_NAMES)).replace('"', "'")
        + "))",
        "pool names " + ", ".join(RESERVED_POOL_NAMES) + " are reserved",
        lambda s: not {p.name for p in s.pools} & set(RESERVED_POOL_NAMES),
        field_path=".pools",
    ),
    *(
        _engine_mode_rule(engine, mode)
        for engine in Engine
        for mode in Mode
        if mode not in supported_modes(engine)
    ),
    *(_family_rule(f) for f in ModelFamily if set(family_engines(f)) != set(Engine)),
]


class TranscriptionDeploymentSpec(CrdModel):
    """Desired state of a transcription service."""

    model_config = ConfigDict(json_schema_extra=validations(SPEC_RULES))

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
    tracing: Tracing
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="Prometheus: a PodMonitor for this resource's pods (off by default).",
    )
    allowed_gateways: list[AllowedGateway] = Field(
        default_factory=list,
        description="TranscriptionGateways of other namespaces that may route to this "
        "deployment (those of its own namespace always may); a gateway of another namespace "
        "that selects it without a match here is refused (NotPermitted) and named in both "
        "statuses.",
        max_length=MAX_ALLOWED_GATEWAYS,
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
    """The cross-field problems of a spec: the messages of the rules it breaks, each by the
    Python twin of its CEL rule, once each."""
    out = broken(MODEL_RULES, spec.model) + broken(SPEC_RULES, spec)
    for p in spec.pools:
        out += broken(POOL_RULES, p)
        if p.autoscaling:
            out += broken(AUTOSCALING_RULES, p.autoscaling)
    return list(dict.fromkeys(out))
