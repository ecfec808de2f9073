"""Who said each piece of a transcript: ASR segments or words joined to speaker turns.

Each piece (anything with `start` and `end` seconds) gets the speaker whose turns cover
most of it; one that overlaps no turn (said in what the VAD took for silence) gets the
speaker of the nearest turn. Where the engine gives word times, `by_words` labels each word
and cuts the transcript where the speaker changes, so a segment two people share becomes
two segments.

Overlapping speech: turns never overlap (each moment of speech has one speaker, the voice
that dominates the windows around it), so words spoken over someone else are given to
whoever dominates that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .turns import Turn


class Timed(Protocol):
    @property
    def start(self) -> float: ...

    @property
    def end(self) -> float: ...


class TimedText(Timed, Protocol):
    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class Labelled:
    """A piece of the transcript with its speaker (OpenAI's diarized segment, less its id)."""

    start: float
    end: float
    speaker: str
    text: str


def speaker_of(start: float, end: float, turns: Sequence[Turn]) -> str | None:
    """The speaker covering most of [start, end]; the nearest turn's if none overlaps it;
    None when there are no turns."""
    if end < start:
        raise ValueError(f"a piece of the transcript ends ({end}) before it starts ({start})")
    if not turns:
        return None
    covered: dict[str, float] = {}
    for t in turns:
        overlap = min(end, t.end) - max(start, t.start)
        if overlap > 0:
            covered[t.speaker] = covered.get(t.speaker, 0.0) + overlap
    if covered:
        return max(covered, key=lambda s: covered[s])
    middle = (start + end) / 2
    nearest = min(turns, key=lambda t: max(t.start - middle, middle - t.end, 0.0))
    return nearest.speaker


def label(pieces: Sequence[Timed], turns: Sequence[Turn], default: str = "A") -> list[str]:
    """Each piece's speaker (`default` when there are no turns)."""
    return [speaker_of(p.start, p.end, turns) or default for p in pieces]


def by_segments(
    segments: Sequence[TimedText], turns: Sequence[Turn], default: str = "A"
) -> list[Labelled]:
    """Segments as they are, each with the speaker covering most of it."""
    return [
        Labelled(s.start, s.end, speaker, s.text)
        for s, speaker in zip(segments, label(segments, turns, default), strict=True)
    ]


def by_words(
    words: Sequence[TimedText], turns: Sequence[Turn], default: str = "A"
) -> list[Labelled]:
    """Words grouped into segments of one speaker each: a new segment wherever the speaker
    changes. A word's text keeps its own spacing (Whisper's words start with a space)."""
    out: list[Labelled] = []
    for w, speaker in zip(words, label(words, turns, default), strict=True):
        if out and out[-1].speaker == speaker:
            last = out[-1]
            out[-1] = Labelled(last.start, w.end, speaker, last.text + w.text)
        else:
            out.append(Labelled(w.start, w.end, speaker, w.text))
    return [Labelled(s.start, s.end, s.speaker, s.text.strip()) for s in out]
