"""Who spoke when, on the wire: OpenAI's `diarized_json`, its known speakers, and the join
of a transcript's timed pieces with speaker turns.

- `DiarizedTranscription` / `DiarizedSegment`: `response_format=diarized_json`, in the shape
  of openai-python's `TranscriptionDiarized` and `TranscriptionDiarizedSegment` (a streamed
  `transcript.text.segment` event is the same object); `tests/test_diarization.py` holds
  them to the installed SDK's types.
- `known_speakers`: `known_speaker_names[]` with `known_speaker_references[]` (data URLs of
  2-10 s of audio each), checked into `KnownSpeaker`s or a 400 naming the field.
- `Turn` and `diarize`: the speaker stage's turns (transcription_worker.speakers) joined to a
  verbose transcript: each word (where the engine gives word times) or segment gets the
  speaker whose turns cover most of it, and the transcript is cut where the speaker changes.

Overlapping speech: turns never overlap (each moment of speech has one speaker, the voice
that dominates the windows around it), so words spoken over someone else go to whoever
dominates that moment.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel

from .errors import APIError, bad_request
from .openai import DurationUsage, VerboseTranscription

NAMES = "known_speaker_names[]"
REFERENCES = "known_speaker_references[]"
MAX_KNOWN_SPEAKERS = 4  # as OpenAI's API
REFERENCE_SECONDS = (2.0, 10.0)  # a reference clip's length, as OpenAI's API asks
MAX_REFERENCE_BYTES = 2 * 1024 * 1024  # 10 s of 48 kHz stereo 16-bit WAV is 1.9 MB
# The form field: the data URL's prefix and the clip in base64.
REFERENCE_FIELD_BYTES = MAX_REFERENCE_BYTES * 4 // 3 + 256
MAX_NAME_CHARS = 64
_DATA_URL = re.compile(
    r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[\w.+-]+=[\w.+-]+)*;base64,(?P<data>.*)", re.S
)
SEGMENT: Literal["transcript.text.segment"] = "transcript.text.segment"


class DiarizedSegment(BaseModel):
    """A piece of the transcript and its speaker; also the streamed segment event."""

    type: Literal["transcript.text.segment"] = SEGMENT
    id: str
    start: float
    end: float
    speaker: str
    text: str


class DiarizedTranscription(BaseModel):
    """`response_format=diarized_json`."""

    task: Literal["transcribe"] = "transcribe"
    duration: float
    text: str
    segments: list[DiarizedSegment]
    usage: DurationUsage | None = None


class SpeakerTurn(BaseModel):
    start: float
    end: float
    speaker: str


class SpeakerTurns(BaseModel):
    """A diarization pool's answer (`POST /v1/audio/diarization` on a worker): who speaks
    when in the whole file, the speakers in order of first turn; the gateway joins it to
    any engine's transcript (`diarize`)."""

    duration: float
    speakers: list[str]
    turns: list[SpeakerTurn]

    def as_turns(self) -> list[Turn]:
        return [Turn(t.start, t.end, t.speaker) for t in self.turns]


@dataclass(frozen=True)
class KnownSpeaker:
    """A name and its reference clip (the decoded bytes of its data URL)."""

    name: str
    media_type: str
    audio: bytes


def known_speakers(names: Sequence[str], references: Sequence[str]) -> list[KnownSpeaker]:
    """The request's known speakers, checked; 400 naming the field for counts that differ,
    more than four, an empty or repeated name, a reference that is no base64 data URL of
    audio, or one too large. (Its length, 2-10 s, is checked where it is decoded.)"""
    if len(names) != len(references):
        raise bad_request(
            f"{len(names)} known_speaker_names[] and {len(references)} "
            "known_speaker_references[]: send one reference per name, in the same order",
            NAMES if len(names) < len(references) else REFERENCES,
        )
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise bad_request(
            f"at most {MAX_KNOWN_SPEAKERS} known_speaker_names[], got {len(names)}", NAMES
        )
    out: list[KnownSpeaker] = []
    for i, (name, reference) in enumerate(zip(names, references, strict=True)):
        name = name.strip()
        if not name or len(name) > MAX_NAME_CHARS:
            raise bad_request(
                f"known_speaker_names[{i}] must be 1-{MAX_NAME_CHARS} characters, got {name!r}",
                NAMES,
            )
        if any(k.name == name for k in out):
            raise bad_request(f"known_speaker_names[] names {name!r} twice", NAMES)
        out.append(KnownSpeaker(name, *_data_url(reference, i)))
    return out


def _data_url(reference: str, i: int) -> tuple[str, bytes]:
    where = f"known_speaker_references[{i}]"
    match = _DATA_URL.fullmatch(reference.strip())
    if match is None:
        shown = reference[:40] + ("..." if len(reference) > 40 else "")
        raise bad_request(
            f"{where} must be a base64 data URL of audio (data:audio/wav;base64,...), got "
            f"{shown!r}",
            REFERENCES,
        )
    media_type = match["type"].lower()
    if not media_type.startswith("audio/"):
        raise bad_request(f"{where} is {media_type}, not audio", REFERENCES)
    data = match["data"]
    if len(data) * 3 // 4 > MAX_REFERENCE_BYTES:
        raise bad_request(
            f"{where} is over {MAX_REFERENCE_BYTES // 1024**2} MB: send 2-10 s of audio",
            REFERENCES,
        )
    try:
        audio = base64.b64decode(re.sub(r"\s+", "", data), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where} is not valid base64", REFERENCES) from None
    if not audio:
        raise bad_request(f"{where} holds no audio", REFERENCES)
    return media_type, audio


def check_reference_length(seconds: float, i: int) -> None:
    """400 unless a reference clip lasts 2-10 s."""
    low, high = REFERENCE_SECONDS
    if not low <= seconds <= high:
        raise APIError(
            400,
            f"known_speaker_references[{i}] lasts {seconds:.1f} s: a reference must be "
            f"{low:g}-{high:g} s of one speaker's voice",
            param=REFERENCES,
        )


# --------------------------------------------------------------------------- the join


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's speech."""

    start: float
    end: float
    speaker: str

    @property
    def duration(self) -> float:
        return self.end - self.start


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
    """A piece of the transcript with its speaker (a diarized segment, less its id)."""

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
        Labelled(s.start, s.end, speaker, s.text.strip())
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


@dataclass(frozen=True)
class _Word:
    start: float
    end: float
    text: str


def diarize(
    transcript: VerboseTranscription, turns: Sequence[Turn], seconds: float | None = None
) -> DiarizedTranscription:
    """A verbose transcript labelled by speaker: by its words where it has them (a segment
    two people share becomes two), else by its segments; `seconds` its duration usage."""
    if transcript.words:
        words = [_Word(w.start, w.end, w.word) for w in transcript.words]
        pieces = by_words(words, turns)
    else:
        pieces = by_segments(transcript.segments or [], turns)
    segments = [
        DiarizedSegment(id=f"seg_{i}", start=p.start, end=p.end, speaker=p.speaker, text=p.text)
        for i, p in enumerate(p for p in pieces if p.text)
    ]
    return DiarizedTranscription(
        duration=transcript.duration,
        text=transcript.text,
        segments=segments,
        usage=DurationUsage(seconds=seconds) if seconds is not None else None,
    )
