"""The gateway's state: the router, the API keys, the worker client, and what keeps the
route table and the endpoints current while it runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from .auth import ApiKeys
from .discovery import EndpointSliceWatcher, TableWatcher
from .forward import Forwarder, new_session
from .routing import Router


@dataclass
class Gateway:
    router: Router
    api_keys_path: Path | None = None
    table_path: Path | None = None  # re-read when it changes
    slice_namespace: str | None = None  # watch this namespace's EndpointSlices
    kubeconfig: str | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    client: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self.keys = ApiKeys(self.api_keys_path)

    @property
    def forwarder(self) -> Forwarder:
        assert self.client is not None, "the gateway is not running"
        return Forwarder(self.router, self.client)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Watch the route table and the EndpointSlices, and hold the worker client."""
        tasks = []
        if self.table_path:
            tasks.append(asyncio.create_task(TableWatcher(self.table_path, self.router).run()))
        slices = None
        if self.slice_namespace:
            slices = EndpointSliceWatcher(self.router, self.slice_namespace, self.kubeconfig)
            slices.start()
        async with new_session() as client:
            self.client = client
            try:
                yield
            finally:
                for t in tasks:
                    t.cancel()
                if slices:
                    slices.stop()
