"""Per-engine requests: what to ask each engine for, and the client's fields rewritten for it.

vLLM renders no `srt`/`vtt` and answers `text` with JSON; `transformers serve` only ever
returns `{"text"}`. Such engines are asked for what they render (`verbose_json` for
segments, `json` otherwise) and the gateway renders the rest. Every other field the client
sent reaches the engine as sent.
"""

from __future__ import annotations

from transcription_api.openai import ResponseFormat, TranscriptionRequest
from transcription_api.params import field
from transcription_api.render import SEGMENT_FORMATS
from transcription_api.routes import PoolRoute


def engine_format(requested: ResponseFormat, native: frozenset[str]) -> ResponseFormat:
    """The format to ask the engine for, given what it renders itself."""
    if requested.value in native:
        return requested
    if requested in SEGMENT_FORMATS:
        return ResponseFormat.VERBOSE_JSON
    return ResponseFormat.JSON


def engine_fields(
    fields: list[tuple[str, str]], pool: PoolRoute, primary: str, request: TranscriptionRequest
) -> list[tuple[str, str]]:
    """The client's fields for this pool's engine: every one kept, a few rewritten."""
    caps = pool.capability_set
    fmt = engine_format(request.response_format, caps.native_formats)
    out: list[tuple[str, str]] = []
    for k, v in fields:
        if k == "model":
            v = primary  # aliases resolve to the primary model
        elif k == "response_format":
            v = fmt.value
        out.append((k, v))
    if field(fields, "model") is None:
        out.append(("model", primary))
    if field(fields, "response_format") is None and fmt != ResponseFormat.JSON:
        out.append(("response_format", fmt.value))
    chunked = caps.stream_dialect == "openai-chunk"
    if request.stream and chunked and field(fields, "stream_include_usage") is None:
        out.append(("stream_include_usage", "true"))  # usage for transcript.text.done
    return out
