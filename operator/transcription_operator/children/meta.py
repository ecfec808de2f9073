"""Object metadata every child carries: its owner reference (garbage collection removes
the child with the resource) and the `app.kubernetes.io/*` labels; and what the builders
need of a resource, of either kind (`Owner`, `Fronted`)."""

from __future__ import annotations

from typing import Any, Protocol

from transcription_api.v1alpha1 import FrontendSpec, PodOverrides, TracingSpec

from ..names import labels

Manifest = dict[str, Any]


class Owner(Protocol):
    """A resource that owns children: a TranscriptionDeployment or a TranscriptionGateway."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...


class Images(Protocol):
    @property
    def frontend(self) -> str | None: ...
    @property
    def pull_policy(self) -> str | None: ...
    @property
    def pull_secrets(self) -> list[str]: ...


class NetworkPolicy(Protocol):
    @property
    def enabled(self) -> bool: ...
    @property
    def scaler_from(self) -> list[dict[str, Any]]: ...
    @property
    def egress(self) -> bool: ...


class FrontedSpec(Protocol):
    """The parts of a spec a frontend is built from, which both kinds have."""

    @property
    def frontend(self) -> FrontendSpec: ...
    @property
    def images(self) -> Images: ...
    @property
    def pod(self) -> PodOverrides: ...
    @property
    def tracing(self) -> TracingSpec: ...
    @property
    def network_policy(self) -> NetworkPolicy: ...


class Fronted(Owner, Protocol):
    """A resource with a frontend (its own, or a gateway's) and pods."""

    @property
    def spec(self) -> FrontedSpec: ...


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(owner: Owner, name: str, component: str, pool: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component, pool),
        "ownerReferences": [owner_reference(owner)],
    }
