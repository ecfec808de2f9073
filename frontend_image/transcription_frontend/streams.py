"""Streaming: an engine's stream -> OpenAI's `transcript.text.*` events, as they arrive.

Each engine delta becomes a `transcript.text.delta`; the end, one `transcript.text.done`
with the whole text. A stream that fails part-way -- the engine reports an error, the
connection drops, the stream stops before the engine said it was done -- ends with one
error event instead, never with a `done` carrying partial text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from pydantic import ValidationError

from transcription_api import sse
from transcription_api.errors import APIError
from transcription_api.openai import (
    ChatChunk,
    TextDelta,
    TextDone,
    TokenUsage,
    TranscriptionChunk,
)
from transcription_api.routes import PoolRoute

from .forward import CONNECT_ERRORS


def worker_failed(pool: PoolRoute, what: str) -> APIError:
    """The client's error when a pool's worker failed: which pool, which engine, what."""
    return APIError(
        502,
        f"the {pool.engine.value} worker of pool {pool.name} failed to process the request "
        f"({what}); check that the file is valid audio, then retry",
        type="server_error",
        code="worker_error",
    )


# aiohttp's read timeout (--worker-read-timeout), or the connection broke.
STREAM_ERRORS = (TimeoutError, *CONNECT_ERRORS)


def stream_failed(pool: PoolRoute, e: BaseException) -> APIError:
    """The client's error when a worker's stream failed part-way (one of STREAM_ERRORS)."""
    if isinstance(e, TimeoutError):
        what = "its stream sent nothing for longer than the worker read timeout"
        return worker_failed(pool, what)
    return worker_failed(pool, f"its stream broke off: {e.__class__.__name__}")


class Translation:
    """The OpenAI event stream of one engine stream; `error` is set if it failed."""

    def __init__(self, chunks: AsyncIterator[bytes], pool: PoolRoute) -> None:
        self.chunks = chunks
        self.pool = pool
        self.error: APIError | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for event in self._events():
                yield event
        except STREAM_ERRORS as e:
            self.error = stream_failed(self.pool, e)
        if self.error is not None:
            yield sse.encode(self.error.event())

    async def _events(self) -> AsyncIterator[bytes]:
        dialect = self.pool.serving.stream_dialect
        raw_text = dialect == "raw-text"
        # A chat stream (a transcription through chat) is one chunk model minus the
        # transcription.chunk fields; it ends with a finish_reason (transformers: no [DONE]).
        chat = dialect == "chat-chunk"
        chunk_model = ChatChunk if chat else TranscriptionChunk
        text: list[str] = []
        usage: TokenUsage | None = None
        finished = raw_text  # bare-text streams end without [DONE]
        async for payload in sse.payloads(self.chunks):
            if payload.strip() == "[DONE]":
                finished = True
                break
            if raw_text:
                if (err := sse.engine_error(payload)) is not None:
                    self.error = worker_failed(self.pool, f"mid-stream: {err.message}")
                    return
                delta = payload
            else:
                try:
                    doc = json.loads(payload)
                except ValueError:
                    continue  # not an event (a comment, an engine's keep-alive)
                if (err := sse.error_in(doc)) is not None:
                    self.error = worker_failed(self.pool, f"mid-stream: {err.message}")
                    return
                try:
                    chunk = chunk_model.model_validate(doc)
                except ValidationError:
                    continue
                finished = finished or (chat and any(c.finish_reason for c in chunk.choices))
                if chunk.usage:
                    u = chunk.usage
                    usage = TokenUsage(
                        input_tokens=u.prompt_tokens,
                        output_tokens=u.completion_tokens,
                        total_tokens=u.total_tokens,
                    )
                delta = "".join(c.delta.content for c in chunk.choices)
            if delta:
                text.append(delta)
                yield sse.encode(TextDelta(delta=delta))
        if not finished:
            self.error = worker_failed(self.pool, "its stream ended before the transcript did")
            return
        yield sse.encode(TextDone(text="".join(text), usage=usage))
