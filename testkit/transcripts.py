"""Transcribing through the official OpenAI client, and the WER report the real-node suites
print."""

from __future__ import annotations

import math
import re
import wave
from pathlib import Path
from typing import Literal

import openai
from openai.types.audio import TranscriptionTextDoneEvent

from testkit.audio import wer


def client(base_url: str) -> openai.OpenAI:
    """The official client against a frontend at `base_url`: no retries, generous timeout."""
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


Format = Literal["json", "text", "srt", "vtt", "verbose_json"]
FORMATS: tuple[Format, ...] = ("json", "text", "srt", "vtt", "verbose_json")
CUE_LINES = re.compile(r"(?m)^(\d+|WEBVTT|.*-->.*)$")


def billed(wav: Path) -> int:
    """The whole seconds a WAV file's answer must report as its usage."""
    with wave.open(str(wav)) as w:
        frames, rate = int(w.getnframes()), int(w.getframerate())
    return math.ceil(frames / rate)


def check_usage(usage: object, wav: Path) -> None:
    """A duration-billed model's usage: the audio's seconds, rounded up (issue 22)."""
    seen = getattr(usage, "model_dump", lambda **_: usage)(exclude_none=True)
    assert seen == {"type": "duration", "seconds": billed(wav)}, seen


def transcribe(c: openai.OpenAI, wav: Path, fmt: Format) -> str:
    """One transcription in `fmt`, as plain words (srt/vtt: the cues' text, which must have
    timings); json and verbose_json must carry the audio's seconds as their usage."""
    with wav.open("rb") as f:
        out = c.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt)
    if not isinstance(out, str):
        check_usage(out.usage, wav)
    text = out if isinstance(out, str) else out.text
    if fmt in ("srt", "vtt"):
        assert "-->" in text, text
        text = CUE_LINES.sub("", text)
    return " ".join(text.split())


def transcribe_all(base_url: str, speech: dict[str, Path]) -> dict[str, float]:
    """Every sentence in a response format of its own (the first sentence again for the
    formats left over), and the last one streamed; returns the WER of each."""
    c = client(base_url)
    items = list(speech.items())
    cases = [(FORMATS[i % len(FORMATS)], s, w) for i, (s, w) in enumerate(items)]
    cases += [(fmt, *items[0]) for fmt in FORMATS[len(items) :]]
    rates = {f"{fmt}: {s}": wer(s, transcribe(c, w, fmt)) for fmt, s, w in cases}
    rates.update(stream_wer(c, speech))
    return rates


def stream_wer(c: openai.OpenAI, speech: dict[str, Path]) -> dict[str, float]:
    """The last sentence streamed: OpenAI's delta events, then done with the whole text."""
    sentence, wav = list(speech.items())[-1]
    with wav.open("rb") as f:
        events = list(c.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    kinds = [e.type for e in events]
    done = events[-1]
    assert isinstance(done, TranscriptionTextDoneEvent), kinds
    assert "transcript.text.delta" in kinds, kinds
    check_usage(done.usage, wav)
    return {f"stream: {sentence}": wer(sentence, done.text)}


def report(path: str, rates: dict[str, float]) -> None:
    mean = sum(rates.values()) / len(rates)
    print(f"\n{path}: {len(rates)} transcriptions, mean WER {mean:.1%}")
    for what, rate in rates.items():
        print(f"  {rate:6.1%}  {what}")
    assert max(rates.values()) <= 0.25, rates
    assert mean <= 0.1, rates
