"""Bounded resources per request against clients that would exhaust the gateway (issue
25): every limit here is a field of `FrontendLimits`, the frontend's settings and the
resource's `spec.frontend.limits` alike. The connections' own bounds (headers, connections
per client and in all, draining after early answers) are the protocol's (`connections`).

uvicorn bounds neither how slowly a body arrives nor its whole size, and its
`limit_concurrency` counts connections, not requests. So `Guard`, an ASGI middleware:
requests in flight per process (more: 503 with `Retry-After`; probes and metrics are
exempt), a cap on the whole body, and a body read timeout by byte rate
(`body_timeout_seconds` without a byte, or an average below `body_min_bytes_per_second` once
`body_timeout_seconds` have passed): slow but honest uploads over bad links still get
through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits

from .respond import Reply

# Probes and scrapes answer however busy the gateway is.
EXEMPT = frozenset({"/health", "/ready", "/metrics"})


class Guard:
    """Requests in flight, the whole body's size and its byte rate (module docstring)."""

    def __init__(self, app: ASGIApp, limits: FrontendLimits, body_cap: Callable[[], int]) -> None:
        self.app = app
        self.limits = limits
        self.body_cap = body_cap
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limits.max_concurrency:
            error = APIError(
                503,
                f"The gateway is at its limit of {self.limits.max_concurrency} requests in "
                "flight; retry shortly.",
                code="too_many_requests_in_flight",
                headers={"Retry-After": "1", "Connection": "close"},
            )
            await Reply.error(error).send(send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, self._receive(receive), send)
        finally:
            self.in_flight -= 1

    def _receive(self, receive: Receive) -> Receive:
        limits = self.limits
        cap = limits.max_body_bytes or self.body_cap()
        started = time.monotonic()
        got = 0
        done = False

        async def guarded() -> Message:
            nonlocal got, done
            if done:  # the body is whole: waiting for a disconnect is not reading it
                return await receive()
            try:
                async with asyncio.timeout(limits.body_timeout_seconds):  # no task per chunk
                    message = await receive()
            except TimeoutError:
                raise _slow(
                    f"no byte of the request body for {limits.body_timeout_seconds:g}s"
                ) from None
            if message["type"] != "http.request":
                done = True
                return message
            got += len(message.get("body", b""))
            done = not message.get("more_body", False)
            if got > cap:
                raise APIError(
                    413,
                    f"Request too large: the whole request body is over {cap} bytes.",
                    code="request_too_large",
                    headers={"Connection": "close"},
                )
            elapsed = time.monotonic() - started
            rate = limits.body_min_bytes_per_second
            if not done and elapsed > limits.body_timeout_seconds and got / elapsed < rate:
                raise _slow(f"the request body arrives slower than {rate} bytes/s")
            return message

        return guarded


def _slow(message: str) -> APIError:
    return APIError(408, message, code="body_timeout", headers={"Connection": "close"})
