"""Server-sent events: writing OpenAI's stream events, reading an engine's stream.

A stream that fails after it began cannot change its status any more: it ends with one
`ErrorEvent` (`{"type": "error", "error": {...}}`) instead of `transcript.text.done`, which
the OpenAI SDK raises as `APIError`. Engines say the same in their own shapes, which
`error_in` recognises.
"""

from __future__ import annotations

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
    if buffer.strip().startswith(b"data:"):
        yield buffer.strip()[5:].removeprefix(b" ").decode("utf-8", "replace")


def error_in(payload: Any) -> ErrorDetail | None:
    """The error a stream event reports, in any shape engines send one, else None.

    `{"type": "error", "error": {...}}` (ours), `{"error": {...}}` (vLLM's error response)
    and `{"object": "error", "message": ...}` (vLLM's older one).
    """
    if not isinstance(payload, dict):
        return None
    err = payload.get("error")
    if isinstance(err, dict):
        source = err
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
