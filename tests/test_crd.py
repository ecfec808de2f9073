"""The CRD is generated from the models, structural, documented, and up to date."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from transcription_api import crd
from transcription_api import v1alpha1 as api
from transcription_api.frontend import TENANTS_RULES
from transcription_api.v1alpha1 import TranscriptionDeploymentSpec
from transcription_api.v1alpha1.model import OCI_REFERENCE


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out += walk(sub, f"{path}.{name}")
    if "items" in node:
        out += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_committed_crds_match_the_models() -> None:
    for name, make in crd.FILES.items():
        for path in (crd.CRD_PATH.parent / name, crd.CHART_FILES / name):
            assert path.read_text() == crd.render(make()), (
                f"{path} is stale: run `python -m transcription_api.crd --write`"
            )


@pytest.mark.parametrize("make", [crd.crd, crd.gateway_crd])
def test_schema_is_structural(make: Any) -> None:
    schema = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "type" in node, f"{path} has no type"
        for key in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs"):
            assert key not in node, f"{path} has {key}"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node["type"] == "object"
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), (
                f"{path}.{key} must be a boolean in OpenAPI v3.0"
            )


@pytest.mark.parametrize("make", [crd.crd, crd.gateway_crd])
def test_every_spec_and_status_field_has_a_description(make: Any) -> None:
    version = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for top in ("spec", "status"):
        for path, node in walk(version["properties"][top], top):
            if path.endswith("[]") or path.endswith("{}"):
                continue  # list items and map values are described by their field
            assert node.get("description"), f"{path} has no description"


def test_crd_has_names_printer_columns_and_status_subresource() -> None:
    doc = yaml.safe_load(crd.CRD_PATH.read_text())
    assert doc["spec"]["names"]["shortNames"] == ["tdeploy"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready", "Reason", "Engine", "Pools", "Replicas", "Model", "Endpoint", "Age", "Message",
    ]  # fmt: skip


def test_the_gateway_crd_has_its_names_columns_and_status_default() -> None:
    doc = yaml.safe_load(crd.GATEWAY_CRD_PATH.read_text())
    assert doc["spec"]["names"]["kind"] == "TranscriptionGateway"
    assert doc["spec"]["names"]["shortNames"] == ["tgw"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready", "Reason", "Deployments", "Endpoint", "Age", "Message",
    ]  # fmt: skip
    root = version["schema"]["openAPIV3Schema"]
    assert root["properties"]["status"]["default"] == {"observedGeneration": 0}
    assert root["required"] == ["spec"] and root["properties"]["spec"]["required"] == ["selector"]


def test_every_cel_rule_of_the_gateway_is_a_rule_with_its_python_twin() -> None:
    from transcription_api.v1alpha1 import gateway as g

    spec = crd.gateway_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    props = spec["properties"]
    requirement = props["selector"]["properties"]["matchExpressions"]["items"]
    ns_requirement = props["namespaces"]["properties"]["selector"]["properties"][
        "matchExpressions"
    ]["items"]
    at = {
        "": (spec, g.GATEWAY_RULES),
        ".namespaces": (props["namespaces"], g.NAMESPACES_RULES),
        ".selector.matchExpressions[]": (requirement, g.REQUIREMENT_RULES),
        ".namespaces.selector.matchExpressions[]": (ns_requirement, g.REQUIREMENT_RULES),
        ".tracing": (props["tracing"], api.TRACING_RULES),
        ".frontend": (props["frontend"], TENANTS_RULES),
    }
    for path, (node, rules) in at.items():
        assert node["x-kubernetes-validations"] == [r.validation() for r in rules], path
    elsewhere = [p for p, n in walk(spec) if "x-kubernetes-validations" in n and p not in at]
    assert elsewhere == []


def test_a_new_resource_reads_in_progress_until_the_operator_writes_status() -> None:
    """kstatus takes a resource without status for Current; with observedGeneration 0 it
    reads InProgress (the generation starts at 1) until the operator's first status."""
    doc = yaml.safe_load(crd.CRD_PATH.read_text())
    status = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["default"] == {"observedGeneration": 0}
    assert status["properties"]["observedGeneration"]["type"] == "integer"


def test_defaults_enums_and_bounds_reach_the_schema() -> None:
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["engine"]["default"] == "vllm"
    assert props["engine"]["enum"] == ["vllm", "faster-whisper", "transformers"]
    pool = props["pools"]["items"]["properties"]
    assert pool["mode"]["enum"] == ["continuous", "sequential"]
    assert (pool["replicas"]["minimum"], pool["replicas"]["maximum"]) == (0, 1000)
    assert props["frontend"]["properties"]["maxUploadBytes"]["default"] == 26214400
    assert props["frontend"]["default"] == {}
    # A model default that differs from the model's own defaults is kept.
    assert props["frontend"]["properties"]["resources"]["default"] == {
        "cpu": "500m",
        "memory": "512Mi",
    }
    assert props["traffic"]["properties"]["endpoints"]["default"] == ["transcriptions"]


def test_cel_rules_are_present() -> None:
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert "pool names must be unique" in messages
    # Every engine runs in both modes now: no (engine, mode) rule is left to generate.
    assert not [m for m in messages if "cannot run in" in m]


# The Python twin of each CEL rule gives the same message (the e2e suite checks the API
# server's side with the same table).
INVALID_SPECS = [
    (
        {"model": {"name": "m"}, "pools": [{"name": "a"}, {"name": "a"}]},
        "pool names must be unique",
    ),
    ({"model": {"name": "m", "aliases": ["x", "x"]}}, "model.aliases must be unique"),
    ({"model": {"name": "m", "aliases": ["m"]}}, "model.aliases must not repeat model.name"),
    (
        {"model": {"name": "m", "source": "pvc"}},
        "model.source 'pvc' needs model.claimName and model.path",
    ),
    (
        {"model": {"name": "m", "source": "oci"}},
        "model.source 'oci' needs model.image (the OCI image or artifact holding the weights)",
    ),
    (
        {"model": {"name": "m", "image": "weights:v1"}},
        "model.image applies to source 'oci' only (source 'image' bakes the weights into the "
        "worker image: spec.pools[].image)",
    ),
    (
        {"model": {"name": "m"}, "pools": [{"name": "frontend"}]},
        "pool names frontend, routes, scaler are reserved",
    ),
    (
        {"model": {"name": "m"}, "pools": [{"name": "a", "engineArgs": ["--port=9000"]}]},
        "engineArgs must not set --port: the operator sets it (workers listen on 8000); the port "
        "clients use is spec.frontend.service.port",
    ),
    (
        {
            "model": {"name": "m"},
            "pools": [{"name": "a", "engineArgs": ["--tensor-parallel-size", "2"]}],
        },
        "engineArgs must not set --tensor-parallel-size: it is derived from spec.pools[].resources.gpus",
    ),
    (  # vLLM reads underscores as dashes
        {"model": {"name": "m"}, "pools": [{"name": "a", "engineArgs": ["--max_num_seqs=4"]}]},
        "engineArgs must not set --max-num-seqs: it is derived from spec.pools[].mode (sequential sets 1)",
    ),
    (
        {
            "model": {"name": "m"},
            "pools": [{"name": "a", "engineArgs": ["--enforce-eager", "--served-model-name=x"]}],
        },
        "engineArgs must not set --served-model-name: it is derived from spec.model.name and spec.model.aliases",
    ),
    (
        {"model": {"name": "m", "family": "audio-lm"}},
        "model.family audio-lm runs on engine transformers only",
    ),
    (
        {
            "model": {"name": "m", "family": "audio-lm"},
            "engine": "transformers",
            "pools": [{"name": "a"}, {"name": "b", "engine": "faster-whisper"}],
        },
        "model.family audio-lm runs on engine transformers only",
    ),
    (
        {
            "model": {"name": "m"},
            "pools": [{"name": "a", "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}],
        },
        "minReplicas must not exceed maxReplicas",
    ),
    (
        {"model": {"name": "m"}, "frontend": {"tenants": [{"name": "a"}, {"name": "a"}]}},
        "tenant names must be unique",
    ),
    (
        {"model": {"name": "m"}, "tracing": {"endpoint": "otel-collector:4318"}},
        "tracing.endpoint must be the http:// or https:// base URL of an OTLP/HTTP collector, a "
        "host and port with no query or credentials (e.g. http://otel-collector.monitoring:4318)",
    ),
]


@pytest.mark.parametrize(("spec", "message"), INVALID_SPECS)
def test_python_validator_matches_cel_messages(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        TranscriptionDeploymentSpec.model_validate(spec)
    assert message in str(exc.value)
    # Each message is also a CEL rule's message in the CRD.
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r for _, node in walk(schema) for r in node.get("x-kubernetes-validations", [])]
    assert message in {r["message"] for r in rules}


def test_every_cel_rule_in_the_crd_is_a_rule_with_its_python_twin() -> None:
    """Each `x-kubernetes-validations` entry comes from a `Rule`, which holds its Python
    twin beside its CEL, at the node of the model the rule sits above (only the root's
    metadata.name length is the API server's alone: the operator never names objects)."""
    props = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    spec = props["spec"]
    at = {
        "": (spec, api.SPEC_RULES),
        ".model": (spec["properties"]["model"], api.MODEL_RULES),
        ".pools[]": (spec["properties"]["pools"]["items"], api.POOL_RULES),
        ".pools[].autoscaling": (
            spec["properties"]["pools"]["items"]["properties"]["autoscaling"],
            api.AUTOSCALING_RULES,
        ),
        ".tracing": (spec["properties"]["tracing"], api.TRACING_RULES),
        ".frontend": (spec["properties"]["frontend"], TENANTS_RULES),
    }
    for path, (node, rules) in at.items():
        assert node["x-kubernetes-validations"] == [r.validation() for r in rules], path
    elsewhere = [p for p, n in walk(spec) if "x-kubernetes-validations" in n and p not in at]
    assert elsewhere == []


def test_engine_args_that_only_look_like_managed_flags_are_accepted() -> None:
    spec = TranscriptionDeploymentSpec.model_validate(
        {"model": {"name": "m"}, "pools": [{"name": "a", "engineArgs": [
            "--max-model-len=448", "--portable", "--dtype=half_precision", "--port-range=1"]}]}
    )  # fmt: skip
    assert len(spec.pools[0].engine_args) == 4


def test_every_managed_flag_has_a_cel_rule() -> None:
    from transcription_api.worker import MANAGED_FLAGS, managed_flag_message

    pool = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["pools"]["items"]
    messages = {r["message"] for r in pool["x-kubernetes-validations"]}
    assert {managed_flag_message(f) for f in MANAGED_FLAGS} <= messages
    assert pool["properties"]["engineArgs"]["maxItems"] == 64  # bounds keep CEL's cost low


def test_faster_whisper_runs_in_both_modes_with_its_decoding_settings() -> None:
    spec = TranscriptionDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "engine": "faster-whisper",
            "pools": [{"name": "a", "mode": "continuous"}, {"name": "b", "mode": "sequential"}],
        }
    )
    a = spec.pools[0]
    assert (a.beam_size, a.vad_filter, a.threads, a.max_batch_size) == (5, False, 0, 8)
    pool = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["pools"]["items"]["properties"]
    assert (pool["beamSize"]["minimum"], pool["beamSize"]["maximum"]) == (1, 16)
    assert pool["maxBatchSize"]["minimum"] == 1
    with pytest.raises(ValidationError, match=r"beam_size|beamSize"):
        TranscriptionDeploymentSpec.model_validate(
            {"model": {"name": "m"}, "pools": [{"name": "a", "beamSize": 0}]}
        )


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="replica"):
        TranscriptionDeploymentSpec.model_validate(
            {"model": {"name": "m"}, "frontend": {"replica": 2}}
        )


def test_docs_spec_reference_is_current() -> None:
    from transcription_api import reference

    text = reference.PAGE.read_text()
    assert reference.render() in text, "run `python -m transcription_api.reference --write`"


@pytest.mark.parametrize(
    "image", ["oci://registry/x:v1", "Registry/X", "x:", "x@sha256:short", "a b", "x/:v1"]
)
def test_an_oci_reference_that_is_not_one_is_refused_by_the_schema(image: str) -> None:
    with pytest.raises(ValidationError) as exc:
        TranscriptionDeploymentSpec.model_validate(
            {"model": {"name": "m", "source": "oci", "image": image}}
        )
    assert "model.image" in str(exc.value) and "should match pattern" in str(exc.value)
    # the CRD carries the same pattern, so the API server refuses it too
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    model = schema["properties"]["spec"]["properties"]["model"]["properties"]
    assert model["image"]["pattern"] == OCI_REFERENCE
