"""The load each pool is scaled on, summed over every frontend replica: its work in
seconds of one replica's decoding (`work_seconds`): the audio arriving, queued and in
flight for it (work.py), over the rate its workers decode at. The requests behind it
(in flight at its workers, held for it, served elsewhere in its place) and its realtime
sessions say whether it is active at all (`total`): what wakes a pool at zero.

KEDA's gRPC connection reaches one replica through the frontend Service, so each replica
answers with the total: its own load, always fresh, plus what its peers (the other
endpoints of its Service, from discovery) report at `GET /internal/load`:

    {"instance": "3f2a...", "pools": {"batch": {"in_flight": 2, "held": 1, "spilled": 0,
        "sessions": 1, "audio": {"arriving": 3.1, "queued": 12.0, "in_flight": 20.5,
        "spilled": 0.0}, "level": 35.6, "decoding": {"decoded": 512.0, "busy": 81.2,
        "window": 119.5}}}}

`spilled` counts requests in flight at a fallback pool because this pool, which they
prefer, had no ready worker: without it, a continuous pool at zero whose traffic a
sequential pool can also serve would never be woken. `sessions` counts the realtime
sessions open whose turns go to the pool (realtime/sessions.py): one each. `decoding` is
the replica's measurement of the pool's decode rate (work.py).

Peers' reports are fetched together, each within `PEER_TIMEOUT`, and reused for
`CACHE_SECONDS`; a peer that does not answer is left out until it does (the total
degrades to what is known, never to an error). A replica recognises its own report by
its `instance` id, so listing itself among its peers counts it once. Without discovery
(static endpoints, local runs) the replica's own load is the total.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import aiohttp
import aiohttp.web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import metrics
from .hold import Holds
from .realtime.sessions import Sessions
from .routing import Router
from .work import DecodeSample, Work, decode_rate

log = logging.getLogger("transcription_frontend.load")
PATH = "/internal/load"
CACHE_SECONDS = 1.0
PEER_TIMEOUT = 0.5


class AudioLoad(BaseModel):
    """Audio seconds counted for one pool on one frontend replica, by stage (work.py)."""

    model_config = ConfigDict(extra="ignore")

    arriving: float = Field(default=0.0, ge=0, description="Uploading, parsing, being cut.")
    queued: float = Field(default=0.0, ge=0, description="Held; long audio's chunks waiting.")
    in_flight: float = Field(default=0.0, ge=0, description="At a worker of the pool.")
    spilled: float = Field(default=0.0, ge=0, description="At a fallback pool in this one's place.")

    @property
    def total(self) -> float:
        return self.arriving + self.queued + self.in_flight + self.spilled


class PoolLoad(BaseModel):
    """One pool's load on one frontend replica."""

    model_config = ConfigDict(extra="ignore")

    in_flight: int = Field(default=0, ge=0, description="Requests at a worker of the pool.")
    held: int = Field(
        default=0, ge=0,
        description="Requests waiting for a worker of the pool: held while it has none, "
        "queued while its workers are at their bound.",
    )  # fmt: skip
    spilled: int = Field(
        default=0, ge=0,
        description="Requests at a fallback pool because this one, preferred, had no worker.",
    )  # fmt: skip

    sessions: int = Field(
        default=0, ge=0, description="Realtime sessions open whose turns go to this pool."
    )

    audio: AudioLoad = Field(
        default_factory=AudioLoad, description="Audio seconds counted for the pool."
    )
    level: float = Field(
        default=0.0, ge=0,
        description="The audio seconds the autoscaler reads: `audio`'s total or, when "
        "higher, its average over the last moments (work.py).",
    )  # fmt: skip
    decoding: DecodeSample = Field(
        default_factory=DecodeSample, description="The pool's decode rate, as measured here."
    )

    @property
    def total(self) -> int:
        return self.in_flight + self.held + self.spilled + self.sessions


class LoadReport(BaseModel):
    """`GET /internal/load`: one frontend replica's load, by pool."""

    model_config = ConfigDict(extra="ignore")

    instance: str = Field(description="Random id of the replica's process.")
    pools: dict[str, PoolLoad] = Field(default_factory=dict)


def total(reports: Iterable[LoadReport], pool: str) -> int:
    """In flight plus held (plus spilled) for `pool`, over the reports of distinct replicas."""
    return sum(r.pools[pool].total for r in reports if pool in r.pools)


def work_seconds(
    reports: list[LoadReport], pool: str, target_queue_seconds: float, default_rate: float
) -> float:
    """The pool's work, in seconds of one replica's decoding: the audio counted for it on
    every replica (its level: the average of the last moments when higher than now), plus
    `target_queue_seconds` of audio for each open realtime session (one brings at most a
    second of audio a second: what it can bring while the pool drains its queue), over the
    decode rate measured on every replica (`default_rate` until then)."""
    mine = [r.pools[pool] for r in reports if pool in r.pools]
    audio = sum(max(p.audio.total, p.level) + p.sessions * target_queue_seconds for p in mine)
    return audio / decode_rate([p.decoding for p in mine], default_rate)


class Peers:
    """The other frontend replicas' reports, fetched at most once per `CACHE_SECONDS`."""

    def __init__(self, instance: str, port: int | None = None) -> None:
        self.instance = instance
        self.port = port  # peers serve their report on this port (not the public one)
        self.urls: list[str] = []
        self.client: aiohttp.ClientSession | None = None
        self._reports: list[LoadReport] = []
        self._fetched = -math.inf
        self._fetching: asyncio.Task[list[LoadReport]] | None = None

    def set_urls(self, urls: list[str]) -> None:
        if self.port is not None:  # the Service's endpoints are on the public port
            urls = [u.rsplit(":", 1)[0] + f":{self.port}" for u in urls]
        if urls != self.urls:
            self.urls = urls
            self._fetched = -math.inf

    async def reports(self) -> list[LoadReport]:
        if not self.urls or self.client is None:
            return []
        if asyncio.get_running_loop().time() - self._fetched < CACHE_SECONDS:
            return self._reports
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.create_task(self._fetch_all())
        # Shielded: one caller going away (a gRPC call cancelled) stops no one else's.
        return await asyncio.shield(self._fetching)

    async def _fetch_all(self) -> list[LoadReport]:
        got = await asyncio.gather(*(self._fetch(u) for u in self.urls))
        self._reports = [r for r in got if r is not None and r.instance != self.instance]
        self._fetched = asyncio.get_running_loop().time()
        return self._reports

    async def _fetch(self, url: str) -> LoadReport | None:
        assert self.client is not None
        try:
            timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT)
            async with self.client.get(url + PATH, timeout=timeout) as r:
                r.raise_for_status()
                return LoadReport.model_validate_json(await r.read())
        except (aiohttp.ClientError, TimeoutError, ValidationError) as e:
            metrics.PEER_ERRORS.inc()
            log.warning("peer %s did not report its load (%s): left out of the total", url, e)
            return None


class Load:
    """This replica's load, the total over all replicas, and a signal for new demand."""

    def __init__(
        self, router: Router, holds: Holds, sessions: Sessions, work: Work,
        internal_port: int | None = None,
    ) -> None:  # fmt: skip
        self.router = router
        self.holds = holds
        self.sessions = sessions
        self.work = work
        self.peers = Peers(uuid.uuid4().hex, internal_port)
        self._subscribers: set[asyncio.Event] = set()
        holds.on_hold(self._demand)
        sessions.on_demand = self._demand

    def local(self) -> LoadReport:
        return LoadReport(
            instance=self.peers.instance,
            pools={
                p.name: PoolLoad(
                    in_flight=self.router.pool_in_flight(p.name),
                    held=self.holds.held(p.name),
                    spilled=self.router.pool_spilled(p.name),
                    sessions=self.sessions.count(p.name),
                    audio=self.audio(p.name),
                    level=self.work.level(p.name),
                    decoding=self.work.sample(p.name),
                )
                for p in self.router.catalog.pools
            },
        )

    def audio(self, pool: str) -> AudioLoad:
        return AudioLoad(
            **{stage: self.work.seconds(pool, stage) for stage in AudioLoad.model_fields}
        )

    async def reports(self) -> list[LoadReport]:
        """This replica's report and its peers'."""
        return [self.local(), *await self.peers.reports()]

    @contextmanager
    def demand(self) -> Iterator[asyncio.Event]:
        """An event set whenever a request starts being held here, or a realtime session
        starts using a pool (clear it, then read
        the load, then wait on it: no new demand is missed in between)."""
        event = asyncio.Event()
        self._subscribers.add(event)
        try:
            yield event
        finally:
            self._subscribers.discard(event)

    def _demand(self, pool: str) -> None:
        for event in self._subscribers:
            event.set()


async def serve_internal(load: Load, host: str, port: int) -> aiohttp.web.AppRunner:
    """`GET /internal/load` on its own port, off the client-facing one: only the cluster's
    own components (the frontend's peers) reach it (the NetworkPolicy says so)."""

    async def report(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            body=load.local().model_dump_json(), content_type="application/json"
        )

    app = aiohttp.web.Application()
    app.router.add_get(PATH, report)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    log.info("internal surface (%s) on %s:%d", PATH, host, port)
    return runner
