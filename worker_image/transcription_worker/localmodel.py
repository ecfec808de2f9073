"""A model directory on the pod (source 'pvc' or 'oci' mounted at /weights, or 'image'):
which of its formats an engine reads, and what to say when the weights are not where
`spec.model.path` points.

One directory may hold the weights of several engines, each format in a subdirectory named
after it: pools of different engines (a vLLM pool, and the faster-whisper pool the operator
adds for word timestamps) then share one volume or image.

    whisper-tiny.en/ctranslate2/    model.bin, config.json, ...    faster-whisper
    whisper-tiny.en/transformers/   config.json, model.safetensors  vLLM, transformers serve
"""

from __future__ import annotations

from pathlib import Path

SHOWN = 8  # entries of a directory named in the message
CTRANSLATE2 = "ctranslate2"  # faster-whisper's format (CTranslate2's model.bin)
TRANSFORMERS = "transformers"  # Hugging Face's (config.json, safetensors): vLLM, transformers


def in_format(model: str, fmt: str) -> str:
    """`model/fmt` where the local directory `model` keeps format `fmt` in its own
    subdirectory; otherwise `model` itself (a hub id, or a directory of one format)."""
    sub = Path(model) / fmt
    return str(sub) if model.startswith("/") and sub.is_dir() else model


def _listing(directory: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more if names else "nothing"


def missing(model: str, wanted: str, weights: str, fmt: str | None = None) -> str:
    """The message for a model directory without `wanted` (a file of `weights`, the kind of
    weights the engine reads, in subdirectory `fmt` where the engine looks for one): what the
    directory, or its nearest existing parent, holds."""
    path = Path(model)
    if path.is_dir():
        found = f"it holds {_listing(path)}"
    else:
        parent = next((p for p in path.parents if p.is_dir()), None)
        found = "it does not exist" + (f"; {parent} holds {_listing(parent)}" if parent else "")
    return (
        f"model directory {model} has no {wanted} ({weights})"
        + (f", nor a subdirectory {fmt}/ holding them" if fmt else "")
        + f": {found}. Check spec.model.path "
        "(for source 'pvc', that the claim holds the weights there; for source 'oci', that the "
        "image holds them there)"
    )
