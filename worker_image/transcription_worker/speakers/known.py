"""Known speakers: OpenAI's `known_speaker_names[]` with `known_speaker_references[]`.

Up to four names, each with a reference clip of 2 to 10 s of that voice. A reference's
embedding is the mean of its windows' embeddings (over the speech in it). Each speaker group
found in the file gets the name of the reference its mean embedding is most similar to, when
that cosine similarity reaches `MATCH_THRESHOLD`; one name goes to one group at most, the
most similar pairs taken first. A group that matches no reference keeps a letter.

Bad input raises `SpeakerInputError`, whose `param` is the request field to name in a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .fbank import SAMPLE_RATE

MAX_KNOWN = 4
MIN_REFERENCE_S = 2.0
MAX_REFERENCE_S = 10.0
# Measured on the benchmark's clean conversations: a voice's own reference scores 0.84 or more
# against its group, another voice's 0.57 at most.
MATCH_THRESHOLD = 0.7
NAMES = "known_speaker_names"
REFERENCES = "known_speaker_references"

Floats = npt.NDArray[np.float32]


class SpeakerInputError(ValueError):
    """A bad known-speaker input; `param` is the OpenAI field it came in."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Reference:
    """A known speaker: a name and a clip of the voice (16 kHz mono samples in [-1, 1])."""

    name: str
    audio: Floats


def references(names: Sequence[str], clips: Sequence[npt.ArrayLike]) -> list[Reference]:
    """Checked references from the two request fields (the clips already decoded)."""
    if len(names) != len(clips):
        param = NAMES if len(names) > len(clips) else REFERENCES
        raise SpeakerInputError(
            f"{len(names)} known_speaker_names but {len(clips)} known_speaker_references: "
            "each name needs one reference clip",
            param,
        )
    if len(names) > MAX_KNOWN:
        raise SpeakerInputError(f"at most {MAX_KNOWN} known speakers, not {len(names)}", NAMES)
    out: list[Reference] = []
    for i, (name, clip) in enumerate(zip(names, clips, strict=True)):
        if not isinstance(name, str) or not name.strip():
            raise SpeakerInputError(f"known_speaker_names[{i}] is empty", NAMES)
        if name in (r.name for r in out):
            raise SpeakerInputError(f"known_speaker_names[{i}]: {name!r} is given twice", NAMES)
        audio = np.asarray(clip, dtype=np.float32)
        where = f"known_speaker_references[{i}] ({name})"
        if audio.ndim != 1:
            raise SpeakerInputError(f"{where} must be mono audio", REFERENCES)
        if not np.all(np.isfinite(audio)):
            raise SpeakerInputError(f"{where} holds samples that are not numbers", REFERENCES)
        seconds = audio.size / SAMPLE_RATE
        if not MIN_REFERENCE_S <= seconds <= MAX_REFERENCE_S:
            raise SpeakerInputError(
                f"{where} is {seconds:.2f} s long; a reference must be "
                f"{MIN_REFERENCE_S:g} to {MAX_REFERENCE_S:g} s of the speaker's voice",
                REFERENCES,
            )
        out.append(Reference(name.strip(), audio))
    return out


def match(
    centroids: npt.ArrayLike,
    reference_embeddings: npt.ArrayLike,
    names: Sequence[str],
    threshold: float = MATCH_THRESHOLD,
) -> dict[int, str]:
    """Group index -> known name, for the groups (rows of `centroids`, unit vectors) whose
    cosine similarity to a reference's embedding reaches `threshold`; one-to-one, most
    similar pairs first."""
    c = np.asarray(centroids, dtype=np.float64)
    r = np.asarray(reference_embeddings, dtype=np.float64)
    if r.shape[0] != len(names):
        raise ValueError(f"{r.shape[0]} reference embeddings but {len(names)} names")
    if c.size == 0 or r.size == 0:
        return {}
    if c.ndim != 2 or r.ndim != 2 or c.shape[1] != r.shape[1]:
        raise ValueError(f"centroids {c.shape} and references {r.shape} do not match")
    c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    r = r / np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
    sim = c @ r.T
    out: dict[int, str] = {}
    used: set[int] = set()
    for flat in np.argsort(-sim, axis=None).tolist():
        g, k = divmod(flat, sim.shape[1])
        if sim[g, k] < threshold:
            break
        if g in out or k in used:
            continue
        out[g] = names[k]
        used.add(k)
    return out
