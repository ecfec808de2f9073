"""The gateway's HTTP connections: uvicorn's httptools protocol (kept for its speed), guarded
against clients that would exhaust them (issues 25 and 37). Every bound here is a field of
`FrontendLimits`.

- **Headers**: httptools has no header size limit (it buffers an unfinished header in
  Python bytes), and neither parser counts headers or times them out. The protocol counts a
  request's header bytes before the parser sees them and its headers, and times out headers
  that do not arrive whole within `header_timeout_seconds`: 431 or 408.
- **Connections**: at most `max_connections_per_client` per client address, and
  `max_connections` in all (uvicorn's `limit_concurrency`, which answered a plain-text 503
  without `Retry-After`, is not used). A connection beyond either gets 503 with
  `Retry-After` as soon as it opens, before its request is read. A WebSocket counts against
  the realtime session limit once upgraded, no longer here.
- **Early answers reach the client.** An answer sent before the whole request arrived (an
  early 4xx or 5xx, a refusal) says `Connection: close`; then the gateway shuts its side
  for writing and reads and discards what the client still sends (nginx's lingering close),
  until the client closes or a bound ends it: `drain_seconds`, `drain_max_bytes`,
  `idle_timeout_seconds` without a byte, or the body's minimum rate
  (`body_min_bytes_per_second`). Closing with unread data would reset the connection, and
  a client still uploading would see the reset instead of the answer. Refused connections
  are drained too, up to as many per client (and in all) as are admitted; beyond, they are
  closed after the answer at once.
- **OpenAI's error shape**, also where uvicorn answered in plain text: a request the parser
  refuses is a 400 `invalid_http` (a bug that escapes the app: the request ids' last resort).
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits

from . import metrics

log = logging.getLogger("transcription_frontend.connections")


def refusal(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response (the protocol answers before any ASGI app runs)."""
    body = APIError(status, message, code=code).body()
    reason = http.HTTPStatus(status).phrase.encode()
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in (headers or {}).items())
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s"
        b"connection: close\r\n\r\n" % (status, reason, len(body), extra)
    ) + body


class Tally:
    """Connections by client address, and in all."""

    def __init__(self) -> None:
        self.by_client: Counter[str] = Counter()
        self.total = 0

    def has_room(self, client: str, per_client: int, total: int) -> bool:
        return self.by_client[client] < per_client and self.total < total

    def add(self, client: str) -> None:
        self.by_client[client] += 1
        self.total += 1

    def remove(self, client: str) -> None:
        self.total -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]


class Linger:
    """Reading and discarding what a client still sends after the gateway's last answer:
    the answer, then the end of the gateway's side (FIN), and the connection closed once the
    client closes or a bound is reached: `drain_seconds`, `drain_max_bytes`, a pause of
    `idle_timeout_seconds`, or (at each check, every `idle_timeout_seconds`) an average rate
    below `body_min_bytes_per_second`, the body's own minimum."""

    def __init__(self, transport: asyncio.Transport, limits: FrontendLimits) -> None:
        self.transport = transport
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.started = self.last = self.loop.time()
        self.read_bytes = 0
        self.timer = self.loop.call_later(self._next_check(), self.check)
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered: the answer goes out whole
        transport.resume_reading()  # uvicorn may have paused it (flow control)

    def _next_check(self) -> float:
        return min(self.limits.idle_timeout_seconds, self.limits.drain_seconds)

    def read(self, n: int) -> None:
        self.read_bytes += n
        self.last = self.loop.time()
        if self.read_bytes > self.limits.drain_max_bytes:
            self.end()

    def check(self) -> None:
        now, lim = self.loop.time(), self.limits
        elapsed = now - self.started
        if (
            elapsed >= lim.drain_seconds
            or now - self.last >= lim.idle_timeout_seconds
            or self.read_bytes < lim.body_min_bytes_per_second * elapsed
        ):
            self.end()
        else:
            self.timer = self.loop.call_later(self._next_check(), self.check)

    def end(self) -> None:
        self.timer.cancel()
        self.transport.close()


class Transport:
    """The connection's transport as uvicorn sees it: closing it is the protocol's business
    (it may linger); once closing, nothing more is written."""

    def __init__(self, real: asyncio.Transport, on_close: Callable[[], None]) -> None:
        self.real = real
        self.on_close = on_close
        self.closing = False

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.on_close()

    def is_closing(self) -> bool:
        return self.closing or self.real.is_closing()

    def write(self, data: bytes) -> None:
        if not self.closing:
            self.real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guards of the module's docstring."""

    limits: FrontendLimits = FrontendLimits()
    admitted: Tally = Tally()  # per server: `guarded_protocol` gives each its own
    refused: Tally = Tally()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.real = transport
        self.wrapped = Transport(transport, self._closed)
        super().connection_made(cast(asyncio.Transport, self.wrapped))
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger: Linger | None = None
        self._lost = self._in_body = self._keep_alive = False
        self._next_request()
        self._address = self.client[0] if self.client else ""
        self._tally: Tally | None = None
        self._admit()

    def _admit(self) -> None:
        """Count the connection in: admitted (its headers timed from now); or refused, and
        drained while there is room for that (else closed after the answer at once)."""
        lim, address = self.limits, self._address
        if self.admitted.has_room(address, lim.max_connections_per_client, lim.max_connections):
            self.admitted.add(address)
            self._tally = self.admitted
            self._arm()
            return
        if self.admitted.by_client[address] >= lim.max_connections_per_client:
            reason = "client"
            message = (f"This client has {lim.max_connections_per_client} connections open to "
                       "the gateway, its limit per client; retry shortly.")  # fmt: skip
        else:
            reason = "total"
            message = (f"The gateway is at its limit of {lim.max_connections} open "
                       "connections; retry shortly.")  # fmt: skip
        metrics.REFUSED_CONNECTIONS.labels(reason=reason).inc()
        if self.refused.has_room(address, lim.max_connections_per_client, lim.max_connections):
            self.refused.add(address)
            self._tally = self.refused
        self._refuse(503, message, "too_many_connections", {"Retry-After": "1"}, quiet=True)

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

    def _refuse(self, status: int, message: str, code: str,
                headers: dict[str, str] | None = None, quiet: bool = False) -> None:  # fmt: skip
        if not self.wrapped.is_closing():
            (log.debug if quiet else log.info)(
                "%s:%s refused: %s", *(self.client or ("?", "?")), message
            )
            self.wrapped.write(refusal(status, message, code, headers))
            self.wrapped.close()

    def _closed(self) -> None:
        """uvicorn, or this protocol, closes the connection: drained first when the client
        may still be sending (module docstring)."""
        self._disarm()
        self._unset_keepalive_if_required()
        started = self._in_body or (self._in_headers and self._header_bytes > 0)
        refused = self._tally is self.refused
        if not self._lost and self._tally is not None and (started or refused):
            self._linger = Linger(self.real, self.limits)
        else:
            self.real.close()

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
        self._lost = True
        self._disarm()
        if self._linger is not None:
            self._linger.timer.cancel()
        if self._tally is not None:
            self._tally.remove(self._address)
            self._tally = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            self._linger.read(len(data))
            return
        if self.wrapped.is_closing():
            return
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
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("The request is not valid HTTP/1.1.")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's plain-text 400, in OpenAI's shape."""
        self._refuse(400, msg, "invalid_http")

    def handle_websocket_upgrade(self) -> None:
        """The WebSocket protocol takes the connection over, with the real transport; it
        counts against the realtime session limit from here on, not against this one's."""
        self._disarm()
        if self._tally is not None:
            self._tally.remove(self._address)
            self._tally = None
        self.transport = self.real
        super().handle_websocket_upgrade()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise ValueError("too many headers")  # the parser stops: data_received answers
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request (an upgrade makes none)
            # An answer that starts before the whole body has arrived says `Connection:
            # close`, and the rest is drained (module docstring); once it has, as asked.
            self._in_body, self._keep_alive = True, self.cycle.keep_alive
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        if self._in_body and not self.cycle.response_started:
            self.cycle.keep_alive = self._keep_alive
        self._in_body = False
        self._next_request()  # the next request's headers: counted and timed from their first byte
        super().on_message_complete()

    def shutdown(self) -> None:
        self._keep_alive = False  # a body still arriving: its answer closes the connection
        super().shutdown()


def guarded_protocol(limits: FrontendLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with these limits and its own tallies."""
    return type(
        "GuardedHttpTools",
        (GuardedHttpToolsProtocol,),
        {"limits": limits, "admitted": Tally(), "refused": Tally()},
    )
