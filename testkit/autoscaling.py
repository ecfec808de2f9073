"""A pool scaled by KEDA's HPA on the frontend's signal, under steady clients, on a virtual
clock: issue 34's flapping case without a cluster (tests/test_scaling_signal.py,
`python -m bench scale`).

The frontend's own accounting runs for real: the router's in-flight counts and its choice
of endpoint, each request's audio ticket (counted from its WAV header as the upload arrives,
through `parse_upload`'s hook) and the decode meters (`transcription_frontend.work`), the
load report and the scaler's metric (`transcription_frontend.load`). Around it the model
plays:
- the clients: each sends a request of `audio_seconds`, whose upload takes `upload` seconds
  and its parsing `parse`, waits for the answer, and sends the next `think` seconds later;
- the workers: one request at a time each (a sequential pool), `decode` seconds each, first
  come first served; or (`batch`) every request waiting when a batch starts, together in
  `decode` seconds (a continuous pool: the clients' answers come together);
- the HPA: every `sync` seconds it reads the metric; desired = ceil(value / target) (an
  external metric's AverageValue), unless value / (target x current) is within `tolerance`
  of 1; it scales up at once, down to the highest count desired over the last
  `scale_down_window` seconds (the ScaledObject's scaleDownDelay); a new replica takes
  requests `ready_after` seconds after it is asked for; one scaled away finishes the
  requests it has.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from testkit.audio import tone_wav
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.multipart import FILE_HEAD
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.hold import Holds
from transcription_frontend.load import Load, total, work_seconds
from transcription_frontend.realtime.sessions import Sessions
from transcription_frontend.routing import Router
from transcription_frontend.work import Ticket, Work

POOL = "seq"


class Signal(StrEnum):
    """What the HPA scales on."""

    REQUESTS = "requests in flight + held"  # before issue 34, target: requests per replica
    AUDIO = "audio-seconds / decode rate"  # issue 34, target: targetQueueSeconds
    # The same, but a request's audio counted only once its upload has been parsed: what
    # counting from the header, during the upload, buys.
    AUDIO_AFTER_UPLOAD = "audio-seconds, counted after the upload"
    # The audio now, without its recent average (before issue 36): a batching pool's
    # clients, between their answers and their next requests, leave it at nothing.
    AUDIO_NOW = "audio-seconds now / decode rate"


@dataclass(frozen=True)
class Clients:
    count: int = 4
    audio_seconds: float = 4.0
    upload: float = 2.0  # seconds the upload takes to arrive
    parse: float = 1.0  # seconds the frontend takes to parse it (a busy node)
    decode: float = 1.5  # seconds a worker takes for one request (for a batch: `batch`)
    think: float = 0.0  # seconds between an answer and the client's next request
    batch: bool = False  # workers decode every request waiting together
    stagger: float = 0.7  # seconds between the clients' first requests


@dataclass(frozen=True)
class Hpa:
    sync: float = 15.0  # the HPA controller's sync period
    tolerance: float = 0.1
    scale_down_window: float = 20.0
    ready_after: float = 30.0
    min_replicas: int = 1
    max_replicas: int = 2
    requests_per_replica: float = 1.0  # the REQUESTS signal's target
    target_queue_seconds: float = 4.0  # the AUDIO signals' target
    default_rate: float = 4.0  # audio seconds a replica decodes a second, until measured


def desired(current: int, value: float, target: float, tolerance: float) -> int:
    """The HPA's replica count for an AverageValue metric (before min/max and windows)."""
    if current and abs(value / (target * current) - 1) <= tolerance:
        return current
    return math.ceil(value / target)


@dataclass
class Run:
    """What the HPA read and asked for at each sync, and the clients' request times (from
    the upload's start to the answer)."""

    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def changes(self) -> int:
        """How often the replica count changed."""
        return sum(1 for a, b in itertools.pairwise(self.replicas) if a != b)

    def after(self, seconds: float) -> list[int]:
        """The replica counts from `seconds` on."""
        return [r for t, r in zip(self.times, self.replicas, strict=True) if t >= seconds]


class _Model:
    def __init__(self, signal: Signal, clients: Clients, hpa: Hpa) -> None:
        self.signal, self.clients, self.hpa = signal, clients, hpa
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        pool = PoolRoute(name=POOL, engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL,
                         service="svc-seq")  # fmt: skip
        self.router = Router(RouteTable(model="m", pools=[pool]))
        self.work = Work(clock=lambda: self.now, smooth=0 if signal == Signal.AUDIO_NOW else None)
        self.load = Load(self.router, Holds(self.router), Sessions(FrontendLimits()), self.work)
        self.file = tone_wav(clients.audio_seconds)
        self.queues: dict[str, deque[Ticket]] = {}  # each worker's requests, the first decoding
        self.decoding: dict[str, int] = {}  # how many of its first requests it decodes now
        self.sent: dict[Ticket, float] = {}  # when each request's upload began
        self.ready: list[str] = []  # taking requests
        self.starting: list[str] = []  # asked for, not ready yet
        self.replicas = 0
        self.recommended: list[tuple[float, int]] = []
        self.run = Run()

    def at(self, delay: float, event: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._order), event))

    def simulate(self, seconds: float) -> Run:
        self.scale_to(self.hpa.min_replicas, at_once=True)
        for i in range(self.clients.count):  # staggered, as clients that start together drift
            self.at(i * self.clients.stagger, self.send)
        self.at(self.hpa.sync, self.sync)
        while self._events and self._events[0][0] <= seconds:
            self.now, _, event = heapq.heappop(self._events)
            event()
        return self.run

    # ------------------------------------------------------------------ a client's request

    def send(self) -> None:
        c = self.clients
        ticket = self.work.ticket()
        self.sent[ticket] = self.now
        if self.signal != Signal.AUDIO_AFTER_UPLOAD:  # the frontend's hook, on the WAV's head
            ticket.expect(POOL)  # the deployment's first pool: its only one
            heard = ticket.on_file_head(str(len(self.file) + 200))  # the form around it
            assert heard is not None
            self.at(c.upload * FILE_HEAD / len(self.file), lambda: heard(self.file[:FILE_HEAD]))
        self.at(c.upload + c.parse, lambda: self.forward(ticket))

    def forward(self, ticket: Ticket) -> None:
        ticket.count(self.clients.audio_seconds, POOL)  # parsed: as the pipeline counts it
        url = self.router.pick(POOL, set())
        assert url is not None, "the model keeps one replica at least"
        self.router.acquire(url, POOL)
        self.work.started(ticket, POOL, url, None)
        self.queues[url].append(ticket)
        if not self.decoding.get(url):
            self.decode(url)

    def decode(self, url: str) -> None:
        """The worker starts on its first request, or (`batch`) on all it has."""
        self.decoding[url] = len(self.queues[url]) if self.clients.batch else 1
        self.at(self.clients.decode, lambda: self.answered(url))

    def answered(self, url: str) -> None:
        for _ in range(self.decoding.pop(url)):
            ticket = self.queues[url].popleft()
            self.router.release(url, POOL)
            self.work.ended(ticket, answered=True)
            ticket.close()
            self.run.latencies.append(self.now - self.sent.pop(ticket))
            self.at(self.clients.think, self.send)  # the client's next request
        if self.queues[url]:
            self.decode(url)

    # ------------------------------------------------------------------ the HPA

    def value(self) -> tuple[float, float]:
        """The metric and its target per replica."""
        reports = [self.load.local()]
        if self.signal == Signal.REQUESTS:
            return total(reports, POOL), self.hpa.requests_per_replica
        tqs = self.hpa.target_queue_seconds
        return work_seconds(reports, POOL, tqs, self.hpa.default_rate), tqs

    def sync(self) -> None:
        h = self.hpa
        value, target = self.value()
        want = min(max(desired(self.replicas, value, target, h.tolerance), h.min_replicas),
                   h.max_replicas)  # fmt: skip
        self.recommended = [
            (t, r) for t, r in self.recommended if self.now - t < h.scale_down_window
        ]
        self.recommended.append((self.now, want))
        if want < self.replicas:
            want = max(r for _, r in self.recommended)
        if want != self.replicas:
            self.scale_to(want)
        self.run.times.append(self.now)
        self.run.values.append(value)
        self.run.replicas.append(self.replicas)
        self.at(h.sync, self.sync)

    def scale_to(self, replicas: int, at_once: bool = False) -> None:
        for _ in range(self.replicas, replicas):
            url = f"http://worker-{len(self.queues)}:8000"
            self.queues[url] = deque()
            if at_once:
                self.ready.append(url)
            else:
                self.starting.append(url)
                self.at(self.hpa.ready_after, functools.partial(self.became_ready, url))
        for _ in range(replicas, self.replicas):  # the newest go (one serving ends its own)
            (self.starting or self.ready).pop()
        self.replicas = replicas
        self.router.set_endpoints(POOL, self.ready)

    def became_ready(self, url: str) -> None:
        if url in self.starting:
            self.starting.remove(url)
            self.ready.append(url)
            self.router.set_endpoints(POOL, self.ready)


def simulate(signal: Signal, clients: Clients | None = None, hpa: Hpa | None = None,
             seconds: float = 600.0) -> Run:  # fmt: skip
    """The HPA's readings and replica counts over `seconds` of steady load."""
    return _Model(signal, clients or Clients(), hpa or Hpa()).simulate(seconds)
