"""Forwarding one request to a worker: the body, retries, holds, and the answer.

An audio request's body is re-framed, not re-encoded: each form field as the client sent it
(with `model` and `response_format` rewritten for the engine), then the file streamed from
the spool in 64 KiB pieces (`MultipartBody`); a chat request's is its JSON, encoded as it is
sent (`JsonBody`).
`Forwarder.send` is an `async with`: leaving it releases the worker connection and the
endpoint's in-flight count, however the block ends.

A transcription (or a chat completion) is safe to repeat, so until a byte has gone to the
client a failed attempt is repeated elsewhere: an answer is only taken once its whole body
(or, for a stream, its first piece) has arrived. A worker that cannot be reached, resets
or closes the connection before that, or answers 503, is retried on another endpoint
(another pool, if the first has none left), up to `MAX_ATTEMPTS` in all; one that reset or
closed it and is the only one left still ready is tried again after a backoff
(`RETRY_BACKOFF`): no discovery change may come for it. A connection that
was never made (refused, no route, the connect timed out: `UNREACHED`) proves the worker
got nothing, and costs no attempt: while such endpoints are listed, the tries go on, with
a backoff once every endpoint has failed, for up to `UNREACHED_SECONDS`; once discovery
has removed them, the request is held like any other. A pod can pass its readiness probe
(the kubelet's, from the node) before the pod network lets the gateway reach it: a new
pod's NetworkPolicy rules are programmed by the network's agent when it gets to them,
seconds later on a busy node. When no endpoint is left to try -- a pool scaled to zero,
its only worker restarting -- the request is held (`hold.py`) until discovery brings one;
when the pool's endpoints are all at their bound of requests in flight, it is queued, in
fair order between tenants, until one has room. A request served by a fallback pool
because the pool it prefers had no ready worker counts as that pool's demand while it
runs (`Router.spill`), so that the preferred pool scales up from zero. Every read from a
worker has a timeout (`WorkerTimeouts`); a worker that sends nothing for that long gets
no second try (it may still be working on it) and the client gets 504. The gateway's own
background work (long audio's chunks) says so to the worker in `PRIORITY_HEADER`; a
client's headers are never passed on, so a client's request is always interactive.
The request's audio counts for autoscaling as queued while it is held or queued, then in
flight at the worker that has it, whose decode rate its answer measures (work.py).

The hop to the worker uses aiohttp's client: measured here, it costs 0.5 ms of CPU per
request against httpx's 1.6 ms, which is most of the gateway's latency budget (the
benchmark's target is under 2 ms added at p50).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from transcription_api.errors import APIError, unavailable
from transcription_api.frontend import WorkerTimeouts
from transcription_api.multipart import Upload
from transcription_api.routes import PoolRoute
from transcription_api.worker import BACKGROUND, PRIORITY_HEADER

from . import metrics
from .fair import Flow
from .hold import Holdable, Holds, Place
from .inline import encoded, encoded_length
from .routing import Router
from .tracing import Span, Tracer
from .work import Ticket, Work

log = logging.getLogger("transcription_frontend.forward")

MAX_ATTEMPTS = 3
UNREACHED_SECONDS = 30.0  # how long a request goes on trying endpoints it cannot reach
UNREACHED_BACKOFF = (0.1, 2.0)  # the first wait, doubled after each try, up to the second
RETRY_BACKOFF = (0.5, 2.0)  # the same, before a failed endpoint still ready is tried again
CHUNK = 64 * 1024
SMALL_BODY = 256 * 1024


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", " ")


class MultipartBody:
    """A multipart/form-data body streamed from an Upload, with a known length."""

    def __init__(self, fields: list[tuple[str, str]], upload: Upload) -> None:
        self.boundary = uuid.uuid4().hex
        b = self.boundary.encode()
        self.head = b"".join(
            b"--"
            + b
            + b"\r\n"
            + f'Content-Disposition: form-data; name="{_quote(k)}"\r\n\r\n'.encode()
            + v.encode()
            + b"\r\n"
            for k, v in fields
        )
        self.head += (
            b"--"
            + b
            + b"\r\n"
            + b'Content-Disposition: form-data; name="file"; '
            + f'filename="{_quote(upload.filename)}"\r\n'.encode()
            + f"Content-Type: {upload.file_content_type}\r\n\r\n".encode()
        )
        self.tail = b"\r\n--" + b + b"--\r\n"
        self.upload = upload

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return len(self.head) + self.upload.size + len(self.tail)

    def payload(self) -> bytes | AsyncIterator[bytes]:
        """Small uploads (still in the spool's memory) go as one buffer; large ones stream
        from the spool file without ever being read whole."""
        f = self.upload.file
        assert f is not None
        if self.upload.size <= SMALL_BODY:
            f.seek(0)
            return b"".join((self.head, f.read(), self.tail))
        return self.__aiter__()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        f = self.upload.file
        assert f is not None
        yield self.head
        # Each piece is read at its own offset, seek and read with no await between: a
        # failed attempt's body that is still being sent cannot move a retry's position.
        offset = 0
        while True:
            f.seek(offset)
            chunk = f.read(CHUNK)
            if not chunk:
                break
            offset += len(chunk)
            yield chunk
        yield self.tail


class JsonBody:
    """A JSON request body, encoded piece by piece as it is sent (`inline`): a chat's parsed
    body, or an audio language model's request with the upload inline (`Base64Of`, read
    from the spool), is never also held encoded."""

    content_type = "application/json"
    in_memory = True  # held (hold.py) as it is, against the memory budget

    def __init__(self, value: Any, size: int | None = None) -> None:
        self.value = value
        self.held = size  # what holding it costs (hold.py): the body as it came, or its length

    @functools.cached_property
    def length(self) -> int:
        return encoded_length(self.value)

    def __len__(self) -> int:
        return self.length

    def payload(self) -> bytes | AsyncIterator[bytes]:
        if self.length <= SMALL_BODY:
            return b"".join(encoded(self.value))
        return self.__aiter__()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in encoded(self.value):
            yield piece

    @property
    def size(self) -> int:
        return self.length if self.held is None else self.held

    def to_disk(self) -> None:
        pass


class Body(Protocol):
    """What is sent to a worker; its payload is made afresh for each attempt."""

    @property
    def content_type(self) -> str: ...

    def __len__(self) -> int: ...

    def payload(self) -> bytes | AsyncIterator[bytes]: ...


@dataclass
class WorkerAnswer:
    """A worker's answer that has arrived: its whole body, or a stream's first piece (the
    rest is streamed once, as it comes)."""

    pool: PoolRoute
    url: str
    response: aiohttp.ClientResponse
    body: bytes | None = None  # the whole body (every answer but a 200 stream)
    first: bytes = b""  # a stream's first piece
    spilled_from: str | None = None  # the preferred pool it stands in for (Router.spill)

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def content_type(self) -> str:
        return self.response.headers.get("content-type", "")

    async def read(self) -> bytes:
        if self.body is None:
            self.body = await self.response.read()
        return self.body

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.first:
            yield self.first
        async for chunk in self.response.content.iter_any():
            yield chunk


CONNECT_ERRORS = (
    aiohttp.ClientConnectionError,  # refused, reset, server disconnected, timeouts...
    aiohttp.ClientPayloadError,  # the body broke off
    TimeoutError,
)
# Of those, the ones raised before a connection existed: the worker got nothing.
UNREACHED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


def new_session(timeouts: WorkerTimeouts | None = None) -> aiohttp.ClientSession:
    t = timeouts or WorkerTimeouts()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=None, connect=t.connect_seconds, sock_read=t.read_seconds)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def worker_timed_out(pool: PoolRoute, url: str) -> APIError:
    # The worker's address goes to the log only: clients learn the pool, not the pod's IP.
    log.warning("worker %s of pool %s timed out before answering", url, pool.name)
    return APIError(
        504,
        f"a {pool.engine.value} worker of pool {pool.name} sent nothing for longer "
        "than the frontend's worker read timeout; retry, or split the audio",
        type="server_error",
        code="worker_timeout",
    )


# The path and the body of a request to one pool's engine.
RequestFor = Callable[[PoolRoute], tuple[str, Body]]


class Forwarder:
    def __init__(
        self, router: Router, client: aiohttp.ClientSession, holds: Holds, work: Work,
        tracer: Tracer | None = None,
    ) -> None:  # fmt: skip
        self.router = router
        self.client = client
        self.holds = holds
        self.work = work
        self.tracer = tracer or Tracer()

    @asynccontextmanager
    async def send(
        self, pools: list[PoolRoute], request_for: RequestFor, held: Holdable,
        request_id: str, ticket: Ticket, stream: bool = False, background: bool = False,
        flow: Flow | None = None,
    ) -> AsyncIterator[WorkerAnswer]:  # fmt: skip
        """The answer of the best endpoint of the first pool that has one (retrying on
        failure, holding `held` -- the upload, or the request's body -- while there is
        none, queueing it while they are busy), for as long as the block runs;
        `request_for(pool)` is the path and body for that pool's engine. Traced as `forward`
        (until the answer has been sent), with a `worker` span per attempt and a `hold` or
        `queue` span while it waits. `background`: the request is the gateway's own
        background work (a long request's chunk), and says so to the worker
        (`PRIORITY_HEADER`). `ticket`: the request's audio, for autoscaling and (its seconds
        when it first waits) the fair order; `flow`: its tenant and class there."""
        with self.tracer.span("forward", {"transcription.pools": [p.name for p in pools]}) as span:
            place = Place(flow or Flow(), ticket.seconds)
            answer = await self._send(pools, request_for, held, request_id, ticket, stream,
                                      background, place)  # fmt: skip
            span.set("transcription.pool", answer.pool.name)
            span.set("transcription.engine", answer.pool.engine.value)
            span.set("transcription.worker", answer.url)
            span.set("transcription.spilled_from", answer.spilled_from)
            try:
                yield answer
            finally:
                # A fully read answer's connection is kept alive; a half-read one (the client
                # left, the stream failed) is closed, which stops the worker's work on it.
                answer.response.release()
                self._leave(answer.pool, answer.url, answer.spilled_from, ticket,
                            answered=answer.status == 200)  # fmt: skip
                ticket.close()

    async def _send(
        self, pools: list[PoolRoute], request_for: RequestFor, held: Holdable,
        request_id: str, ticket: Ticket, stream: bool, background: bool, place: Place,
    ) -> WorkerAnswer:  # fmt: skip
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        last_error = "no ready worker"
        busy = False  # the last endpoints tried answered 503: they are up, but full
        attempts = reached = unreached = 0  # tries; of them, those that reached / did not
        unreachable: set[str] = set()  # endpoints that could not be reached, still listed
        give_up_at = 0.0  # once an endpoint could not be reached: the end of the tries
        deadline: float | None = None
        while reached < MAX_ATTEMPTS:
            pool = self.holds.target(pools, tried)
            if pool is None:
                if busy:
                    break
                # Those that discovery removed (a pod gone) are no longer waited on: then
                # the request is held for new endpoints, as long as any held request.
                unreachable &= {u for p in pools for u in self.router.endpoints(p.name)}
                if not unreachable:
                    unreached, give_up_at = 0, 0.0
                elif loop.time() >= give_up_at:
                    last_error += f", for {UNREACHED_SECONDS:g} s"
                    break
                if not self.router.catalog.pool_names & {p.name for p in pools}:
                    raise unavailable(
                        f"the pools this request was routed to ({', '.join(p.name for p in pools)}"
                        ") left the frontend's route table (their deployment is no longer "
                        "routed here); retry"
                    )
                # No endpoint left to try: hold until discovery changes one of the pools, or
                # a backoff passes where no change may come: endpoints still listed that could
                # not be reached, or that failed and are still ready (a reset, a connection
                # closed under the request), which are tried again, MAX_ATTEMPTS bounding it;
                # or until an ejected endpoint of the pools is back (Router.ready_in).
                deadline = deadline or self.holds.deadline()
                ready_in = self.router.ready_in([p.name for p in pools])
                if unreachable:
                    wake_at: float | None = min(loop.time() + _backoff(unreached), give_up_at)
                elif ready_in == 0:
                    wake_at = loop.time() + _backoff(max(reached, 1), RETRY_BACKOFF)
                elif ready_in is not None:
                    wake_at = loop.time() + ready_in
                else:
                    wake_at = None
                ticket.queued(pools[0].name)
                with self.tracer.span("hold", {"transcription.pool": pools[0].name}):
                    await self.holds.wait(pools, held, deadline, place, wake_at)
                tried.clear()
                continue
            url = self.holds.take(pool, tried, place)
            if url is None:  # its endpoints are busy, or others wait before it: queue
                deadline = deadline or self.holds.deadline()
                ticket.queued(pool.name)
                with self.tracer.span("queue", {"transcription.pool": pool.name}):
                    url = await self.holds.queue(pools, pool, place, held, deadline)
                if url is None:  # its pools changed: choose again
                    continue
            tried.add(url)
            if attempts:
                metrics.RETRIES.labels(pool=pool.name).inc()
            attempts += 1
            try:
                with self.tracer.span("worker", {
                    "transcription.pool": pool.name, "transcription.engine": pool.engine.value,
                    "transcription.worker": url, "transcription.attempt": attempts,
                    "http.request.method": "POST",
                }, client=True) as span:  # fmt: skip
                    answer = await self._attempt(pool, url, request_for, request_id,
                                                 ticket, stream, pools[0].name, background,
                                                 span)  # fmt: skip
            except aiohttp.SocketTimeoutError:
                raise worker_timed_out(pool, url) from None
            except CONNECT_ERRORS as e:
                self.router.failed(url, pool.name)
                busy = False
                if isinstance(e, UNREACHED):  # the worker got nothing: no attempt spent
                    unreached += 1
                    unreachable.add(url)
                    give_up_at = give_up_at or loop.time() + UNREACHED_SECONDS
                    log.warning("worker %s of pool %s could not be reached: %r", url, pool.name, e)
                    why = e.__class__.__name__
                    last_error = f"a worker of pool {pool.name} could not be reached ({why})"
                    continue
                reached += 1
                log.warning("worker %s of pool %s failed before answering: %r", url, pool.name, e)
                last_error = (
                    f"a worker of pool {pool.name} failed before answering ({e.__class__.__name__})"
                )
                continue
            if answer is None:
                reached += 1
                self.router.failed(url, pool.name)
                busy = True
                log.info("worker %s of pool %s is overloaded (503)", url, pool.name)
                last_error = f"a worker of pool {pool.name} is overloaded (503)"
                continue
            self.router.succeeded(url)
            return answer
        names = ", ".join(p.name for p in pools)
        raise unavailable(f"no worker could take the request (pools: {names}): {last_error}")

    async def _attempt(
        self, pool: PoolRoute, url: str, request_for: RequestFor, request_id: str,
        ticket: Ticket, stream: bool, preferred: str, background: bool, span: Span,
    ) -> WorkerAnswer | None:  # fmt: skip
        """One try at `url`, whose slot the request has taken (acquired): the answer, once
        what must arrive before the client sees a byte has arrived; None for a 503. The
        endpoint counts the request in flight meanwhile, and after, unless it failed; so does
        the `preferred` pool's spill count, when the request is at a fallback pool because
        the preferred one has no ready worker."""
        spilled = preferred if pool.name != preferred and not self.router.ready(preferred) else None
        if spilled:
            self.router.spill(spilled, 1)
        self.work.started(ticket, pool.name, url, spilled)
        response = None
        try:
            path, body = request_for(pool)
            span.set("url.full", url + path)
            headers = {
                "content-type": body.content_type,
                "content-length": str(len(body)),
                "x-request-id": request_id,
            }
            if background:
                headers[PRIORITY_HEADER] = BACKGROUND
            self.tracer.inject(headers)  # the `worker` span's traceparent (on: tracing.py)
            response = await self.client.post(url + path, data=body.payload(), headers=headers)
            answer = WorkerAnswer(pool, url, response, spilled_from=spilled)
            span.set("http.response.status_code", answer.status)
            if response.status == 503:
                response.close()
                raise _Overloaded
            if stream and response.status == 200:
                answer.first = await response.content.readany()
            else:
                answer.body = await response.read()
            return answer
        except BaseException as e:
            if response is not None:
                response.close()
            self._leave(pool, url, spilled, ticket, answered=False)
            if isinstance(e, _Overloaded):
                return None
            raise

    def _leave(
        self, pool: PoolRoute, url: str, spilled: str | None, ticket: Ticket, answered: bool
    ) -> None:
        """The request is no longer at `url`: the endpoint's and the pools' counts, and the
        ticket's (its audio decoded if `answered`)."""
        self.router.release(url, pool.name)
        if spilled:
            self.router.spill(spilled, -1)
        self.work.ended(ticket, answered)


def _backoff(tries: int, schedule: tuple[float, float] = UNREACHED_BACKOFF) -> float:
    """Seconds to wait before trying again after `tries` (>= 1) failed ones: the schedule's
    first wait, doubled after each try, up to its second."""
    first, most = schedule
    return min(first * 2.0 ** (tries - 1), most)


class _Overloaded(Exception):
    """A worker answered 503."""
