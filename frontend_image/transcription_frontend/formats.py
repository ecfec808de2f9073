"""Response formats the gateway renders itself, and stream translation.

vLLM cannot render `srt`/`vtt` and answers `text` with JSON; `transformers serve` only
ever returns `{"text"}`. The gateway asks such engines for what they can produce
(`verbose_json` for segments, `json` otherwise) and renders the format the client asked
for. Streams are translated event by event into OpenAI's `transcript.text.*` events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from transcription_api.openai import (
    ResponseFormat,
    TextDelta,
    TextDone,
    TokenUsage,
    TranscriptionChunk,
    VerboseTranscription,
)


def engine_format(requested: ResponseFormat, native: frozenset[str]) -> ResponseFormat:
    """The format to ask the engine for, given what it renders itself."""
    if requested.value in native:
        return requested
    if requested in (ResponseFormat.SRT, ResponseFormat.VTT, ResponseFormat.VERBOSE_JSON):
        return ResponseFormat.VERBOSE_JSON
    return ResponseFormat.JSON


def render(requested: ResponseFormat, body: dict[str, Any]) -> tuple[str | dict[str, Any], str]:
    """Render the engine's JSON answer as `requested`: (content, media type)."""
    if requested == ResponseFormat.VERBOSE_JSON:
        return VerboseTranscription.model_validate(body).model_dump(exclude_none=True), "json"
    if requested in (ResponseFormat.SRT, ResponseFormat.VTT):
        v = VerboseTranscription.model_validate(body)
        text = v.to_srt() if requested == ResponseFormat.SRT else v.to_vtt()
        return text, "text/plain; charset=utf-8"
    text = str(body.get("text", ""))
    if requested == ResponseFormat.TEXT:
        return text.strip() + "\n", "text/plain; charset=utf-8"
    out: dict[str, Any] = {"text": text}
    if body.get("usage"):
        out["usage"] = body["usage"]
    if body.get("logprobs"):
        out["logprobs"] = body["logprobs"]
    return out, "json"


def sse(event: TextDelta | TextDone) -> bytes:
    return f"data: {event.model_dump_json(exclude_none=True)}\n\n".encode()


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, as they arrive."""
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


async def translate_stream(chunks: AsyncIterator[bytes], dialect: str) -> AsyncIterator[bytes]:
    """Engine stream -> OpenAI `transcript.text.delta` events, then one `transcript.text.done`."""
    text: list[str] = []
    usage: TokenUsage | None = None
    async for payload in sse_lines(chunks):
        if payload.strip() == "[DONE]":
            break
        if dialect == "raw-text":
            delta = payload
        else:
            try:
                chunk = TranscriptionChunk.model_validate(json.loads(payload))
            except ValueError:
                continue  # not a chunk (a comment, an engine's keep-alive)
            if chunk.usage:
                usage = TokenUsage(
                    input_tokens=chunk.usage.prompt_tokens,
                    output_tokens=chunk.usage.completion_tokens,
                    total_tokens=chunk.usage.total_tokens,
                )
            delta = "".join(c.delta.content for c in chunk.choices)
        if delta:
            text.append(delta)
            yield sse(TextDelta(delta=delta))
    yield sse(TextDone(text="".join(text), usage=usage))
