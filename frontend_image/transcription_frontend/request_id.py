"""Request ids: accept the client's `x-request-id` or make one, return it, log one line.
And the last resort: an exception that escapes the app before its answer started, or an app
that returns without answering, gets a 500 in OpenAI's shape (uvicorn's own is plain text)."""

from __future__ import annotations

import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transcription_api.errors import APIError

from .errors import internal_error

log = logging.getLogger("transcription_frontend")
QUIET_PATHS = ("/health", "/ready", "/metrics")


def request_id(scope: Scope) -> str:
    return str(scope.get("state", {}).get("request_id", ""))


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:128]
        rid = rid or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        start = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
            if not status:
                await last_resort(send_with_id, RuntimeError("the app returned no answer"))
        except Exception as e:
            if status:
                raise
            await last_resort(send_with_id, e)
        finally:
            if scope["path"] not in QUIET_PATHS:
                ms = (time.perf_counter() - start) * 1000
                log.info("%s %s %s %.1fms request_id=%s", scope["method"], scope["path"],
                         status, ms, rid)  # fmt: skip


async def last_resort(send: Send, e: Exception) -> None:
    error: APIError = internal_error(e)
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": error.body()})
