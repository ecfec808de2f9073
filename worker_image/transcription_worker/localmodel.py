"""A model directory on the pod (source 'pvc' or 'oci' mounted at /weights, or 'image'):
what to say when the weights are not where `spec.model.path` points."""

from __future__ import annotations

from pathlib import Path

SHOWN = 8  # entries of a directory named in the message


def _listing(directory: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more if names else "nothing"


def missing(model: str, wanted: str, weights: str) -> str:
    """The message for a model directory without `wanted` (a file of `weights`, the kind of
    weights the engine reads): what the directory, or its nearest existing parent, holds."""
    path = Path(model)
    if path.is_dir():
        found = f"it holds {_listing(path)}"
    else:
        parent = next((p for p in path.parents if p.is_dir()), None)
        found = "it does not exist" + (f"; {parent} holds {_listing(parent)}" if parent else "")
    return (
        f"model directory {model} has no {wanted} ({weights}): {found}. Check spec.model.path "
        "(for source 'pvc', that the claim holds the weights there; for source 'oci', that the "
        "image holds them there)"
    )
