"""Legal but almost surely wrong specs: recognised from the model's name, reported in status
and warned about by the chart's admission policy (the same table, the same words)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from transcription_api.findings import (
    POLICY_PATH,
    english_only,
    findings,
    policy,
    render,
    whisper_size,
)
from transcription_api.v1alpha1 import TranscriptionDeploymentSpec

NAMES = [
    ("openai/whisper-large-v3-turbo", "large", False),
    ("openai/whisper-large-v3", "large", False),
    ("openai/whisper-large", "large", False),
    ("distil-whisper/distil-large-v3", "large", False),
    ("Systran/faster-whisper-large-v2", "large", False),
    ("openai/whisper-medium.en", "medium", True),
    ("distil-whisper/distil-medium.en", "medium", True),
    ("openai/whisper-small", "small", False),
    ("Systran/faster-whisper-small.en", "small", True),
    ("openai/whisper-base.en", "base", True),
    ("whisper-tiny.en", "tiny", True),
    ("OpenAI/Whisper-Tiny", "tiny", False),
    ("tiny.en", None, True),  # faster-whisper's short names: English-only, size unknown here
    ("my-org/asr-model", None, False),
    ("whisper-1", None, False),
    ("facebook/wav2vec2-base-960h", None, False),  # 'base' but not Whisper
    ("my-org/whisper-tinyllama", None, False),  # 'tiny' inside a word
]


@pytest.mark.parametrize(("name", "size", "en"), NAMES)
def test_names(name: str, size: str | None, en: bool) -> None:
    found = whisper_size(name)
    assert (found.name if found else None) == size
    assert english_only(name) is en


def spec(**kw: Any) -> TranscriptionDeploymentSpec:
    return TranscriptionDeploymentSpec.model_validate(
        {"model": {"name": "openai/whisper-large-v3"}} | kw
    )


def test_gpu_counts_that_divide_the_heads_are_fine() -> None:
    for gpus in (1, 2, 4, 5, 10):
        assert findings(spec(pools=[{"name": "p", "resources": {"gpus": gpus}}])) == []


def test_gpu_counts_that_do_not_divide_the_heads() -> None:
    s = spec(pools=[
        {"name": "a", "resources": {"gpus": 3}},
        {"name": "b", "resources": {"gpus": 2}},
        {"name": "c", "resources": {"gpus": 8}},
        {"name": "cpu", "engine": "faster-whisper", "resources": {"gpus": 3}},  # no tensor parallelism
    ])  # fmt: skip
    assert findings(s) == [(
        "GPUsDoNotDivideHeads",
        "pool a: resources.gpus=3 does not divide the 20 attention heads of Whisper large "
        "(openai/whisper-large-v3), so vLLM cannot split the model across them (tensor "
        "parallelism): use 1, 2, 4, 5, 10 GPUs; pool c: resources.gpus=8 does not divide the 20 "
        "attention heads of Whisper large (openai/whisper-large-v3), so vLLM cannot split the "
        "model across them (tensor parallelism): use 1, 2, 4, 5, 10 GPUs",
    )]  # fmt: skip


def test_unknown_models_are_never_flagged() -> None:
    s = TranscriptionDeploymentSpec.model_validate(
        {"model": {"name": "my-org/asr.en"}, "pools": [{"name": "a", "resources": {"gpus": 7}}],
         "traffic": {"endpoints": ["translations"]}}
    )  # fmt: skip
    assert findings(s) == []


def test_translations_on_an_english_only_model() -> None:
    s = TranscriptionDeploymentSpec.model_validate(
        {"model": {"name": "openai/whisper-small.en"}, "traffic": {"endpoints": ["transcriptions", "translations"]}}
    )  # fmt: skip
    assert findings(s) == [(
        "EnglishOnlyModel",
        "spec.traffic.endpoints declares translations, but openai/whisper-small.en is an "
        "English-only Whisper model (.en), which cannot translate: use a multilingual model "
        "(the name without .en) or remove translations",
    )]  # fmt: skip
    s = TranscriptionDeploymentSpec.model_validate({"model": {"name": "openai/whisper-small.en"}})
    assert findings(s) == []


def test_the_charts_policy_is_generated_from_this_table() -> None:
    assert POLICY_PATH.read_text() == render(), (
        f"{POLICY_PATH} is stale: run `python -m transcription_api.findings --write`"
    )
    vap, binding = yaml.safe_load_all(POLICY_PATH.read_text())
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Warn"]}
    assert vap["spec"]["failurePolicy"] == "Ignore"  # advice never blocks an apply
    heads = next(v["expression"] for v in vap["spec"]["variables"] if v["name"] == "heads")
    for size, h in (("tiny", 6), ("base", 8), ("small", 12), ("medium", 16), ("large|turbo", 20)):
        assert f"[-_/.]{size if '|' not in size else '(' + size + ')'}([-_.]|$)') ? {h}" in heads
    assert policy()[0]["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == [
        "CREATE",
        "UPDATE",
    ]
