"""Which deployments a gateway routes: `select(gateway, deployments, namespace_labels)`, a
pure function. The gateway's reconcile and each deployment's run it alike, so that both
statuses say the same.

Candidates are the deployments whose labels match `spec.selector`, in the namespaces
`spec.namespaces` looks at, not being deleted. In the order they were created (then by
namespace and name):
- one of another namespace whose `spec.allowedGateways` does not admit the gateway is
  refused (NotPermitted), named;
- one whose spec cannot be read is refused (InvalidSpec);
- one that claims a model name (primary or alias) an earlier routed one claims is refused
  whole (NameConflict), naming the name and the other deployment; the earlier one keeps
  serving, and its verdict names the refused one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transcription_api.schema import NamedByMetadata
from transcription_api.v1alpha1 import NamespacesFrom, TranscriptionDeployment, TranscriptionGateway

from .names import GatewayRef

ROUTED = "Routed"
NAME_CONFLICT = "NameConflict"
NOT_PERMITTED = "NotPermitted"
INVALID_SPEC = "InvalidSpec"
REFUSALS = (NAME_CONFLICT, NOT_PERMITTED, INVALID_SPEC)


@dataclass(frozen=True)
class Invalid(NamedByMetadata):
    """A deployment whose spec cannot be read: its metadata, and why."""

    metadata: dict[str, Any]
    message: str


Candidate = TranscriptionDeployment | Invalid


@dataclass(frozen=True)
class Verdict:
    """What a gateway makes of one deployment it selected."""

    namespace: str
    name: str
    routed: bool
    reason: str  # Routed, or NameConflict (routed or not), NotPermitted, InvalidSpec
    message: str
    names: tuple[str, ...] = ()  # the model names it claims
    deployment: TranscriptionDeployment | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Selection:
    gateway: GatewayRef
    verdicts: tuple[Verdict, ...] = ()  # in routing order
    # Why the gateway cannot look where it is told to (reason, message), if it cannot.
    problem: tuple[str, str] | None = None
    where: str = ""  # where it looked, in words

    @property
    def routed(self) -> list[TranscriptionDeployment]:
        return [v.deployment for v in self.verdicts if v.routed and v.deployment is not None]

    @property
    def refused(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.routed]

    def of(self, namespace: str, name: str) -> Verdict | None:
        return next((v for v in self.verdicts if (v.namespace, v.name) == (namespace, name)), None)


@dataclass
class _Claims:
    """Model names claimed so far, and the conflicts each routed deployment caused."""

    owner: dict[str, Verdict] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=dict)  # routed ref -> messages


def select(
    gateway: TranscriptionGateway,
    deployments: Iterable[Candidate],
    namespace_labels: Mapping[str, Mapping[str, str]] | None,
) -> Selection:
    """The deployments `gateway` routes and those it refuses. `namespace_labels`: every
    namespace's labels, or None where the operator may not read them."""
    ref = GatewayRef(gateway.namespace, gateway.name)
    spec = gateway.spec
    looked = spec.namespaces
    if looked.from_ == NamespacesFrom.SELECTOR and namespace_labels is None:
        return Selection(ref, problem=_unreadable(), where="no namespace")

    def looks_in(namespace: str) -> bool:
        if looked.from_ == NamespacesFrom.SAME:
            return namespace == gateway.namespace
        if looked.from_ == NamespacesFrom.ALL:
            return True
        labels = (namespace_labels or {}).get(namespace)
        return (
            labels is not None and looked.selector is not None and looked.selector.matches(labels)
        )

    candidates = sorted(
        (
            d
            for d in deployments
            if looks_in(d.namespace)
            and not d.metadata.get("deletionTimestamp")
            and spec.selector.matches(d.metadata.get("labels") or {})
        ),
        key=lambda d: (str(d.metadata.get("creationTimestamp") or ""), d.namespace, d.name),
    )
    claims = _Claims()
    verdicts = [_verdict(ref, d, claims) for d in candidates]
    verdicts = [_with_conflicts(v, claims) for v in verdicts]
    return Selection(ref, tuple(verdicts), where=_where(gateway))


def _verdict(gateway: GatewayRef, d: Candidate, claims: _Claims) -> Verdict:
    if isinstance(d, Invalid):
        return Verdict(d.namespace, d.name, False, INVALID_SPEC, d.message)
    names = tuple(d.spec.model.served_names)
    if d.namespace != gateway.namespace and not any(
        a.admits(gateway.namespace, gateway.name) for a in d.spec.allowed_gateways
    ):
        message = (
            f"TranscriptionDeployment {d.namespace}/{d.name} does not allow gateway {gateway} "
            f"(a gateway of another namespace): add {{namespace: {gateway.namespace}, name: "
            f"{gateway.name}}} to its spec.allowedGateways"
        )
        return Verdict(d.namespace, d.name, False, NOT_PERMITTED, message, names)
    for n in names:
        earlier = claims.owner.get(n)
        if earlier is not None:
            claims.refused.setdefault(earlier.ref, []).append(
                f"TranscriptionDeployment {d.namespace}/{d.name}, created later, also claims "
                f"{n!r} and is refused"
            )
            message = (
                f"model name {n!r} is already routed by gateway {gateway} to "
                f"TranscriptionDeployment {earlier.ref}, created earlier; rename it or drop it "
                "on one of them"
            )
            return Verdict(d.namespace, d.name, False, NAME_CONFLICT, message, names)
    verdict = Verdict(d.namespace, d.name, True, ROUTED, f"routed by gateway {gateway}", names, d)
    for n in names:
        claims.owner[n] = verdict
    return verdict


def _with_conflicts(v: Verdict, claims: _Claims) -> Verdict:
    """A routed deployment whose names a later one claimed: routed, and naming it."""
    conflicts = claims.refused.get(v.ref) if v.routed else None
    if not conflicts:
        return v
    message = v.message + "; " + "; ".join(conflicts)
    return Verdict(v.namespace, v.name, True, NAME_CONFLICT, message, v.names, v.deployment)


def _where(gateway: TranscriptionGateway) -> str:
    looked = gateway.spec.namespaces
    if looked.from_ == NamespacesFrom.SAME:
        return f"namespace {gateway.namespace}"
    if looked.from_ == NamespacesFrom.ALL:
        return "any namespace"
    return "the namespaces spec.namespaces.selector matches"


def _unreadable() -> tuple[str, str]:
    return (
        "NamespacesUnreadable",
        "spec.namespaces.from is Selector, which needs the namespaces' labels, and this "
        "operator watches named namespaces only (the chart's watchNamespaces), so it may not "
        "read them: use from: Same or All, with each deployment's spec.allowedGateways",
    )


def verdicts_on(
    td: TranscriptionDeployment, selections: Sequence[Selection]
) -> list[tuple[GatewayRef, Verdict]]:
    """Each gateway's verdict on `td`, for the gateways that selected it, by gateway."""
    out = []
    for s in selections:
        v = s.of(td.namespace, td.name)
        if v is not None:
            out.append((s.gateway, v))
    return sorted(out, key=lambda gv: gv[0])
