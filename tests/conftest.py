"""Shared helpers for the fast tests (no cluster)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from transcription_api.v1alpha1 import TranscriptionDeployment

# The transformers suite needs torch and transformers: it runs in its own environment
# (`make test-transformers`, its own environment) and is not collected without them.
collect_ignore = [] if importlib.util.find_spec("transformers") else ["transformers_engine"]


def make_td(
    spec: dict[str, Any], name: str = "whisper", namespace: str = "speech"
) -> TranscriptionDeployment:
    return TranscriptionDeployment.model_validate(
        {
            "apiVersion": "transcription.dev/v1alpha1",
            "kind": "TranscriptionDeployment",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 3},
            "spec": spec,
        }
    )


@pytest.fixture
def vllm_td() -> TranscriptionDeployment:
    return make_td(
        {
            "model": {"name": "openai/whisper-large-v3-turbo", "aliases": ["whisper-1"]},
            "engine": "vllm",
            "pools": [
                {"name": "batch", "mode": "continuous", "replicas": 2, "resources": {"gpus": 1}}
            ],
            "frontend": {"replicas": 2},
        }
    )
