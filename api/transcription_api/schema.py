"""Building blocks of the resource's models, which the CRD is generated from: the base
model (camelCase on the wire), Kubernetes' own objects kept opaque, and cross-field rules.

A cross-field rule is written once, with both of its checks side by side: the CEL
expression the API server runs at admission (an `x-kubernetes-validations` entry of the
generated CRD) and its Python twin, which the operator runs on every object it reads (so
that it can trust them, CEL or not). Both give the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

M = TypeVar("M")


class CrdModel(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
    )


# Objects that Kubernetes itself defines (affinity, tolerations, env valueFrom): the CRD
# keeps them as opaque objects and the API server validates them when the operator puts
# them into a pod template.
KubeObject = Annotated[
    dict[str, Any],
    Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}),
]


class NamedByMetadata:
    """`name` and `namespace` of an object (a resource, as parsed or as read) from its
    `metadata`."""

    metadata: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))


@dataclass(frozen=True)
class Rule(Generic[M]):
    """One cross-field rule: `cel`, the API server's check, and `holds`, its Python twin;
    an object that breaks it gets `message` from either."""

    cel: str
    message: str
    holds: Callable[[M], bool]
    field_path: str | None = None

    def validation(self) -> dict[str, str]:
        """The rule's `x-kubernetes-validations` entry."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def validations(rules: Iterable[Rule[Any]]) -> dict[str, Any]:
    """A model's `json_schema_extra`: its rules, as the CRD carries them."""
    return {"x-kubernetes-validations": [r.validation() for r in rules]}


def broken(rules: Iterable[Rule[M]], obj: M) -> list[str]:
    """The messages of the rules `obj` breaks, by their Python twins."""
    return [r.message for r in rules if not r.holds(obj)]
