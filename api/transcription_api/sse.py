"""Server-sent events: writing OpenAI's stream events, reading an engine's stream.

A stream that fails after it began cannot change its status any more: it ends with one
`ErrorEvent` (`{"type": "error", "error": {...}}`) instead of `transcript.text.done`, which
the OpenAI SDK raises as `APIError`. Engines say the same in their own shapes, which
`error_in` recognises.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from .openai import ErrorDetail

MEDIA_TYPE = "text/event-stream"
HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
DONE = b"data: [DONE]\n\n"


def encode(event: BaseModel) -> bytes:
    """One `data:` event."""
    return b"data: " + event.model_dump_json(exclude_none=True).encode() + b"\n\n"


async def payloads(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The `data:` payloads of an event stream, as they arrive."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = [
                line[5:].removeprefix(b" ")
                for line in event.split(b"\n")
                if line.startswith(b"data:")
            ]
            if data:
                yield b"\n".join(data).decode("utf-8", "replace")
    tail = buffer.rstrip(b"\r\n").lstrip()
    if tail.startswith(b"data:"):
        yield tail[5:].removeprefix(b" ").decode("utf-8", "replace")


def error_in(payload: Any) -> ErrorDetail | None:
    """The error a stream event reports, in any shape engines send one, else None.

    `{"type": "error", "error": {...}}` (ours), `{"error": {...}}` (vLLM's error response),
    `{"object": "error", "message": ...}` (vLLM's older one) and `{"error": "<message>"}`
    (transformers serve's).
    """
    if not isinstance(payload, dict):
        return None
    err = payload.get("error")
    if isinstance(err, dict):
        source = err
    elif isinstance(err, str) and err:
        source = {"message": err}  # transformers serve's `{"error": "<message>"}`
    elif payload.get("object") == "error" or payload.get("type") == "error":
        source = payload
    else:
        return None
    message = source.get("message")
    code = source.get("code")
    return ErrorDetail(
        message=str(message) if message else "the engine reported an error",
        type=str(source.get("type") or "server_error"),
        param=source.get("param") if isinstance(source.get("param"), str) else None,
        code=code if isinstance(code, str | int) else None,
    )


_BARE_ERROR = re.compile(r'\{\s*"error"\s*:\s*"(.*)"\s*\}', re.S)


def engine_error(payload: str) -> ErrorDetail | None:
    """The error one event's payload reports, else None; for streams whose other events are
    not JSON too (transformers serve's bare-text deltas). transformers writes its error
    event as `{"error": "<message>"}` without escaping the message, so it need not parse."""
    text = payload.strip()
    if not text.startswith("{"):
        return None
    try:
        return error_in(json.loads(text))
    except ValueError:
        m = _BARE_ERROR.fullmatch(text)
        return ErrorDetail(message=m.group(1), type="server_error") if m else None
