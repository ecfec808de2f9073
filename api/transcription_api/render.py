"""Response formats: a transcript -> the bytes and content type OpenAI answers with.

`json` is `{"text", "usage"?, "logprobs"?}`, `verbose_json` the whole transcription,
`text` the transcript and a newline, `srt` and `vtt` subtitles from the segments. OpenAI
sends `text`, `srt` and `vtt` as `text/plain; charset=utf-8`; so does every server here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .openai import SEGMENT_FORMATS, ResponseFormat, VerboseTranscription

JSON = "application/json"
PLAIN = "text/plain; charset=utf-8"
CONTENT_TYPES: dict[ResponseFormat, str] = {
    ResponseFormat.JSON: JSON,
    ResponseFormat.VERBOSE_JSON: JSON,
    ResponseFormat.TEXT: PLAIN,
    ResponseFormat.SRT: PLAIN,
    ResponseFormat.VTT: PLAIN,
}


@dataclass(frozen=True)
class Rendered:
    body: bytes
    content_type: str


def render(fmt: ResponseFormat, transcript: dict[str, Any] | VerboseTranscription) -> Rendered:
    """Render a transcript (an engine's JSON answer, or a VerboseTranscription) as `fmt`.

    Raises pydantic's ValidationError when `fmt` needs segments the transcript lacks.
    """
    if isinstance(transcript, VerboseTranscription):
        verbose: VerboseTranscription | None = transcript
        body = transcript.model_dump(exclude_none=True)
    else:
        verbose, body = None, transcript
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
    for key in ("usage", "logprobs"):
        if body.get(key):
            doc[key] = body[key]
    return Rendered(json.dumps(doc, ensure_ascii=False).encode(), JSON)
