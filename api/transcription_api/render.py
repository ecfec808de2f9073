"""Response formats: a transcript -> the bytes and content type OpenAI answers with.

`json` is `{"text", "usage"?, "logprobs"?, "languages"?}`, `verbose_json` the whole transcription,
`text` the transcript and a newline, `srt` and `vtt` subtitles from the segments. OpenAI
sends `text`, `srt` and `vtt` as `text/plain; charset=utf-8`; so does every server here.

`usage` is what a duration-billed model answers: `{"type": "duration", "seconds"}`, the
audio's length rounded up to whole seconds as OpenAI and vLLM count it (`billed_seconds`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .openai import (
    SEGMENT_FORMATS,
    DurationUsage,
    Language,
    Logprob,
    ResponseFormat,
    VerboseTranscription,
)

JSON = "application/json"
PLAIN = "text/plain; charset=utf-8"
CONTENT_TYPES: dict[ResponseFormat, str] = {
    ResponseFormat.JSON: JSON,
    ResponseFormat.VERBOSE_JSON: JSON,
    ResponseFormat.TEXT: PLAIN,
    ResponseFormat.SRT: PLAIN,
    ResponseFormat.VTT: PLAIN,
    ResponseFormat.DIARIZED_JSON: JSON,
}


@dataclass(frozen=True)
class Rendered:
    body: bytes
    content_type: str


def billed_seconds(transcript: dict[str, Any], known: float | None = None) -> int | None:
    """The whole seconds of audio an answer is billed for: from the engine's answer (a
    verbose transcription's `duration`, else its duration usage), else `known` (the
    gateway's own reading of the upload); None when neither says."""
    duration = transcript.get("duration")
    usage = transcript.get("usage")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        seconds: float | None = float(duration)
    elif isinstance(usage, dict) and usage.get("type") == "duration":
        seconds = usage.get("seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) else known
    else:
        seconds = known
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return math.ceil(seconds - 1e-6)  # 4.8 s -> 5; an exact 5.0 stays 5


def render(
    fmt: ResponseFormat,
    transcript: dict[str, Any] | VerboseTranscription,
    seconds: int | None = None,
    languages: list[Language] | None = None,
    logprobs: list[Logprob] | None = None,
) -> Rendered:
    """Render a transcript (an engine's JSON answer, or a VerboseTranscription) as `fmt`;
    json and verbose_json carry `seconds` as their duration usage where it is given, json
    the `languages` and `logprobs` given.

    Raises pydantic's ValidationError when `fmt` needs segments the transcript lacks.
    """
    if isinstance(transcript, VerboseTranscription):
        verbose: VerboseTranscription | None = transcript
        body = transcript.model_dump(exclude_none=True)
    else:
        verbose, body = None, transcript
    if languages is not None:
        body = {**body, "languages": [lang.model_dump() for lang in languages]}
    if logprobs is not None:
        body = {**body, "logprobs": [lp.model_dump() for lp in logprobs]}
    if seconds is not None:
        usage = DurationUsage(seconds=seconds)
        body = {**body, "usage": usage.model_dump()}
        if verbose is not None:
            verbose = verbose.model_copy(update={"usage": usage})
    if fmt in SEGMENT_FORMATS:
        v = verbose or VerboseTranscription.model_validate(body)
        if fmt == ResponseFormat.SRT:
            out = v.to_srt()
        elif fmt == ResponseFormat.VTT:
            out = v.to_vtt()
        else:
            return Rendered(v.model_dump_json(exclude_none=True).encode(), JSON)
        return Rendered(out.encode(), PLAIN)
    text = str(body.get("text", ""))
    if fmt == ResponseFormat.TEXT:
        return Rendered((text.strip() + "\n").encode(), PLAIN)
    doc: dict[str, Any] = {"text": text}
    for key in ("usage", "logprobs", "languages"):
        if body.get(key) or (key == "languages" and key in body):  # [] says: none detected
            doc[key] = body[key]
    return Rendered(json.dumps(doc, ensure_ascii=False).encode(), JSON)
