"""Routing: which pool can serve a request, and which of its endpoints gets it.

The pools a request may go to are those of its deployment's route table (the one its model
resolves to: catalog.py). They are tried in capability order: pools whose capability set
covers the request's needs, continuous pools first, sequential next, each group in
route-table order. Within a pool, the ready endpoint with the fewest requests in flight
wins (ties: the one used least recently), among those below the pool's bound of requests
in flight per endpoint (`max_in_flight_per_replica`; past it requests wait in the gateway,
hold.py). An endpoint that fails `EJECT_AFTER` times in a row is ejected for
`EJECT_SECONDS`, then tried again; a request held meanwhile wakes when the first ejection of
its pools ends (`ready_in`).

Endpoints come from discovery: only ready, non-terminating ones are listed; one that
leaves the list keeps its requests in flight but gets no new ones. Listeners registered
with `on_change` hear of every change of a pool's pickable endpoints (a new list, an
ejection ending): that is what wakes the requests held for the pool (`hold.py`); those
registered with `on_free` hear of every request that leaves an endpoint (a slot for the
requests queued for the pool). A pool that leaves the route tables loses its endpoints at
once (its requests in flight finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from transcription_api.capabilities import Capability, Mode
from transcription_api.routes import PoolRoute, Routes, RouteTable

from . import metrics
from .catalog import Catalog

log = logging.getLogger("transcription_frontend.routing")

EJECT_AFTER = 3
EJECT_SECONDS = 10.0


@dataclass
class EndpointState:
    in_flight: int = 0
    failures: int = 0
    ejected_until: float = 0.0
    last_used: float = 0.0


@dataclass(frozen=True)
class NoPool:
    """Why no pool can serve a request: the capabilities every pool lacks."""

    missing: frozenset[Capability]
    too_large_for: list[PoolRoute] = field(default_factory=list)


class Router:
    """Pool choice by capability; endpoint choice by `policy`: "least-in-flight" (default)
    or "round-robin" (kept for comparison: see the frontend benchmark)."""

    def __init__(self, routes: RouteTable | Routes, policy: str = "least-in-flight") -> None:
        if policy not in ("least-in-flight", "round-robin"):
            raise ValueError(f"unknown balancing policy {policy!r}")
        self.policy = policy
        self._turn = 0
        self.catalog = Catalog(Routes())
        self._endpoints: dict[str, list[str]] = {}  # pool name -> base URLs (ready ones)
        self._state: dict[str, EndpointState] = {}
        self._pods: dict[str, str] = {}  # endpoint URL -> its pod's name (discovery)
        self._static: dict[str, str] = {}  # static endpoint URL -> `<pool>-<index>`
        self._pool_in_flight: dict[str, int] = {}
        self._spilled: dict[str, int] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._freed: list[Callable[[str], None]] = []
        self._bounds: dict[str, int | None] = {}  # pool -> requests in flight per endpoint
        self.set_routes(routes)

    # ------------------------------------------------------------------ updates

    def set_routes(self, routes: RouteTable | Routes) -> None:
        """A new route-table file: the catalog of the models served, the pools' static
        endpoints; the pools no table names any more have none."""
        old, self.catalog = self.catalog, Catalog(routes)
        bounds = self._bounds
        self._bounds = {p.name: p.max_in_flight_per_replica for p in self.catalog.pools}
        self._static = {
            url: f"{pool.name}-{i}"
            for pool in self.catalog.pools
            for i, url in enumerate(pool.endpoints)
        }
        for pool in self.catalog.pools:
            if pool.endpoints:
                self._set(pool.name, list(pool.endpoints))  # static: in the table's order
            elif pool.name not in self._endpoints:
                self._set(pool.name, [])
        for name in old.pool_names - self.catalog.pool_names:
            self._endpoints[name] = []
            self._changed(name)  # its held requests learn it is gone
        for name in old.pool_names & self.catalog.pool_names:
            if bounds.get(name) != self._bounds[name]:
                self._changed(name)  # a new bound: more room, or less

    def name_endpoints(self, pods: dict[str, str]) -> None:
        """The pods behind endpoint URLs (from discovery): metrics name the pod, never its
        address (static endpoints: their pool and place in the route table)."""
        self._pods = pods

    def set_endpoints(self, pool: str, urls: list[str]) -> None:
        """Replace the ready endpoints of a pool (from discovery)."""
        self._set(pool, sorted(urls))

    def _set(self, pool: str, urls: list[str]) -> None:
        for url in urls:
            self._state.setdefault(url, EndpointState())
        if self._endpoints.get(pool) != urls:
            # Rare (a pod ready or gone) and what a stuck request's story turns on: logged.
            log.info("pool %s: %d endpoint(s) %s", pool, len(urls), " ".join(urls) or "(none)")
            self._endpoints[pool] = urls
            self._changed(pool)

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call `listener(pool)` whenever the pool's pickable endpoints may have changed."""
        self._listeners.append(listener)

    def on_free(self, listener: Callable[[str], None]) -> None:
        """Call `listener(pool)` whenever a request leaves an endpoint of the pool."""
        self._freed.append(listener)

    def _changed(self, pool: str) -> None:
        for listener in self._listeners:
            listener(pool)

    def endpoints(self, pool: str) -> list[str]:
        return list(self._endpoints.get(pool, []))

    # ------------------------------------------------------------------ choice

    def candidates(
        self, table: RouteTable, needs: frozenset[Capability], size: int
    ) -> list[PoolRoute] | NoPool:
        """The pools of `table` that can serve the request, in the order to try them."""
        covering = [p for p in table.pools if p.capability_set.covers(needs)]
        if not covering:
            missing = (
                frozenset.intersection(*(p.capability_set.missing(needs) for p in table.pools))
                if table.pools
                else needs
            )
            return NoPool(missing=missing or needs)
        fitting = [
            p
            for p in covering
            if (limit := p.capability_set.max_upload_bytes) is None or size <= limit
        ]
        if not fitting:
            return NoPool(missing=frozenset(), too_large_for=covering)
        return sorted(fitting, key=lambda p: p.mode != Mode.CONTINUOUS)

    def ready(self, pool: str) -> list[str]:
        now = time.monotonic()
        return [u for u in self._endpoints.get(pool, []) if self._st(u).ejected_until <= now]

    def ready_in(self, pools: list[str]) -> float | None:
        """Seconds until one of `pools` has a ready endpoint: 0 when one has now, until the
        first ejection ends when all of theirs are ejected, None when they have none. One
        reading of the clock answers both, so that an ejection ending meanwhile is never
        missed: a request held for such a pool wakes at that end, whether or not the end
        reaches it as a change (a timer on the event loop's clock, which need not agree with
        this one to the millisecond: if it fires a moment early, nothing else wakes the
        request)."""
        now = time.monotonic()
        ends = [self._st(u).ejected_until for p in pools for u in self._endpoints.get(p, [])]
        return max(0.0, min(ends) - now) if ends else None

    def pick(self, pool: str, exclude: set[str]) -> str | None:
        """The ready endpoint with the fewest requests in flight, below the pool's bound."""
        bound = self._bounds.get(pool)
        options = [
            u for u in self.ready(pool)
            if u not in exclude and (bound is None or self._st(u).in_flight < bound)
        ]  # fmt: skip
        if not options:
            return None
        if self.policy == "round-robin":
            self._turn += 1
            return options[self._turn % len(options)]
        return min(options, key=lambda u: (self._st(u).in_flight, self._st(u).last_used))

    # ------------------------------------------------------------------ accounting

    def _st(self, url: str) -> EndpointState:
        st = self._state.get(url)
        if st is None:
            st = self._state[url] = EndpointState()
        return st

    def acquire(self, url: str, pool: str) -> None:
        st = self._st(url)
        st.in_flight += 1
        st.last_used = time.monotonic()
        self._pool_in_flight[pool] = self._pool_in_flight.get(pool, 0) + 1
        metrics.IN_FLIGHT.labels(pool=pool).inc()
        worker = self._pods.get(url) or self._static.get(url) or "unnamed"
        metrics.WORKER_REQUESTS.labels(pool=pool, worker=worker).inc()

    def release(self, url: str, pool: str) -> None:
        self._st(url).in_flight -= 1
        self._pool_in_flight[pool] -= 1
        metrics.IN_FLIGHT.labels(pool=pool).dec()
        for listener in self._freed:
            listener(pool)

    def in_flight(self, url: str) -> int:
        return self._st(url).in_flight

    def pool_in_flight(self, pool: str) -> int:
        """Requests of this pool at a worker now (terminating endpoints included)."""
        return self._pool_in_flight.get(pool, 0)

    def spill(self, pool: str, n: int) -> None:
        """`n` more (or fewer) requests that `pool` would have served first are at a
        fallback pool because it had no ready worker: demand for `pool` all the same."""
        self._spilled[pool] = self._spilled.get(pool, 0) + n
        metrics.SPILLED.labels(pool=pool).inc(n)

    def pool_spilled(self, pool: str) -> int:
        return self._spilled.get(pool, 0)

    def succeeded(self, url: str) -> None:
        self._st(url).failures = 0

    def failed(self, url: str, pool: str) -> None:
        st = self._st(url)
        st.failures += 1
        if st.failures >= EJECT_AFTER and st.ejected_until <= time.monotonic():
            st.ejected_until = time.monotonic() + EJECT_SECONDS
            st.failures = 0
            metrics.EJECTIONS.labels(pool=pool).inc()
            # The end of the ejection is a change too: requests held for it retry then.
            with contextlib.suppress(RuntimeError):  # no event loop: unit tests of the choice
                asyncio.get_running_loop().call_later(EJECT_SECONDS, self._changed, pool)
