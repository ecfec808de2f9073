"""Streaming: a worker's stream -> the client's events, as they arrive.

A transcription stream (`Translation`) becomes OpenAI's `transcript.text.*` events: each
engine delta a `transcript.text.delta`, the end one `transcript.text.done` with the whole
text; the engine's stream is read in the dialect its profile names. A chat stream
(`ChatStream`) passes through event by event. A stream that fails part-way -- the engine
reports an error, the connection drops, the stream stops before the engine said it was done
-- ends with one error event instead, never with a `done` carrying partial text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

from pydantic import ValidationError

from transcription_api import sse
from transcription_api.engines import StreamDialect
from transcription_api.errors import APIError
from transcription_api.openai import (
    ChatChunk,
    DurationUsage,
    Language,
    Logprob,
    TextDelta,
    TextDone,
    TokenUsage,
    TranscriptionChunk,
)
from transcription_api.routes import PoolRoute

from .forward import CONNECT_ERRORS
from .inline import dumps


def worker_failed(pool: PoolRoute, what: str) -> APIError:
    """The client's error when a pool's worker failed: which pool, which engine, what."""
    return APIError(
        502,
        f"the {pool.engine.value} worker of pool {pool.name} failed to process the request "
        f"({what}); check that the file is valid audio, then retry",
        type="server_error",
        code="worker_error",
    )


# aiohttp's read timeout (the settings' `worker_timeouts.read_seconds`), or the connection broke.
STREAM_ERRORS = (TimeoutError, *CONNECT_ERRORS)


def stream_failed(pool: PoolRoute, e: BaseException) -> APIError:
    """The client's error when a worker's stream failed part-way (one of STREAM_ERRORS)."""
    if isinstance(e, TimeoutError):
        what = "its stream sent nothing for longer than the worker read timeout"
        return worker_failed(pool, what)
    return worker_failed(pool, f"its stream broke off: {e.__class__.__name__}")


class EventStream:
    """A worker's stream as the client gets it, event by event; `error` is set if it failed
    (and the client got an error event for it)."""

    # Sent last, after the events and any error event.
    closing = b""

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
        if self.closing:
            yield self.closing

    def _events(self) -> AsyncIterator[bytes]:
        """The client's events; sets `error` and stops where the stream failed."""
        raise NotImplementedError


class Translation(EventStream):
    """The OpenAI event stream of one engine's transcription stream, read in its dialect."""

    def __init__(
        self, chunks: AsyncIterator[bytes], pool: PoolRoute, dialect: StreamDialect,
        seconds: int | None = None, languages: Sequence[str] = (),
    ) -> None:  # fmt: skip
        super().__init__(chunks, pool)
        self.dialect = dialect
        self.seconds = seconds  # the audio's billed seconds: the done event's usage
        self.languages = [Language(code=c) for c in languages]  # the done event's languages

    async def _events(self) -> AsyncIterator[bytes]:
        raw_text = self.dialect == StreamDialect.RAW_TEXT
        # A chat stream (a transcription through chat) is one chunk model minus the
        # transcription.chunk fields; it ends with a finish_reason (transformers: no [DONE]).
        chat = self.dialect == StreamDialect.CHAT_CHUNK
        chunk_model = ChatChunk if chat else TranscriptionChunk
        text: list[str] = []
        logprobs: list[Logprob] | None = None  # where the engine sends them (asked for)
        usage: DurationUsage | TokenUsage | None = None
        if self.seconds is not None:
            usage = DurationUsage(seconds=self.seconds)
        finished = raw_text  # bare-text streams end without [DONE]
        async for payload in sse.payloads(self.chunks):
            if payload.strip() == "[DONE]":
                finished = True
                break
            if raw_text:
                if (err := sse.engine_error(payload)) is not None:
                    self.error = worker_failed(self.pool, f"mid-stream: {err.message}")
                    return
                delta, delta_logprobs = payload, None
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
                if chunk.usage and self.seconds is None:
                    u = chunk.usage
                    usage = TokenUsage(
                        input_tokens=u.prompt_tokens,
                        output_tokens=u.completion_tokens,
                        total_tokens=u.total_tokens,
                    )
                delta = "".join(c.delta.content for c in chunk.choices)
                sent = [c.logprobs for c in chunk.choices if c.logprobs is not None]
                delta_logprobs = [lp for lps in sent for lp in lps] if sent else None
                if delta_logprobs is not None:
                    logprobs = (logprobs or []) + delta_logprobs
            if delta:
                text.append(delta)
                yield sse.encode(TextDelta(delta=delta, logprobs=delta_logprobs))
        if not finished:
            self.error = worker_failed(self.pool, "its stream ended before the transcript did")
            return
        done = TextDone(
            text="".join(text), logprobs=logprobs, usage=usage, languages=self.languages or None
        )
        yield sse.encode(done)


class ChatStream(EventStream):
    """A worker's chat stream as the client gets it, event by event: `model` rewritten to
    the primary name, engine errors in OpenAI's shape, and `data: [DONE]` last (transformers
    serve does not send it). It fails if it ended before a choice finished, broke off, or
    the engine reported an error."""

    closing = sse.DONE

    def __init__(self, chunks: AsyncIterator[bytes], pool: PoolRoute, primary: str) -> None:
        super().__init__(chunks, pool)
        self.primary = primary

    async def _events(self) -> AsyncIterator[bytes]:
        finished = False
        async for payload in sse.payloads(self.chunks):
            if payload.strip() == "[DONE]":
                return
            try:
                doc = json.loads(payload)
                err = sse.error_in(doc)
            except ValueError:
                doc, err = None, sse.engine_error(payload)  # transformers' unescaped error
                if err is None:
                    continue  # not an event
            if err is not None:
                self.error = worker_failed(self.pool, f"mid-stream: {err.message}")
                return
            if isinstance(doc, dict):
                if "model" in doc:
                    doc["model"] = self.primary
                choices = doc.get("choices") or []
                finished = finished or any(
                    isinstance(c, dict) and c.get("finish_reason") for c in choices
                )
            yield b"data: " + dumps(doc) + b"\n\n"
        if not finished:
            self.error = worker_failed(self.pool, "its stream ended before the answer did")
