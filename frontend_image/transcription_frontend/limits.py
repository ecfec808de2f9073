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
through. A steady trickle just above that floor would hold its slot for hours (issue 37), so
a body must also arrive whole by a deadline that grows with its declared length
(`body_deadline`).

Slots are shared, and one key's slow uploads must not hold them all: `Uploads` counts the
requests whose body is still arriving per key (per client address without keys) and
refuses more than `max_uploads_per_key` with 429. The pipelines count them once the key is
known, before they read the body.

Memory is shared too: `BodyBudget` counts the bytes of request bodies held in memory, all
requests together (a chat completion's JSON, parsed whole once it has arrived: spooled
until then), and refuses a body that would pass `buffered_body_bytes` with 503 and
`Retry-After`, instead of growing until the replica is killed for its memory. Realtime
sessions count their input audio buffers in the same budget (`Held`, resized as a buffer
grows and shrinks); an append that would pass it gets an error event instead. So do a
diarized request's known speaker references (data URLs of audio, up to 4 x 2 MB), held in
memory until it is answered.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
            await self.app(scope, self._receive(scope, receive), send)
        finally:
            self.in_flight -= 1

    def _receive(self, scope: Scope, receive: Receive) -> Receive:
        limits = self.limits
        cap = limits.max_body_bytes or self.body_cap()
        started = time.monotonic()
        declared = content_length(scope)
        deadline = body_deadline(declared, cap, limits)
        got = 0
        done = False

        def late() -> APIError:
            length = f"{declared} bytes" if declared is not None else f"up to {cap} bytes"
            return _slow(
                f"the request body ({length}) did not arrive whole within {deadline:.0f}s: "
                f"bodyTimeoutSeconds ({limits.body_timeout_seconds:g}) plus its length at "
                f"bodyDeadlineBytesPerSecond ({limits.body_deadline_bytes_per_second})"
            )

        async def guarded() -> Message:
            nonlocal got, done
            if done:  # the body is whole: waiting for a disconnect is not reading it
                return await receive()
            left = deadline - (time.monotonic() - started)
            if left <= 0:
                raise late()
            try:  # a timeout, not a task per chunk
                async with asyncio.timeout(min(limits.body_timeout_seconds, left)):
                    message = await receive()
            except TimeoutError:
                # The loop may fire a timer up to its clock's resolution early: which bound
                # was set says which limit ran out, not the clock read after it.
                if left <= limits.body_timeout_seconds:
                    raise late() from None
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


class Uploads:
    """Requests whose body is still arriving, per key (module docstring)."""

    def __init__(self, limits: FrontendLimits) -> None:
        self.limits = limits
        self.by_key: Counter[str] = Counter()

    def start(self, key: str, receive: Receive) -> tuple[Receive, Callable[[], None]]:
        """Count an upload of `key` in (429 past the cap): its `receive`, which counts it
        out once the body is whole, and the call that counts it out when the request ends
        first (either, once)."""
        cap = self.limits.max_uploads_per_key
        if self.by_key[key] >= cap:
            raise APIError(
                429,
                f"This API key (or client, without keys) has {cap} uploads in flight, its "
                "limit (maxUploadsPerKey); retry when one has arrived.",
                code="too_many_uploads",
                headers={"Retry-After": "1"},
            )
        self.by_key[key] += 1
        counted = True

        def end() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.by_key[key] -= 1
                if not self.by_key[key]:
                    del self.by_key[key]

        async def counting() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                end()
            return message

        return counting, end


class BodyBudget:
    """Bytes of request bodies and realtime audio held in memory, all requests and sessions
    together (module docstring)."""

    def __init__(self, limits: FrontendLimits) -> None:
        self.limits = limits
        self.bytes = 0

    def check(self, size: int, what: str) -> None:
        """APIError 503 if `size` more bytes of `what` would pass the budget."""
        cap = self.limits.buffered_body_bytes
        if self.bytes + size > cap:
            raise APIError(
                503,
                f"The gateway holds {self.bytes} bytes of request bodies and realtime audio in "
                f"memory and this {what} of {size} bytes would pass its limit of {cap} bytes "
                "(bufferedBodyBytes); retry shortly.",
                type="server_error",
                code="memory_budget_exceeded",
                headers={"Retry-After": "1"},
            )

    @contextmanager
    def hold(self, size: int, what: str) -> Iterator[None]:
        """Count `size` bytes of `what` in while the block runs (503 if they would pass the
        budget; nothing to hold refuses nothing); out once, however it ends."""
        if size:
            self.check(size, what)
        self.bytes += size
        try:
            yield
        finally:
            self.bytes -= size

    def holder(self, what: str) -> Held:
        """A count that grows and shrinks with what it holds (a realtime session's buffer)."""
        return Held(self, what)


class Held:
    """Bytes one long-lived holder counts in the budget, as what it holds changes: `reserve`
    grows the count unless that would pass the budget (`BodyBudget.check` raises, nothing
    counted); `settle` sets it to what is held now, refusing nothing (the bytes are there).
    `settle(0)` when the holder is gone."""

    def __init__(self, budget: BodyBudget, what: str) -> None:
        self.budget, self.what, self.size = budget, what, 0

    def reserve(self, size: int) -> None:
        if size > self.size:
            self.budget.check(size - self.size, self.what)
        self.settle(size)

    def settle(self, size: int) -> None:
        self.budget.bytes += size - self.size
        self.size = size


def content_length(scope: Scope) -> int | None:
    """The request's declared body length; None without one (or with one that is not a
    number: the parser refuses it)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def body_deadline(declared: int | None, cap: int, limits: FrontendLimits) -> float:
    """Seconds a body of `declared` bytes (None: up to `cap`) has to arrive whole:
    `body_timeout_seconds` plus its length at `body_deadline_bytes_per_second` (inf when
    that is 0), so that the average rate it must keep grows with its size."""
    rate = limits.body_deadline_bytes_per_second
    if not rate:
        return math.inf
    size = cap if declared is None else min(declared, cap)
    return limits.body_timeout_seconds + size / rate


def _slow(message: str) -> APIError:
    return APIError(408, message, code="body_timeout", headers={"Connection": "close"})
