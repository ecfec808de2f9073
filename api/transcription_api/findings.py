"""Specs that are legal but almost surely wrong, found from the model's name.

Two rules, each written once here and used twice: by the operator (the findings go into
status, as `Degraded`, because an admission policy can be absent) and by the chart's
ValidatingAdmissionPolicy with the `Warn` action (so `kubectl apply` prints a warning):

- translations declared for an English-only Whisper checkpoint (`*.en`): those cannot
  translate;
- a vLLM pool whose GPU count does not divide the attention heads of a known Whisper size:
  vLLM's tensor parallelism splits the heads across the GPUs and refuses to start.

The model is recognised by its name (`openai/whisper-large-v3-turbo`,
`Systran/faster-whisper-small.en`, `distil-whisper/distil-medium.en`, ...). The regular
expressions are RE2 and Python alike, applied to the lower-cased name.

    python -m transcription_api.findings            print the policy
    python -m transcription_api.findings --write    (re)write the chart's copy
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .capabilities import Engine
from .v1alpha1 import GROUP, PLURAL, VERSION, TranscriptionDeploymentSpec


@dataclass(frozen=True)
class WhisperSize:
    name: str
    heads: int  # attention heads (encoder and decoder alike)
    pattern: str


SIZES = (
    WhisperSize("tiny", 6, "whisper.*[-_/.]tiny([-_.]|$)"),
    WhisperSize("base", 8, "whisper.*[-_/.]base([-_.]|$)"),
    WhisperSize("small", 12, "whisper.*[-_/.]small([-_.]|$)"),
    WhisperSize("medium", 16, "whisper.*[-_/.]medium([-_.]|$)"),
    # large, large-v2, large-v3, large-v3-turbo, distil-large-v3: 20 heads.
    WhisperSize("large", 20, "whisper.*[-_/.](large|turbo)([-_.]|$)"),
)
# tiny.en, base.en, small.en, medium.en (and their distil-/faster-whisper conversions).
ENGLISH_ONLY = "(^|[-_/.])(tiny|base|small|medium)[.]en$"
MAX_GPUS = 16  # ResourcesSpec.gpus

POLICY_NAME = f"{PLURAL}-warnings.{GROUP}"
ROOT = Path(__file__).resolve().parents[2]
POLICY_PATH = ROOT / "charts" / "transcription-operator" / "files" / "admission-policy.yaml"


def whisper_size(model: str) -> WhisperSize | None:
    """The first known size whose pattern the name matches (the policy checks in the same
    order)."""
    name = model.lower()
    return next((s for s in SIZES if re.search(s.pattern, name)), None)


def english_only(model: str) -> bool:
    return re.search(ENGLISH_ONLY, model.lower()) is not None


def gpu_choices(heads: int) -> str:
    return ", ".join(str(g) for g in range(1, MAX_GPUS + 1) if heads % g == 0)


def translation_message(model: str) -> str:
    return (
        f"spec.traffic.endpoints declares translations, but {model} is an English-only "
        "Whisper model (.en), which cannot translate: use a multilingual model (the name "
        "without .en) or remove translations"
    )


def heads_message(pool: str, gpus: int, size: WhisperSize, model: str) -> str:
    return (
        f"pool {pool}: resources.gpus={gpus} does not divide the {size.heads} attention heads "
        f"of Whisper {size.name} ({model}), so vLLM cannot split the model across them "
        f"(tensor parallelism): use {gpu_choices(size.heads)} GPUs"
    )


def findings(spec: TranscriptionDeploymentSpec) -> list[tuple[str, str]]:
    """(reason, message) for each rule the spec breaks; the policy's warnings, word for word."""
    out = []
    model = spec.model.name
    size = whisper_size(model)
    if size:
        bad = [
            heads_message(p.name, p.resources.gpus, size, model)
            for p in spec.pools
            if spec.pool_engine(p) == Engine.VLLM
            and p.resources.gpus > 1
            and size.heads % p.resources.gpus
        ]
        if bad:
            out.append(("GPUsDoNotDivideHeads", "; ".join(bad)))
    if "translations" in spec.traffic.endpoints and english_only(model):
        out.append(("EnglishOnlyModel", translation_message(model)))
    return out


# --------------------------------------------------------------------------- the policy


def _chain(values: list[tuple[str, str]], default: str) -> str:
    """CEL: the value of the first size whose pattern matches the model name."""
    expr = default
    for pattern, value in reversed(values):
        expr = f"variables.model.matches(r'{pattern}') ? {value} : {expr}"
    return expr


def policy() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (action Warn), as the chart ships them."""
    gpus = "p.resources.gpus"
    labels = {"app.kubernetes.io/part-of": "transcription-operator"}
    variables = [
        {"name": "model", "expression": "object.spec.model.name.lowerAscii()"},
        {"name": "heads", "expression": _chain([(s.pattern, str(s.heads)) for s in SIZES], "0")},
        {"name": "size", "expression": _chain([(s.pattern, f"'{s.name}'") for s in SIZES], "''")},
        {
            "name": "choices",
            "expression": f"{list(range(1, MAX_GPUS + 1))}"
            ".filter(g, variables.heads != 0 && variables.heads % g == 0)"
            ".map(g, string(g)).join(', ')",
        },
        {
            "name": "badPools",
            "expression": "!has(object.spec.pools) ? [] : object.spec.pools.filter(p, "
            "variables.heads != 0 && "
            f"(has(p.engine) ? p.engine : object.spec.engine) == '{Engine.VLLM.value}' && "
            f"has(p.resources) && has({gpus}) && {gpus} > 1 && variables.heads % {gpus} != 0)",
        },
    ]
    heads = (
        "variables.badPools.map(p, 'pool ' + p.name + ': resources.gpus=' + "
        f"string({gpus}) + ' does not divide the ' + string(variables.heads) + "
        "' attention heads of Whisper ' + variables.size + ' (' + object.spec.model.name + "
        "'), so vLLM cannot split the model across them (tensor parallelism): use ' + "
        "variables.choices + ' GPUs').join('; ')"
    )
    translations = (
        "'spec.traffic.endpoints declares translations, but ' + object.spec.model.name + "
        "' is an English-only Whisper model (.en), which cannot translate: use a "
        "multilingual model (the name without .en) or remove translations'"
    )
    vap = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": labels},
        "spec": {
            # Advice only: a policy that cannot be evaluated never blocks an apply.
            "failurePolicy": "Ignore",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [PLURAL],
                    }
                ]
            },
            "variables": variables,
            "validations": [
                {"expression": "size(variables.badPools) == 0", "messageExpression": heads},
                {
                    "expression": "!(variables.model.matches(r'"
                    + ENGLISH_ONLY
                    + "') && has(object.spec.traffic) && has(object.spec.traffic.endpoints) && "
                    "object.spec.traffic.endpoints.exists(e, e == 'translations'))",
                    "messageExpression": translations,
                },
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": labels},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Warn"]},
    }
    return [vap, binding]


HEADER = "# Generated by `python -m transcription_api.findings --write` from api/; do not edit.\n"


def render() -> str:
    return HEADER + yaml.safe_dump_all(policy(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The chart's ValidatingAdmissionPolicy.")
    parser.add_argument("--write", action="store_true", help=f"write {POLICY_PATH}")
    args = parser.parse_args(argv)
    if args.write:
        POLICY_PATH.write_text(render())
        print(f"wrote {POLICY_PATH}", file=sys.stderr)
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
