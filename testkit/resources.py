"""TranscriptionDeployment resources for the fast tests."""

from __future__ import annotations

from typing import Any

from transcription_api.v1alpha1 import TranscriptionDeployment

NAME, NAMESPACE = "whisper", "speech"  # the resource the fast tests drive


def make_td(
    spec: dict[str, Any], name: str = NAME, namespace: str = NAMESPACE
) -> TranscriptionDeployment:
    return TranscriptionDeployment.model_validate(
        {
            "apiVersion": "transcription.dev/v1alpha1",
            "kind": "TranscriptionDeployment",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 3},
            "spec": spec,
        }
    )
