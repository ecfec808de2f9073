"""One committed turn, transcribed by the gateway's own request pipeline.

A turn is sent as the transcription request an HTTP client would send (`stream=true`, a
WAV file, the session's model, language, prompt, keywords and logprobs), straight into
`pipeline.transcribe`: the same key check, alias resolution, capability routing (continuous
pools first), adapters for every engine, retries on another worker, holds while a pool
scales from zero, and metrics. Its `transcript.text.*` events come back as they are
written, so deltas flow while the turn decodes where the pool streams.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import Message, Scope

from transcription_api.capabilities import Capability
from transcription_api.openai import Language, Logprob
from transcription_api.realtime import LOGPROBS, ErrorBody, TranscriptionSession

from ..gateway import Gateway
from ..pipeline import transcribe
from ..routing import NoPool


@dataclass
class Answer:
    text: str = ""
    seconds: float | None = None
    logprobs: list[Logprob] | None = None
    languages: list[Language] | None = None


class TurnFailed(Exception):
    def __init__(self, error: ErrorBody, status: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.status = status


@dataclass
class _Events:
    """The pipeline's response, read as it is sent: a stream's events, or an error body."""

    on_delta: Callable[[str, list[Logprob] | None], Awaitable[None]]
    stream: bool = True
    status: int = 0
    buffer: bytes = b""
    answer: Answer | None = None
    error: ErrorBody | None = None
    body: bytearray = field(default_factory=bytearray)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        if self.status != 200 or not self.stream:
            self.body += chunk
            if message.get("more_body"):
                return
            if self.status != 200:
                self.error = _error_of(bytes(self.body))
            else:  # a whole answer (no pool streams): one delta, then done
                whole = json.loads(self.body)
                whole.setdefault("type", "transcript.text.done")
                await self.on_delta(whole.get("text", ""), None)
                await self._event(json.dumps(whole).encode())
            return
        self.buffer += chunk
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    await self._event(line[5:].strip())

    async def _event(self, data: bytes) -> None:
        if data == b"[DONE]":
            return
        payload = json.loads(data)
        kind = payload.get("type")
        lps = [Logprob.model_validate(x) for x in payload.get("logprobs") or []] or None
        if kind == "transcript.text.delta":
            await self.on_delta(payload.get("delta", ""), lps)
        elif kind == "transcript.text.done":
            usage = payload.get("usage") or {}
            langs = [Language.model_validate(x) for x in payload.get("languages") or []] or None
            seconds = usage.get("seconds") if usage.get("type") == "duration" else None
            self.answer = Answer(payload.get("text", ""), seconds, lps, langs)
        elif kind == "error":
            self.error = ErrorBody.model_validate(payload.get("error") or {"message": "error"})


def _error_of(body: bytes) -> ErrorBody:
    try:
        return ErrorBody.model_validate(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return ErrorBody(message=body.decode("utf-8", "replace")[:500] or "no answer",
                         type="server_error")  # fmt: skip


def request_body(
    wav: bytes, session: TranscriptionSession, stream: bool = True
) -> tuple[bytes, str]:
    """The multipart form of a turn's transcription request, and its content type."""
    t = session.input.transcription
    fields: list[tuple[str, str]] = [("response_format", "json"), ("stream", str(stream).lower())]
    if t.model is not None:
        fields.append(("model", t.model))
    if t.language is not None:
        fields.append(("language", t.language))
    if t.prompt:
        fields.append(("prompt", t.prompt))
    fields += [("languages[]", code) for code in t.languages or []]
    fields += [("keywords[]", word) for word in t.keywords or []]
    if LOGPROBS in (session.include or []):
        fields.append(("include[]", "logprobs"))
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="turn.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + wav
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


async def transcribe_turn(
    gw: Gateway, wav: bytes, session: TranscriptionSession, authorization: bytes | None,
    client: tuple[str, int] | None, request_id: str,
    on_delta: Callable[[str, list[Logprob] | None], Awaitable[None]],
) -> Answer:  # fmt: skip
    """Transcribe one turn through the pipeline; TurnFailed with the error the pipeline
    answered (after its retries and holds). Cancelling it cancels the worker's request."""
    # Streamed where a pool streams; else whole (transformers pools), as one delta.
    streams = not isinstance(
        gw.router.candidates(frozenset({Capability.TRANSCRIPTIONS, Capability.STREAM}), len(wav)),
        NoPool,
    )
    body, content_type = request_body(wav, session, streams)
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *([(b"authorization", authorization)] if authorization else []),
    ]
    http: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/audio/transcriptions", "raw_path": b"",
        "query_string": b"", "root_path": "", "headers": headers,
        "client": client, "server": None,
        "state": {"request_id": request_id},
    }  # fmt: skip
    sent = False
    never = asyncio.Event()  # the "client" of this request never disconnects: cancel instead

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    events = _Events(on_delta, streams)
    await transcribe(gw, Capability.TRANSCRIPTIONS, http, receive, events.send)
    if events.error is not None:
        raise TurnFailed(events.error, events.status)
    if events.answer is None:
        raise TurnFailed(ErrorBody(message="the transcription ended without its last event",
                                   type="server_error"), events.status)  # fmt: skip
    return events.answer
