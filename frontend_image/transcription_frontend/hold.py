"""Holding requests while their pool has no worker to take them (scale from zero).

Kubernetes Services do not buffer while no pod is ready, so the gateway does: a request
whose pools have no endpoint it may try waits here until discovery (or the end of an
ejection) changes one of those pools, then goes on to a worker. The upload is already
spooled by the multipart parser; a held one is moved to disk, so holding costs no memory.
A chat request's JSON body (at most the upload limit) stays in memory while held.

Holding is bounded, and past a bound the request gets 503 with `Retry-After`, in OpenAI's
shape, with a message naming the bound (`HoldLimits`, in the frontend's settings):
- requests held per pool (`max_requests`),
- bytes of held uploads, all pools together (`max_bytes`, on disk), and of held chat
  bodies (`max_memory_bytes`, in memory),
- time a request may wait in all (`timeout_seconds`), and the shutdown grace period: a frontend
  that is stopping answers what it still holds before it exits.

A held request counts for the pool it would go to first; `on_hold` listeners (the KEDA
scaler) hear of every new one at once, so that a pool at zero is woken without waiting
for the autoscaler's next poll. A client that disconnects is dropped from the hold (its
task is cancelled: see `disconnect.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from transcription_api.errors import APIError, unavailable
from transcription_api.frontend import HoldLimits
from transcription_api.routes import PoolRoute

from . import metrics
from .routing import Router

RETRY_AFTER = 5
SHUTTING_DOWN = "shutdown"


class Holdable(Protocol):
    """What a held request keeps: an upload (`multipart.Upload`) or a JSON body."""

    @property
    def size(self) -> int: ...

    # True: held in memory (a chat body, parsed), counted against `max_memory_bytes`;
    # False: spooled to disk (an upload), counted against `max_bytes`.
    in_memory: bool

    def to_disk(self) -> None: ...


class Holds:
    """The requests held by this gateway, by pool, and the bounds they are held within."""

    def __init__(self, router: Router, limits: HoldLimits | None = None) -> None:
        self.limits = limits or HoldLimits()
        self.count: dict[str, int] = {}  # held requests by (first) pool
        self.bytes = 0
        self.memory = 0  # of held chat bodies
        self._waiters: dict[str, set[asyncio.Future[str]]] = {}  # pool -> waiting requests
        self._listeners: list[Callable[[str], None]] = []
        self._drain_at: float | None = None  # loop time by which a stopping gateway answers
        router.on_change(self._wake)

    def held(self, pool: str) -> int:
        return self.count.get(pool, 0)

    def on_hold(self, listener: Callable[[str], None]) -> None:
        """Call `listener(pool)` when a request starts waiting for `pool`."""
        self._listeners.append(listener)

    def deadline(self) -> float:
        """The loop time by which a request whose first hold starts now must be forwarded."""
        return asyncio.get_running_loop().time() + self.limits.timeout_seconds

    async def wait(self, pools: list[PoolRoute], upload: Holdable, deadline: float) -> None:
        """Wait until one of `pools` may have an endpoint to try; 503 past a bound."""
        loop = asyncio.get_running_loop()
        pool = pools[0].name
        size = upload.size
        if self.held(pool) >= self.limits.max_requests:
            raise self._reject(
                pool, "requests",
                f"pool {pool} has no ready worker yet and {self.limits.max_requests} "
                "request(s) already wait for one, the limit of held requests per pool; "
                "retry later",
            )  # fmt: skip
        memory = upload.in_memory
        if memory and self.memory + size > self.limits.max_memory_bytes:
            raise self._reject(
                pool, "memory",
                f"pool {pool} has no ready worker yet and holding this request would exceed "
                f"{self.limits.max_memory_bytes} bytes, the limit of held chat bodies (in "
                "memory); retry later",
            )  # fmt: skip
        if not memory and self.bytes + size > self.limits.max_bytes:
            raise self._reject(
                pool, "bytes",
                f"pool {pool} has no ready worker yet and holding this upload would exceed "
                f"{self.limits.max_bytes} bytes, the limit of held upload bytes; retry later",
            )  # fmt: skip
        until = deadline if self._drain_at is None else min(deadline, self._drain_at)
        if until <= loop.time():
            raise self._timed_out(pool, deadline)
        upload.to_disk()
        waiter: asyncio.Future[str] = loop.create_future()
        for p in pools:
            self._waiters.setdefault(p.name, set()).add(waiter)
        self.count[pool] = self.held(pool) + 1
        if memory:
            self.memory += size
        else:
            self.bytes += size
        metrics.HELD.labels(pool=pool).inc()
        metrics.HELD_BYTES.inc(size)
        started = time.perf_counter()
        for listener in self._listeners:
            listener(pool)
        try:
            async with asyncio.timeout_at(until):
                why = await waiter
        except TimeoutError:
            raise self._timed_out(pool, deadline) from None
        finally:
            for p in pools:
                self._waiters.get(p.name, set()).discard(waiter)
            self.count[pool] -= 1
            if memory:
                self.memory -= size
            else:
                self.bytes -= size
            metrics.HELD.labels(pool=pool).dec()
            metrics.HELD_BYTES.dec(size)
            metrics.HOLD_SECONDS.labels(pool=pool).observe(time.perf_counter() - started)
        if why == SHUTTING_DOWN:
            raise self._shutting_down(pool)

    def drain(self, grace: float) -> None:
        """The gateway is stopping: answer every held request within `grace` seconds
        (those a worker takes before then are forwarded as usual)."""
        loop = asyncio.get_running_loop()
        self._drain_at = loop.time() + max(grace, 0.0)
        loop.call_at(self._drain_at, self._release_all)

    def _release_all(self) -> None:
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(SHUTTING_DOWN)

    def _wake(self, pool: str) -> None:
        for w in self._waiters.get(pool, ()):
            if not w.done():
                w.set_result(pool)

    def _reject(
        self, pool: str, reason: str, message: str, retry_after: int = RETRY_AFTER
    ) -> APIError:
        metrics.HOLD_REJECTIONS.labels(pool=pool, reason=reason).inc()
        return unavailable(message, retry_after=retry_after)

    def _timed_out(self, pool: str, deadline: float) -> APIError:
        if self._drain_at is not None and self._drain_at < deadline:
            return self._shutting_down(pool)
        return self._reject(
            pool, "timeout",
            f"pool {pool} had no ready worker within {self.limits.timeout_seconds:g} s, the "
            "limit of time a request is held while its pool scales up; retry later",
        )  # fmt: skip

    def _shutting_down(self, pool: str) -> APIError:
        return self._reject(
            pool, SHUTTING_DOWN,
            f"pool {pool} had no ready worker before this frontend replica shut down; retry "
            "(another replica will take the request)",
            retry_after=1,
        )  # fmt: skip
