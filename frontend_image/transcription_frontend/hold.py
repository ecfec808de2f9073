"""Waiting for a worker: one waiting room for the requests held while their pools have no
worker (scale from zero) and those queued while the workers are at their in-flight bound.

Held. Kubernetes Services do not buffer while no pod is ready, so the gateway does: a
request whose pools have no endpoint it may try waits here until discovery (or the end of
an ejection) changes one of those pools, or (a request whose endpoints could not be
reached: forward.py) until its next try is due, then goes on to a worker.

Queued. A pool's route says how many requests one endpoint is sent at once (its
`max_in_flight_per_replica`: the pool's `maxInFlightPerReplica`, by default twice what a
replica decodes at once); past that a request waits here, so that a saturated pool's queue
is in the gateway, where it is fair between tenants, and not at the workers, where it is
first come, first served. A slot that frees, or comes with a new endpoint (a pool scaling
up), goes to the request the fair order puts first among those queued for that pool
(interactive before batch, then weighted fair queuing in audio seconds between tenants:
fair.py); one that arrives while others wait joins them. A request is queued for the first
of its pools with a ready endpoint it has not tried, as it would be sent there: it goes to
a fallback pool only while its own has no ready endpoint, never because its own is busy.

The upload is already spooled by the multipart parser; a waiting one is moved to disk, so
waiting costs no memory. A chat request's JSON body (at most the upload limit) stays in
memory. Waiting is bounded, held and queued alike, and past a bound the request gets 503
with `Retry-After`, in OpenAI's shape, with a message naming the bound (`HoldLimits`, in
the frontend's settings):
- requests waiting per pool (`max_requests`),
- bytes of waiting uploads, all pools together (`max_bytes`, on disk), and of waiting chat
  bodies (`max_memory_bytes`, in memory),
- time a request may wait in all (`timeout_seconds`), and the shutdown grace period: a frontend
  that is stopping answers what still waits before it exits.

A waiting request counts for the pool it waits for (held: the first of its pools), and for
autoscaling as queued (work.py); `on_hold` listeners (the KEDA scaler) hear of every new
held one at once, so that a pool at zero is woken without waiting for the autoscaler's
next poll. A client that disconnects is dropped from the room (its task is cancelled: see
`disconnect.py`), and a slot granted to a request as it left goes to the next.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from transcription_api.errors import APIError, unavailable
from transcription_api.frontend import HoldLimits
from transcription_api.routes import PoolRoute

from . import metrics
from .fair import FairQueue, Flow, Tag
from .routing import Router

RETRY_AFTER = 5
SHUTTING_DOWN = "shutdown"


class Holdable(Protocol):
    """What a waiting request keeps: an upload (`multipart.Upload`) or a JSON body."""

    @property
    def size(self) -> int: ...

    # True: held in memory (a chat body, parsed), counted against `max_memory_bytes`;
    # False: spooled to disk (an upload), counted against `max_bytes`.
    in_memory: bool

    def to_disk(self) -> None: ...


@dataclass
class Place:
    """A request's place in line: its flow, its audio seconds (its cost in the fair order),
    and its tag in each pool's order, made the first time it waits for (or takes a slot
    of) that pool and kept through its retries."""

    flow: Flow = field(default_factory=Flow)
    seconds: float = 0.0
    tags: dict[str, Tag] = field(default_factory=dict)


@dataclass(eq=False)
class _Waiter:
    pools: list[PoolRoute]
    place: Place
    future: asyncio.Future[str | None]
    queue: str | None = None  # the pool it is queued for; None: held


def _wake(future: asyncio.Future[str | None], pool: str) -> None:
    if not future.done():
        future.set_result(pool)


class Holds:
    """The requests waiting in this gateway, by pool, and the bounds they wait within."""

    def __init__(self, router: Router, limits: HoldLimits | None = None) -> None:
        self.router = router
        self.limits = limits or HoldLimits()
        self.count: dict[str, int] = {}  # waiting requests by pool
        self.bytes = 0
        self.memory = 0  # of waiting chat bodies
        self._waiters: dict[str, set[_Waiter]] = {}  # pool -> the requests it may wake
        self._fair: dict[str, FairQueue] = defaultdict(FairQueue)
        self._listeners: list[Callable[[str], None]] = []
        self._drain_at: float | None = None  # loop time by which a stopping gateway answers
        router.on_change(self._changed)
        router.on_free(self._dispatch)

    def held(self, pool: str) -> int:
        """Requests waiting for `pool`, held or queued."""
        return self.count.get(pool, 0)

    def on_hold(self, listener: Callable[[str], None]) -> None:
        """Call `listener(pool)` when a request starts being held for `pool`."""
        self._listeners.append(listener)

    def deadline(self) -> float:
        """The loop time by which a request whose first wait starts now must be forwarded."""
        return asyncio.get_running_loop().time() + self.limits.timeout_seconds

    # ------------------------------------------------------------------ a request's side

    def target(self, pools: list[PoolRoute], exclude: set[str]) -> PoolRoute | None:
        """The first of `pools` with a ready endpoint not in `exclude`, busy or not."""
        return next((p for p in pools if set(self.router.ready(p.name)) - exclude), None)

    def take(self, pool: PoolRoute, exclude: set[str], place: Place) -> str | None:
        """An endpoint of `pool` (not in `exclude`) taken for the request now (acquired: the
        caller releases it), if one has room and no request is queued before it."""
        if any(w.queue == pool.name and not w.future.done() for w in self._of(pool.name)):
            return None
        url = self.router.pick(pool.name, exclude)
        if url is not None:
            self._grant(pool.name, self._tag(pool.name, place), url)
        return url

    async def wait(
        self, pools: list[PoolRoute], upload: Holdable, deadline: float, place: Place | None = None,
        wake_at: float | None = None,
    ) -> None:  # fmt: skip
        """Held: wait until one of `pools` may have an endpoint to try, or (if given) until
        the loop time `wake_at`, whichever comes first; 503 past a bound."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(pools, place or Place(), loop.create_future())
        woken = None
        if wake_at is not None:
            woken = loop.call_at(wake_at, _wake, waiter.future, pools[0].name)
        try:
            await self._wait(pools[0].name, waiter, upload, deadline)
        finally:
            if woken is not None:
                woken.cancel()

    async def queue(
        self, pools: list[PoolRoute], pool: PoolRoute, place: Place, upload: Holdable,
        deadline: float,
    ) -> str | None:  # fmt: skip
        """Queued: wait, in fair order, for a slot of `pool` (the first of `pools` with an
        endpoint): the endpoint taken for the request (acquired: the caller releases it), or
        None when `pools` changed so that `pool` is no longer the one to wait for (choose
        again). 503 past a bound."""
        future = asyncio.get_running_loop().create_future()
        self._tag(pool.name, place)
        return await self._wait(pool.name, _Waiter(pools, place, future, pool.name), upload,
                                deadline)  # fmt: skip

    # ------------------------------------------------------------------ the room

    def _of(self, pool: str) -> set[_Waiter]:
        return self._waiters.get(pool, set())

    def _tag(self, pool: str, place: Place) -> Tag:
        if pool not in place.tags:
            place.tags[pool] = self._fair[pool].tag(place.flow, place.seconds)
        return place.tags[pool]

    def _grant(self, pool: str, tag: Tag, url: str) -> None:
        self.router.acquire(url, pool)
        self._fair[pool].dispatched(tag)

    def _dispatch(self, pool: str) -> None:
        """Give the free slots of `pool` to the requests queued for it, in fair order."""
        while True:
            queued = [w for w in self._of(pool) if w.queue == pool and not w.future.done()]
            if not queued:
                return
            url = self.router.pick(pool, set())
            if url is None:
                return
            first = min(queued, key=lambda w: w.place.tags[pool])
            self._grant(pool, first.place.tags[pool], url)
            first.future.set_result(url)

    def _changed(self, pool: str) -> None:
        """`pool`'s endpoints changed: held requests try again, queued ones whose pool to
        wait for is another now choose again, and new endpoints' slots are given out."""
        for w in list(self._of(pool)):
            if w.future.done():
                continue
            if w.queue is None:
                w.future.set_result(pool)
            elif (t := self.target(w.pools, set())) is None or t.name != w.queue:
                w.future.set_result(None)
        self._dispatch(pool)

    async def _wait(self, pool: str, waiter: _Waiter, upload: Holdable, deadline: float
                    ) -> str | None:  # fmt: skip
        """Wait in the room, counted for `pool`, until `waiter`'s future is set."""
        loop = asyncio.get_running_loop()
        self._check_room(pool, waiter, upload)
        until = deadline if self._drain_at is None else min(deadline, self._drain_at)
        if until <= loop.time():
            raise self._timed_out(pool, deadline, waiter)
        upload.to_disk()
        size, memory, tenant = upload.size, upload.in_memory, waiter.place.flow.tenant
        for p in waiter.pools:
            self._waiters.setdefault(p.name, set()).add(waiter)
        self.count[pool] = self.held(pool) + 1
        if memory:
            self.memory += size
        else:
            self.bytes += size
        metrics.HELD.labels(pool=pool).inc()
        metrics.HELD_BYTES.inc(size)
        metrics.TENANT_QUEUED.labels(tenant=tenant).inc(waiter.place.seconds)
        started = time.perf_counter()
        if waiter.queue is None:
            for listener in self._listeners:
                listener(pool)
        else:
            self._dispatch(pool)  # a slot may be free already
        try:
            try:
                async with asyncio.timeout_at(until):
                    result = await waiter.future
            except TimeoutError:
                raise self._timed_out(pool, deadline, waiter) from None
        except BaseException:
            self._give_back(waiter)
            raise
        finally:
            for p in waiter.pools:
                self._of(p.name).discard(waiter)
            self.count[pool] -= 1
            if memory:
                self.memory -= size
            else:
                self.bytes -= size
            metrics.HELD.labels(pool=pool).dec()
            metrics.HELD_BYTES.dec(size)
            metrics.TENANT_QUEUED.labels(tenant=tenant).dec(waiter.place.seconds)
            metrics.HOLD_SECONDS.labels(pool=pool).observe(time.perf_counter() - started)
        if result == SHUTTING_DOWN:
            raise self._shutting_down(pool, waiter)
        return result if waiter.queue is not None else None

    def _give_back(self, waiter: _Waiter) -> None:
        """A request leaving the room (cancelled, timed out) returns the slot granted to it
        meanwhile, if one was: it goes to the next."""
        f = waiter.future
        if waiter.queue is not None and f.done() and not f.cancelled():
            url = f.result()
            if url is not None and url != SHUTTING_DOWN:
                self.router.release(url, waiter.queue)

    def _check_room(self, pool: str, waiter: _Waiter, upload: Holdable) -> None:
        """503 if one more request, or its body, would pass a bound."""
        why = "has no ready worker yet" if waiter.queue is None else "has every worker busy"
        which = "held" if waiter.queue is None else "waiting"
        size = upload.size
        if self.held(pool) >= self.limits.max_requests:
            raise self._full(
                pool, "requests", waiter,
                f"pool {pool} {why} and {self.limits.max_requests} request(s) already wait "
                f"for one, the limit of {which} requests per pool; retry later",
            )  # fmt: skip
        if upload.in_memory and self.memory + size > self.limits.max_memory_bytes:
            raise self._full(
                pool, "memory", waiter,
                f"pool {pool} {why} and holding this request would exceed "
                f"{self.limits.max_memory_bytes} bytes, the limit of held chat bodies (in "
                "memory); retry later",
            )  # fmt: skip
        if not upload.in_memory and self.bytes + size > self.limits.max_bytes:
            raise self._full(
                pool, "bytes", waiter,
                f"pool {pool} {why} and holding this upload would exceed "
                f"{self.limits.max_bytes} bytes, the limit of held upload bytes; retry later",
            )  # fmt: skip

    def drain(self, grace: float) -> None:
        """The gateway is stopping: answer every waiting request within `grace` seconds
        (those a worker takes before then are forwarded as usual)."""
        loop = asyncio.get_running_loop()
        self._drain_at = loop.time() + max(grace, 0.0)
        loop.call_at(self._drain_at, self._release_all)

    def _release_all(self) -> None:
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.future.done():
                    w.future.set_result(SHUTTING_DOWN)

    def _full(self, pool: str, reason: str, waiter: _Waiter, message: str) -> APIError:
        tenant, seconds = waiter.place.flow.tenant, waiter.place.seconds
        metrics.TENANT_REJECTIONS.labels(tenant=tenant, reason="queue_full").inc()
        metrics.TENANT_AUDIO.labels(tenant=tenant, outcome="refused").inc(seconds)
        return self._reject(pool, reason, message)

    def _reject(
        self, pool: str, reason: str, message: str, retry_after: int = RETRY_AFTER
    ) -> APIError:
        metrics.HOLD_REJECTIONS.labels(pool=pool, reason=reason).inc()
        return unavailable(message, retry_after=retry_after)

    def _timed_out(self, pool: str, deadline: float, waiter: _Waiter) -> APIError:
        if self._drain_at is not None and self._drain_at < deadline:
            return self._shutting_down(pool, waiter)
        limit = f"{self.limits.timeout_seconds:g} s"
        return self._reject(
            pool, "timeout",
            f"pool {pool} had no ready worker within {limit}, the limit of time a request is "
            "held while its pool scales up; retry later" if waiter.queue is None else
            f"pool {pool} had every worker busy for {limit}, the limit of time a request "
            "waits for one; retry later",
        )  # fmt: skip

    def _shutting_down(self, pool: str, waiter: _Waiter) -> APIError:
        free = "ready" if waiter.queue is None else "free"
        return self._reject(
            pool, SHUTTING_DOWN,
            f"pool {pool} had no {free} worker before this frontend replica shut down; retry "
            "(another replica will take the request)",
            retry_after=1,
        )  # fmt: skip
