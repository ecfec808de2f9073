"""Transcribing through the official OpenAI client, and the WER report the real-node suites
print."""

from __future__ import annotations

import re
from pathlib import Path

import openai

from testkit.audio import wer


def client(base_url: str) -> openai.OpenAI:
    """The official client against a frontend at `base_url`: no retries, generous timeout."""
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


def transcribe_all(base_url: str, speech: dict[str, Path]) -> dict[str, float]:
    """Every sentence in every response format, and streamed; returns the WER of each."""
    c = client(base_url)
    rates: dict[str, float] = {}
    for i, (sentence, wav) in enumerate(speech.items()):
        fmt = FORMATS[i % len(FORMATS)]
        with wav.open("rb") as f:
            out = c.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt)
        text = out if isinstance(out, str) else out.text
        if fmt in ("srt", "vtt"):
            assert "-->" in text, text
            text = " ".join(
                line for line in text.splitlines()
                if line.strip() and "-->" not in line and not line.strip().isdigit() and line != "WEBVTT"
            )  # fmt: skip
        rates[f"{fmt}: {sentence}"] = wer(sentence, text)
    for fmt in FORMATS[len(speech) :]:  # the formats the sentences above did not cover
        sentence, wav = next(iter(speech.items()))
        with wav.open("rb") as f:
            out = c.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt)
        text = out if isinstance(out, str) else out.text
        if fmt in ("srt", "vtt"):
            assert "-->" in text, text
        rates[f"{fmt}: {sentence}"] = wer(sentence, re.sub(r"(?m)^(\d+|WEBVTT|.*-->.*)$", "", text))
    rates.update(stream_wer(c, speech))
    return rates


def stream_wer(c: openai.OpenAI, speech: dict[str, Path]) -> dict[str, float]:
    """The last sentence streamed: OpenAI's delta events, then done with the whole text."""
    sentence, wav = list(speech.items())[-1]
    with wav.open("rb") as f:
        events = list(c.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.text.delta" in kinds, kinds
    return {f"stream: {sentence}": wer(sentence, events[-1].text)}


def report(path: str, rates: dict[str, float]) -> None:
    mean = sum(rates.values()) / len(rates)
    print(f"\n{path}: {len(rates)} transcriptions, mean WER {mean:.1%}")
    for what, rate in rates.items():
        print(f"  {rate:6.1%}  {what}")
    assert max(rates.values()) <= 0.25, rates
    assert mean <= 0.1, rates
