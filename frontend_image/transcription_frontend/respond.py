"""Response shaping: a worker's answer -> the client's response, sent over ASGI directly.

An engine's own rendering passes through untouched where it is what the client asked for;
otherwise the shared renderer turns the engine's JSON into the requested format. Streams
are translated event by event (`streams.py`). Non-200 answers become OpenAI-shaped errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.types import Send

from transcription_api import sse
from transcription_api.engines import Asked
from transcription_api.errors import APIError
from transcription_api.openai import ResponseFormat, TranscriptionRequest
from transcription_api.render import PLAIN, render

from .engines import transcript_of_chat
from .forward import WorkerAnswer
from .streams import Translation, worker_failed


@dataclass
class Reply:
    """What the client gets: a status, headers and a body, or a stream of events."""

    status: int
    content_type: str
    body: bytes = b""
    stream: AsyncIterable[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, e: APIError) -> Reply:
        return cls(e.status, "application/json", e.body(), headers=e.headers)

    async def send(self, send: Send) -> None:
        headers = [(b"content-type", self.content_type.encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        if self.stream is None:
            headers.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        if self.stream is not None:
            async for chunk in self.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": self.body})


async def shape(answer: WorkerAnswer, request: TranscriptionRequest) -> Reply:
    """The client's reply to a worker's answer (raises APIError for a failed one)."""
    if answer.status != 200:
        raise await worker_error(answer)
    if request.stream:
        return Reply(200, sse.MEDIA_TYPE, stream=Translation(answer.chunks(), answer.pool),
                     headers=sse.HEADERS)  # fmt: skip
    raw = await answer.read()
    fmt = request.response_format
    if (
        fmt.value in answer.pool.capability_set.native_formats
        and fmt != ResponseFormat.VERBOSE_JSON
    ):
        # The engine rendered it itself (json is OpenAI's {"text", "usage"} in every engine
        # that renders it): pass it through untouched.
        return Reply(200, answer.content_type or PLAIN, raw)
    body: Any
    if "json" in answer.content_type:
        try:
            body = json.loads(raw)
            if answer.pool.serving.asked == Asked.CHAT:
                body = transcript_of_chat(body)
        except ValueError as e:
            raise worker_failed(answer.pool, f"it sent an unexpected answer: {e}") from e
    else:
        body = {"text": raw.decode("utf-8", "replace")}
    try:
        out = render(fmt, body)
    except ValidationError as e:
        raise worker_failed(answer.pool, f"it sent an unexpected answer: {e}") from e
    return Reply(200, out.content_type, out.body)


async def worker_error(answer: WorkerAnswer) -> APIError:
    """A worker's non-200 answer as the client's error, in OpenAI's shape."""
    raw = await answer.read()
    status = answer.status
    message, param, code, type_ = None, None, None, None
    try:
        doc: Any = json.loads(raw)
        err = sse.error_in(doc)
        if err is not None:
            message, param, type_ = err.message, err.param, err.type
            code = err.code if isinstance(err.code, str) else None
        elif isinstance(doc, dict) and "detail" in doc:
            message = str(doc["detail"])  # FastAPI's shape (transformers serve)
    except ValueError:
        pass
    if status >= 500 or not message:
        # An engine's bare "Internal Server Error" tells the user nothing: say what failed.
        text = message or raw.decode("utf-8", "replace").strip()[:200] or f"HTTP {status}"
        return worker_failed(answer.pool, f"{status}: {text}")
    if status == 400 and type_ == "BadRequestError" and "Maximum file size" in message:
        return APIError(413, message, param="file")  # vLLM's 400 for its 25 MB cap
    if status == 422:
        status = 400  # FastAPI's status for invalid input (transformers serve); OpenAI's is 400
    return APIError(status, message, param=param, code=code)
