"""Request ids: accept the client's `x-request-id` or make one, return it, log one line."""

from __future__ import annotations

import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
        finally:
            if scope["path"] not in QUIET_PATHS:
                ms = (time.perf_counter() - start) * 1000
                log.info("%s %s %s %.1fms request_id=%s", scope["method"], scope["path"],
                         status, ms, rid)  # fmt: skip
