"""TranscriptionDeployment and TranscriptionGateway resources for the fast tests, and the
samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionGateway

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"

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


def make_gateway(
    spec: dict[str, Any], name: str = "gw", namespace: str = NAMESPACE
) -> TranscriptionGateway:
    return TranscriptionGateway.model_validate(
        {
            "apiVersion": "transcription.dev/v1alpha1",
            "kind": "TranscriptionGateway",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "generation": 1},
            "spec": spec,
        }
    )  # fmt: skip


def sample_docs(path: Path, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """A sample file's documents, as the API server would store them in `namespace` (each
    with a uid and a generation)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        name = d["metadata"]["name"]
        d["metadata"] |= {"namespace": namespace, "uid": f"uid-{name}", "generation": 1}
    return docs


def single_deployment_samples() -> list[Path]:
    """The samples that are one TranscriptionDeployment each."""
    out = []
    for path in sorted(SAMPLES_DIR.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if len(docs) == 1 and docs[0]["kind"] == "TranscriptionDeployment":
            out.append(path)
    return out
