"""Replies: what the client gets, sent over ASGI directly; and a worker's failed answer as
the client's error, read in the dialect of its engine.

How each engine's answers become replies is its adapter's business (`adapters/`): an
engine's own rendering passes through untouched where it is what the client asked for,
otherwise the shared renderer turns the engine's JSON into the requested format, and
streams are translated event by event (`streams.py`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Send

from transcription_api import sse
from transcription_api.engines import ErrorDialect
from transcription_api.errors import APIError

from .forward import WorkerAnswer
from .streams import worker_failed


@dataclass
class Reply:
    """What the client gets: a status, headers and a body, or a stream of events."""

    status: int
    content_type: str
    body: bytes = b""
    stream: AsyncIterable[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    seconds: int | None = None  # the audio seconds a transcription is billed for (metering)

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


async def worker_error(answer: WorkerAnswer, dialect: ErrorDialect) -> APIError:
    """A worker's non-200 answer as the client's error, in OpenAI's shape."""
    raw = await answer.read()
    status = answer.status
    fastapi = dialect in (ErrorDialect.FASTAPI, ErrorDialect.VLLM)
    message, param, code, type_ = None, None, None, None
    try:
        doc: Any = json.loads(raw)
        err = sse.error_in(doc)
        if err is not None:
            message, param, type_ = err.message, err.param, err.type
            code = err.code if isinstance(err.code, str) else None
        elif fastapi and isinstance(doc, dict) and "detail" in doc:
            message = str(doc["detail"])  # FastAPI's shape
    except ValueError:
        pass
    if status >= 500 or not message:
        # An engine's bare "Internal Server Error" tells the user nothing: say what failed.
        text = message or raw.decode("utf-8", "replace").strip()[:200] or f"HTTP {status}"
        return worker_failed(answer.pool, f"{status}: {text}")
    if (
        dialect == ErrorDialect.VLLM
        and status == 400
        and type_ == "BadRequestError"
        and "Maximum file size" in message
    ):
        return APIError(413, message, param="file")  # vLLM's 400 for its 25 MB cap
    if fastapi and status == 422:
        status = 400  # FastAPI's status for invalid input; OpenAI's is 400
    return APIError(status, message, param=param, code=code)
