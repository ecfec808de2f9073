"""The gateway's state: its settings, the router (and the catalog of the models it serves),
the requests waiting for workers, the audio counted for autoscaling, the API keys, the
tenants and their quotas, the worker client, and what keeps the route table, the endpoints
and the peers current while it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from transcription_api.frontend import FrontendSettings

from .auth import ApiKeys
from .discovery import SliceIndex, SliceWatches, TableWatcher
from .events import KEYS_UNAVAILABLE, UNKNOWN_TENANT, PodEvents
from .forward import Forwarder, new_session
from .hold import Holds
from .limits import BodyBudget, Uploads
from .load import Load, serve_internal
from .quota import Quotas
from .realtime.sessions import Sessions
from .routing import Router
from .scaler import serve_scaler
from .tenants import Caller, Tenants
from .tracing import Tracer
from .work import Work

log = logging.getLogger("transcription_frontend")


@dataclass
class Gateway:
    router: Router
    settings: FrontendSettings = field(default_factory=FrontendSettings)  # read at start-up
    table_path: Path | None = None  # re-read when it changes
    # the frontend's own namespace: its peers' and a one-deployment table's pools' Services;
    # None: no EndpointSlice is watched (static endpoints)
    slice_namespace: str | None = None
    kubeconfig: str | None = None
    tracer: Tracer = field(default_factory=Tracer)  # off by default (tracing.py)
    started: int = field(default_factory=lambda: int(time.time()))
    client: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        s = self.settings
        events = PodEvents(self.kubeconfig)
        self.tenants = Tenants(s.tenants, lambda why: events.warn(UNKNOWN_TENANT, why))
        self.keys = ApiKeys(s.api_keys_path, lambda why: events.warn(KEYS_UNAVAILABLE, why),
                            self.tenants.keys_read)  # fmt: skip
        self.holds = Holds(self.router, s.hold)
        self.sessions = Sessions(s.limits)  # realtime (realtime/)
        self.uploads = Uploads(s.limits)  # bodies still arriving, per key
        self.body_budget = BodyBudget(s.limits)  # bodies held in memory, all together
        self.work = Work()  # audio-seconds, for autoscaling
        self.load = Load(self.router, self.holds, self.sessions, self.work, s.internal_port)
        # Each replica enforces its share of each quota: the ready replicas it knows.
        self.quotas = Quotas(s.tenants, lambda: len(self.load.peers.urls))
        self.slices = SliceIndex(self.router, s.peers_service, self.load.peers.set_urls,
                                 self.slice_namespace or "default")  # fmt: skip
        self.loop: asyncio.AbstractEventLoop | None = None
        self.watches: SliceWatches | None = None

    def caller(self, authorization: str | None) -> Caller:
        """Who sends a request with this `Authorization` header: its key and tenant; 401,
        403 or 503 (auth.py, tenants.py)."""
        return self.tenants.caller(self.keys.check(authorization))

    @property
    def forwarder(self) -> Forwarder:
        assert self.client is not None, "the gateway is not running"
        return Forwarder(self.router, self.client, self.holds, self.work, self.tracer)

    def apply_slice(self, event: str, slice_: dict[str, Any]) -> None:
        """An EndpointSlice event from any thread (the watch, a test), applied on the loop."""
        assert self.loop is not None, "the gateway is not running"
        self.loop.call_soon_threadsafe(self.slices.update, event, slice_)

    def routes_changed(self) -> None:
        """A new route table: its pools get the endpoints already known, and the namespaces
        it names are watched (and those it no longer names are not)."""
        self.slices.refresh()
        if self.watches is not None and self.slice_namespace is not None:
            self.watches.sync({self.slice_namespace, *self.router.catalog.namespaces})

    def drain(self, grace: float) -> None:
        """The server is stopping (SIGTERM): answer what is held within `grace` seconds."""
        log.info("shutting down: held requests are forwarded or answered within %gs", grace)
        self.holds.drain(grace)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Watch the route table and the EndpointSlices, hold the worker client, and serve
        KEDA's external scaler."""
        self.loop = asyncio.get_running_loop()
        tasks = []
        if self.table_path:
            watcher = TableWatcher(self.table_path, self.router, on_reload=self.routes_changed)
            tasks.append(asyncio.create_task(watcher.run()))
        if self.slice_namespace:  # pools and peers alike
            self.watches = SliceWatches(self.slices, self.kubeconfig, self.loop)
            self.routes_changed()
        s = self.settings
        async with new_session(s.worker_timeouts) as client:
            self.client = client
            self.load.peers.client = client
            scaler = internal = None
            try:
                if s.scaler_port is not None:
                    scaler = await serve_scaler(self.load, self.router, s.host, s.scaler_port)
                if s.internal_port is not None:
                    internal = await serve_internal(self.load, s.host, s.internal_port)
                yield
            finally:
                if scaler is not None:
                    await scaler.stop(grace=1.0)
                if internal is not None:
                    await internal.cleanup()
                for t in tasks:
                    t.cancel()
                if self.watches:
                    self.watches.stop()
                # spans still buffered are exported (a blocking call: off the loop)
                await asyncio.to_thread(self.tracer.shutdown)
