"""Bounded resources per connection and per process, against clients that would exhaust
the gateway (issue 25): every limit here is a field of `FrontendLimits`, the frontend's
settings and the resource's `spec.frontend.limits` alike.

What uvicorn gives, and what it does not:
- httptools (uvicorn's default parser, kept for its speed) has no header size limit: the
  parser accumulates a header in Python bytes, so an unfinished 20 MB header costs its
  size and more. h11 mode bounds it (`h11_max_incomplete_event_size`), but neither mode
  times out an unfinished header, nor counts headers.
- `timeout_keep_alive` closes idle connections between requests only: it is the idle
  timeout here (`idle_timeout_seconds`).
- `limit_concurrency` counts connections and tasks and answers a plain-text 503 without
  `Retry-After`: it is the connection backstop here (`max_connections`), not the request
  limit.
- Nothing bounds how slowly a body arrives, nor its whole size.

So two small guards:
- `guarded_protocol(limits)`: uvicorn's httptools protocol, counting a request's header
  bytes (before the parser sees them) and headers, and timing out headers that do not
  arrive whole within `header_timeout_seconds`: 431 or 408, and the connection is closed.
- `Guard`, an ASGI middleware: requests in flight per process (more: 503 with
  `Retry-After`; probes and metrics are exempt), a cap on the whole body, and a body read
  timeout by byte rate (`body_timeout_seconds` without a byte, or an average below
  `body_min_bytes_per_second` once `body_timeout_seconds` have passed): slow but honest
  uploads over bad links still get through.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httptools
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits

from .respond import Reply

log = logging.getLogger("transcription_frontend.limits")

# Probes and scrapes answer however busy the gateway is.
EXEMPT = frozenset({"/health", "/ready", "/metrics"})


def _refusal(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response (the protocol answers before any ASGI app runs)."""
    body = APIError(status, message, code=code).body()
    reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, reason, len(body))
    ) + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header limits (see the module's docstring)."""

    limits: FrontendLimits = FrontendLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._next_request()
        self._arm()

    def _next_request(self) -> None:
        self._in_headers, self._header_bytes, self._header_count, self._tail = True, 0, 0, b""

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_seconds, self._headers_too_slow
            )

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            log.info("%s:%s refused: %s", *(self.client or ("?", "?")), message)
            self.transport.write(_refusal(status, message, code))
            self.transport.close()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers:
            self._refuse(
                408,
                "the request's headers did not arrive within "
                f"{self.limits.header_timeout_seconds:g}s",
                "header_timeout",
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            window = self._tail + data
            end = window.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._tail = window[-3:]
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(
                    431,
                    f"the request's headers are over {self.limits.max_header_bytes} bytes",
                    "headers_too_large",
                )
                return
            self._arm()
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._header_count > self.limits.max_headers:
                self._refuse(
                    431,
                    f"the request has more than {self.limits.max_headers} headers",
                    "too_many_headers",
                )
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise ValueError("too many headers")  # the parser stops: data_received answers
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._next_request()  # the next request's headers: counted and timed from their first byte
        super().on_response_complete()


def guarded_protocol(limits: FrontendLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with these limits."""
    return type("GuardedHttpTools", (GuardedHttpToolsProtocol,), {"limits": limits})


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
