"""Generate the CustomResourceDefinitions from the pydantic models.

    python -m transcription_api.crd            print the CRDs as YAML
    python -m transcription_api.crd --write    (re)write crds/ and the chart's copies

pydantic emits JSON Schema with `$ref`s, `anyOf: [X, null]` for optional fields and
titles; a CRD needs a *structural* OpenAPI v3 schema: everything inlined, a type on every
node, no nulls. `structural()` does that translation; `crd()` adds the names, printer
columns, status subresource and versions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from . import v1alpha1 as api

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / f"{api.PLURAL}.{api.GROUP}.yaml"
GATEWAY_CRD_PATH = ROOT / "crds" / f"{api.GATEWAY_PLURAL}.{api.GROUP}.yaml"
# The chart carries a copy (Helm templates can only read files inside the chart).
CHART_FILES = ROOT / "charts" / "transcription-operator" / "files"
CHART_CRD_PATH = CHART_FILES / CRD_PATH.name

_DROP = {"title", "$defs", "additionalProperties", "$ref", "anyOf", "allOf", "const"}


class _CrdSchema(GenerateJsonSchema):
    """JSON Schema generation that also reports default factories as defaults.

    A model default is reported by what differs from the model's own defaults (usually
    `{}`), so the API server's defaulting fills nested fields from their own defaults.
    Empty list or map defaults are left out: the field simply stays absent.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None:
            value = schema.get("default", NoDefault)
            return NoDefault if value is None else value
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return value.model_dump(by_alias=True, exclude_defaults=True, mode="json")
        if value in ([], {}):
            return NoDefault
        return value


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """Translate one pydantic JSON Schema node into a structural OpenAPI v3 node."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in node or "allOf" in node:
        union: list[dict[str, Any]] = node.get("anyOf") or node.get("allOf") or []
        options = [o for o in union if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node}")
        merged = {**options[0], **{k: v for k, v in node.items() if k not in ("anyOf", "allOf")}}
        return structural(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    # JSON Schema's numeric exclusive bounds are booleans next to the bound in OpenAPI v3.0.
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(exclusive), int | float) and not isinstance(out[exclusive], bool):
            out[bound], out[exclusive] = out[exclusive], True
    if "const" in node:
        out["enum"] = [node["const"]]
        out.setdefault("type", "string")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = structural(extra, defs)
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
    if "default" in out and isinstance(out["default"], dict):
        out["default"] = _strip_none(out["default"])
    return out


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    return value


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_CrdSchema)
    schema: dict[str, Any] = structural(raw, raw.get("$defs", {}))
    return schema


def _condition(type_: str) -> str:
    return f'.status.conditions[?(@.type=="{type_}")]'


# Columns both kinds show: Ready, its reason (why not: Unschedulable, ImagePullBackOff,
# CrashLoopBackOff, NoCapacity, NameConflict, ...), the age and, with -o wide, its message.
READY = {"name": "Ready", "type": "string", "jsonPath": _condition("Ready") + ".status"}
REASON = {"name": "Reason", "type": "string", "jsonPath": _condition("Ready") + ".reason"}
AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
MESSAGE = {
    "name": "Message",
    "type": "string",
    "jsonPath": _condition("Ready") + ".message",
    "priority": 1,
}
PRINTER_COLUMNS: list[dict[str, Any]] = [
    READY,
    REASON,
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine"},
    {"name": "Pools", "type": "string", "jsonPath": ".status.readyPools"},
    # Worker replicas ready/desired across the pools.
    {"name": "Replicas", "type": "string", "jsonPath": ".status.workerReplicas"},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
    AGE,
    MESSAGE,
]
GATEWAY_PRINTER_COLUMNS: list[dict[str, Any]] = [
    READY,
    REASON,
    # Deployments routed/selected.
    {"name": "Deployments", "type": "string", "jsonPath": ".status.routedDeployments"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    AGE,
    MESSAGE,
]


def crd() -> dict[str, Any]:
    """The TranscriptionDeployment's CRD."""
    return _crd(
        api.TranscriptionDeployment,
        (api.KIND, api.PLURAL, api.SINGULAR, api.SHORT_NAMES),
        api.TranscriptionDeploymentSpec,
        api.TranscriptionDeploymentStatus,
        PRINTER_COLUMNS,
        "<name>-<pool>",
    )


def gateway_crd() -> dict[str, Any]:
    """The TranscriptionGateway's CRD."""
    return _crd(
        api.TranscriptionGateway,
        (api.GATEWAY_KIND, api.GATEWAY_PLURAL, api.GATEWAY_SINGULAR, api.GATEWAY_SHORT_NAMES),
        api.TranscriptionGatewaySpec,
        api.TranscriptionGatewayStatus,
        GATEWAY_PRINTER_COLUMNS,
        "<name>-frontend-internal",
    )


def _crd(
    resource: type[BaseModel],
    names: tuple[str, str, str, list[str]],
    spec_model: type[BaseModel],
    status_model: type[BaseModel],
    columns: list[dict[str, Any]],
    children: str,
) -> dict[str, Any]:
    kind, plural, singular, short_names = names
    spec = openapi_schema(spec_model)
    status = openapi_schema(status_model)
    root = {
        "type": "object",
        "description": " ".join((resource.__doc__ or "").split()),
        "required": ["spec"],
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {api.MAX_NAME}",
                "message": f"metadata.name must be at most {api.MAX_NAME} characters (children "
                f"are named {children} and must fit a 63-character DNS label)",
            }
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            # A new resource reads `observedGeneration: 0` until the operator writes its
            # status: kstatus (Flux's health check) takes a resource with no status at all
            # for Current, and Flux v1.9.6 reported Ready 36 ms after applying one (against
            # a bare API server; docs/development/test-bed.md). 0 is never the generation,
            # so it reads InProgress until the operator has looked. The API server applies
            # the default on every read (the status subresource drops status on create).
            "status": {**status, "default": {"observedGeneration": 0}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{api.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "transcription-operator"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["all", "transcription"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `python -m transcription_api.crd --write` from api/; do not edit.\n"


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(doc: dict[str, Any] | None = None) -> str:
    """A CRD (default: the TranscriptionDeployment's) as the committed file holds it."""
    return HEADER + yaml.dump(doc or crd(), Dumper=_NoAliasDumper, sort_keys=False, width=100)


# Each committed CRD file, by name (in crds/ and in the chart's files/), and its source.
FILES = {CRD_PATH.name: crd, GATEWAY_CRD_PATH.name: gateway_crd}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the CRDs.")
    parser.add_argument("--write", action="store_true", help="write crds/ and the chart's copies")
    args = parser.parse_args(argv)
    for name, make in FILES.items():
        text = render(make())
        if not args.write:
            sys.stdout.write(text)
            continue
        for path in (CRD_PATH.parent / name, CHART_FILES / name):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
