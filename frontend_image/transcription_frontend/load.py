"""The load each pool is scaled on: requests in flight at its workers plus requests held
for it, summed over every frontend replica.

KEDA's gRPC connection reaches one replica through the frontend Service, so each replica
answers with the total: its own load, always fresh, plus what its peers (the other
endpoints of its Service, from discovery) report at `GET /internal/load`:

    {"instance": "3f2a...", "pools": {"batch": {"in_flight": 2, "held": 1, "spilled": 0,
                                                 "sessions": 1}}}

`spilled` counts requests in flight at a fallback pool because this pool, which they
prefer, had no ready worker: without it, a continuous pool at zero whose traffic a
sequential pool can also serve would never be woken. `sessions` counts the realtime
sessions open whose turns go to the pool (realtime/sessions.py): one each.

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

log = logging.getLogger("transcription_frontend.load")
PATH = "/internal/load"
CACHE_SECONDS = 1.0
PEER_TIMEOUT = 0.5


class PoolLoad(BaseModel):
    """One pool's load on one frontend replica."""

    model_config = ConfigDict(extra="ignore")

    in_flight: int = Field(default=0, ge=0, description="Requests at a worker of the pool.")
    held: int = Field(default=0, ge=0, description="Requests held until the pool has one.")
    spilled: int = Field(
        default=0, ge=0,
        description="Requests at a fallback pool because this one, preferred, had no worker.",
    )  # fmt: skip

    sessions: int = Field(
        default=0, ge=0, description="Realtime sessions open whose turns go to this pool."
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
        self, router: Router, holds: Holds, sessions: Sessions, internal_port: int | None = None
    ) -> None:
        self.router = router
        self.holds = holds
        self.sessions = sessions
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
                )
                for p in self.router.catalog.pools
            },
        )

    async def total(self, pool: str) -> int:
        return total([self.local(), *await self.peers.reports()], pool)

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
