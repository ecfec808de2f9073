"""Object metadata every child carries: its owner reference (garbage collection removes
the child with the resource) and the `app.kubernetes.io/*` labels."""

from __future__ import annotations

from typing import Any

from transcription_api.v1alpha1 import API_VERSION, KIND, TranscriptionDeployment

from ..names import labels

Manifest = dict[str, Any]


def owner_reference(td: TranscriptionDeployment) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": td.name,
        "uid": td.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    td: TranscriptionDeployment, name: str, component: str, pool: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": td.namespace,
        "labels": labels(td, component, pool),
        "ownerReferences": [owner_reference(td)],
    }
