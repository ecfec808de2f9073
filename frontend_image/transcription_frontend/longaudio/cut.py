"""Long audio cut on silence: where the chunk boundaries of decoded audio lie.

`find_cuts` runs Silero VAD over the spooled 16 kHz PCM a block at a time (one probability
per 32 ms frame: 450 KB for an hour) and cuts the audio into contiguous chunks, each at
most `max_chunk_seconds`, ending in the middle of a silence wherever one exists. `encode`
turns a chunk into a 16 kHz mono FLAC (or WAV) file in memory: about 0.5 MB for 30 s.
Decoding, the VAD and the encoders are the audio package's.

The chunks cover the whole audio with no gap and no overlap (silences are not dropped), so
a chunk's timestamps become global ones by adding its `start`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..audio import encode as encoding
from ..audio import vad
from ..audio.decode import Decoded
from ..audio.pcm import RATE

WINDOW_BEFORE_TARGET = 8.0  # a chunk may end this long before its target

Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ChunkSettings:
    """How long audio is cut. The last three fields mean what OpenAI's `server_vad`
    chunking strategy says; `normalize` is what its `"auto"` strategy adds.

    - `max_chunk_seconds`: no chunk is longer (what the engine takes whole);
    - `target_chunk_seconds`: a chunk ends in a silence between `target - 8 s` (at least a
      quarter of the maximum) and the maximum, and a cut starts a new one;
    - `threshold`: Silero speech probability at or above which a 32 ms frame is speech;
      frames below `threshold - 0.15` are silence, those in between uncertain;
    - `silence_duration_ms`: a silence at least this long is a preferred cut;
    - `prefix_padding_ms`: accepted for `server_vad`'s sake. Chunks are contiguous and cut
      in the middle of a silence, so each already starts with half the silence before its
      speech (at least this much when that silence is twice as long); it moves no cut;
    - `normalize`: bring the audio's loudness to a standard level before the VAD sees it
      (the chunks' audio is not changed).
    """

    max_chunk_seconds: float = 30.0
    target_chunk_seconds: float = 25.0
    threshold: float = 0.5
    silence_duration_ms: int = 500
    prefix_padding_ms: int = 300
    normalize: bool = False

    def __post_init__(self) -> None:
        if not self.max_chunk_seconds >= 1.0:
            raise ValueError(f"max_chunk_seconds must be at least 1, got {self.max_chunk_seconds}")
        if not 0 < self.target_chunk_seconds <= self.max_chunk_seconds:
            raise ValueError(
                f"target_chunk_seconds must be in (0, max_chunk_seconds="
                f"{self.max_chunk_seconds}], got {self.target_chunk_seconds}"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold}")
        if self.silence_duration_ms < 0 or self.prefix_padding_ms < 0:
            raise ValueError("silence_duration_ms and prefix_padding_ms must not be negative")

    @property
    def neg_threshold(self) -> float:
        """Below this probability a frame is silence (Silero's hysteresis)."""
        return vad.neg_threshold(self.threshold)

    @property
    def window_seconds(self) -> float:
        """How far into a chunk its end may come first: `target - 8 s`, at least a quarter
        of the maximum."""
        return max(self.target_chunk_seconds - WINDOW_BEFORE_TARGET, 0.25 * self.max_chunk_seconds)


@dataclass(frozen=True)
class Chunk:
    """A stretch of the audio, in seconds from the start of the whole."""

    index: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def speech_probabilities(
    decoded: Decoded, settings: ChunkSettings, model: vad.SpeechModel | None = None
) -> Floats:
    """Silero's speech probability of each whole 32 ms frame of the audio (normalised first
    if the settings say so), read from the spool a block at a time."""
    gain = vad.normalizing_gain(decoded.blocks()) if settings.normalize else 1.0
    blocks = decoded.blocks(size=vad.BLOCK_SAMPLES)
    return vad.probabilities(blocks, model if model is not None else vad.Silero(), gain)


def find_cuts(decoded: Decoded, settings: ChunkSettings) -> list[Chunk]:
    """Contiguous chunks covering the whole audio, each at most `max_chunk_seconds`, cut
    in silences Silero finds (see `choose_cuts`)."""
    if decoded.seconds <= settings.max_chunk_seconds:
        return [Chunk(0, 0.0, decoded.seconds)]
    return choose_cuts(speech_probabilities(decoded, settings), decoded.samples, settings)


def choose_cuts(probabilities: Floats, samples: int, settings: ChunkSettings) -> list[Chunk]:
    """Chunks of `samples` samples of 16 kHz audio from per-frame speech probabilities.

    From each chunk's start, its end is sought in a window from `settings.window_seconds`
    to `max_chunk_seconds` later; the audio left after the last cut is at most the maximum.
    In the window the end is, in order of preference, the middle of:
    1. the longest run of silence (frames below `threshold - 0.15`) lasting at least
       `silence_duration_ms`;
    2. the longest run of frames below `threshold`, however short;
    3. the frame of lowest probability (no silence at all: a cut in speech cannot be
       avoided).
    Equally long runs: the one nearest the target wins.
    """
    limit = round(settings.max_chunk_seconds * RATE)
    earliest = round(settings.window_seconds * RATE)
    target = round(settings.target_chunk_seconds * RATE)
    bounds = [0]
    while samples - bounds[-1] > limit:
        start = bounds[-1]
        end = _cut(probabilities, start + earliest, start + limit, start + target, settings)
        bounds.append(end)
    bounds.append(samples)
    return [
        Chunk(index, first / RATE, last / RATE)
        for index, (first, last) in enumerate(itertools.pairwise(bounds))
    ]


def _cut(probabilities: Floats, low: int, high: int, target: int, settings: ChunkSettings) -> int:
    """Where to cut between samples `low` and `high` (see `choose_cuts`)."""
    first = -(-low // vad.FRAME)  # the frames wholly inside the window
    last = min(high // vad.FRAME, probabilities.size)
    if last <= first:
        return high
    window = probabilities[first:last]
    shortest = max(1, math.ceil(settings.silence_duration_ms / vad.FRAME_MS))
    runs = [r for r in _runs(window < settings.neg_threshold) if r[1] - r[0] >= shortest]
    if not runs:
        runs = _runs(window < settings.threshold)
    if not runs:
        return (first + int(np.argmin(window))) * vad.FRAME + vad.FRAME // 2

    def middle(run: tuple[int, int]) -> int:
        return (2 * first + run[0] + run[1]) * vad.FRAME // 2

    best = max(runs, key=lambda r: (r[1] - r[0], -abs(middle(r) - target)))
    return middle(best)


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """The [start, end) index ranges where `mask` is true."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def encode(decoded: Decoded, chunk: Chunk, fmt: str = "flac") -> bytes:
    """The chunk's audio as a 16 kHz mono 16-bit file, "flac" (lossless, about half the
    size) or "wav", in memory."""
    first, last = round(chunk.start * RATE), round(chunk.end * RATE)
    return encoding.encode(decoded.blocks(first, last), RATE, fmt)
