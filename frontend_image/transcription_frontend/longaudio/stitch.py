"""Chunks' answers -> one transcript, as if the file had been transcribed whole.

Each chunk was transcribed as its own file (`verbose_json` when the answer needs segments or
words, else `json`). Stitched:
- text: the chunks' texts in order, joined by a space (cuts fall in silences: no word is
  split by a cut, none is repeated);
- segments and words: moved to the whole file's time (a chunk's `start` added), segment ids
  renumbered from 0, each time clamped into its chunk (an engine's last timestamp can run
  past the audio it was given);
- `duration`: the whole file's; `language`: the first chunk's that names one;
- logprobs: the chunks' in order.
`srt`/`vtt` then render from the stitched segments, numbered in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transcription_api.openai import Logprob, Segment, VerboseTranscription, Word

if TYPE_CHECKING:  # `cut` loads PyAV and numpy: only when a request is chunked
    from .cut import Chunk


def stitch(answers: Sequence[tuple[Chunk, dict[str, Any]]], seconds: float) -> VerboseTranscription:
    """One verbose transcription of the whole audio from its chunks' answers, in order."""
    texts: list[str] = []
    segments: list[Segment] = []
    words: list[Word] = []
    language = ""
    has_segments = has_words = False
    for chunk, answer in answers:
        text = str(answer.get("text") or "").strip()
        if text:
            texts.append(text)
        language = language or str(answer.get("language") or "")
        if answer.get("segments") is not None:
            has_segments = True
            for s in answer["segments"]:
                seg = Segment.model_validate(s)
                segments.append(seg.model_copy(update={
                    "id": len(segments), "start": _at(chunk, seg.start),
                    "end": _at(chunk, seg.end),
                }))  # fmt: skip
        if answer.get("words") is not None:
            has_words = True
            words += [
                Word(word=w.word, start=_at(chunk, w.start), end=_at(chunk, w.end))
                for w in (Word.model_validate(x) for x in answer["words"])
            ]
    return VerboseTranscription(
        language=language or "unknown",
        duration=round(seconds, 3),
        text=" ".join(texts),
        segments=segments if has_segments else None,
        words=words if has_words else None,
    )


def logprobs(answers: Sequence[tuple[Chunk, dict[str, Any]]]) -> list[Logprob] | None:
    """The chunks' token log probabilities, in order (None when none has any)."""
    out = [Logprob.model_validate(x) for _, a in answers for x in a.get("logprobs") or []]
    return out or None


def _at(chunk: Chunk, t: float) -> float:
    return round(chunk.start + min(max(t, 0.0), chunk.end - chunk.start), 3)
