"""Leader election through a `coordination.k8s.io/v1` Lease, with client-go's protocol: any
number of operator replicas run, exactly one reconciles.

The Lease says who holds it (`holderIdentity`), for how long (`leaseDurationSeconds`),
since when (`acquireTime`), when it was last renewed (`renewTime`) and how often it changed
hands (`leaseTransitions`). Every write carries the `resourceVersion` last read, so of two
candidates racing for the same Lease exactly one wins (the other gets 409 Conflict).

Nobody compares clocks across machines: a candidate takes a held Lease over only once the
Lease has not CHANGED for `leaseDurationSeconds`, counted by its own monotonic clock from
when it saw the last change. The holder renews every retry period and steps down when it
has not renewed for `renewDeadline` (shorter than the lease), so it stops before anyone
else may start. On graceful shutdown it releases the Lease (holder cleared, duration 1 s)
and the next candidate takes it at its next retry instead of waiting the lease out.

`Elector` makes the decisions without I/O (tested with a fake clock), `LeaseLock` sends the
three requests, `LeaderElection` is the async loop: acquire, renew, step down, release.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3

from .kinds import KINDS
from .kube import Kube, KubeError

log = logging.getLogger(__name__)

# controller-runtime's defaults (and kube-controller-manager's).
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
# client-go's wait.JitterUntil factor: a candidate retries after retryPeriod * [1, 2.2).
JITTER_FACTOR = 1.2
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE = KINDS["Lease"]


class ElectionConfigError(ValueError):
    """Settings that cannot elect a single leader safely; the message says which and why."""


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD

    def __post_init__(self) -> None:
        # client-go's own checks (NewLeaderElector), plus what the Lease can store.
        problems = []
        if not self.identity:
            problems.append("the identity is empty (set POD_NAME)")
        if not self.namespace or not self.name:
            problems.append("the Lease needs a namespace and a name")
        if self.lease_duration < 1 or self.lease_duration != int(self.lease_duration):
            problems.append(
                f"lease duration {self.lease_duration:g}s must be whole seconds, at least 1s "
                "(the Lease stores seconds)"
            )
        if self.retry_period <= 0:
            problems.append(f"retry period {self.retry_period:g}s must be positive")
        if self.lease_duration <= self.renew_deadline:
            problems.append(
                f"lease duration {self.lease_duration:g}s must be longer than the renew "
                f"deadline {self.renew_deadline:g}s (a leader must step down before the "
                "others may take over)"
            )
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            problems.append(
                f"renew deadline {self.renew_deadline:g}s must be longer than "
                f"{JITTER_FACTOR:g} x the retry period {self.retry_period:g}s"
            )
        if problems:
            raise ElectionConfigError("leader election: " + "; ".join(problems))

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"


def default_identity() -> str:
    """The pod's name (downward API), else hostname_pid: unique among running replicas."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def default_namespace() -> str | None:
    """The pod's namespace (downward API or the ServiceAccount's), None outside a cluster."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a Go-style duration ("15s", "500ms", "1m30s") or a bare number."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}: use e.g. 15s, 500ms or 1m30s")
    return sum(float(n) * _UNITS[u] for n, u in parts)


# --------------------------------------------------------------------------- the record


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def micro_time(t: datetime) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, in UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec: client-go's LeaderElectionRecord."""

    holder: str = ""
    duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> LeaseRecord:
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_time(spec.get("acquireTime")),
            renew_time=_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = micro_time(self.acquire_time)
        if self.renew_time:
            spec["renewTime"] = micro_time(self.renew_time)
        return spec


# --------------------------------------------------------------------------- decisions


class Elector:
    """client-go's LeaderElector decisions, without I/O: the record it last observed, when
    that record last changed by its own monotonic clock (`now` arguments), and what to
    write next."""

    def __init__(self, config: ElectionConfig) -> None:
        self.config = config
        self.observed: LeaseRecord | None = None
        self.observed_at = -math.inf

    @property
    def holder(self) -> str:
        return self.observed.holder if self.observed else ""

    @property
    def is_holder(self) -> bool:
        return self.holder == self.config.identity

    def expires_at(self) -> float:
        """When the observed lease runs out, on the local monotonic clock."""
        if self.observed is None:
            return -math.inf
        return self.observed_at + self.observed.duration_seconds

    def lease_valid(self, now: float) -> bool:
        return now < self.expires_at()

    def observe(self, record: LeaseRecord, now: float) -> None:
        """What the API server holds now; the clock restarts only when it changed."""
        if record != self.observed:
            self.observed, self.observed_at = record, now

    def wrote(self, record: LeaseRecord, now: float) -> None:
        self.observed, self.observed_at = record, now

    def _mine(self, wall: datetime) -> LeaseRecord:
        return LeaseRecord(self.config.identity, int(self.config.lease_duration), wall, wall, 0)

    def renewal(self, now: float, wall: datetime) -> LeaseRecord | None:
        """The fast path: the holder of a lease still valid renews it without reading it
        first (the write fails with 409 if anyone else wrote since)."""
        if self.observed is None or not self.is_holder or not self.lease_valid(now):
            return None
        return replace(
            self._mine(wall),
            acquire_time=self.observed.acquire_time,
            transitions=self.observed.transitions,
        )

    def claim(self, current: LeaseRecord | None, now: float, wall: datetime) -> LeaseRecord | None:
        """The slow path, given the Lease as just read (None: there is none yet): the record
        to write, or None while another holder's lease is valid."""
        if current is None:
            return self._mine(wall)  # create it
        self.observe(current, now)
        if current.holder and self.lease_valid(now) and not self.is_holder:
            return None
        if self.is_holder:  # renew: same term
            return replace(
                self._mine(wall), acquire_time=current.acquire_time, transitions=current.transitions
            )
        return replace(self._mine(wall), transitions=current.transitions + 1)  # take over

    def release(self, current: LeaseRecord, now: float, wall: datetime) -> LeaseRecord | None:
        """The record that gives the lease up, or None when it is not ours (any more)."""
        self.observe(current, now)
        if not self.is_holder:
            return None
        return LeaseRecord("", 1, wall, wall, current.transitions)


# --------------------------------------------------------------------------- I/O


class LeaseLock:
    """GET, POST and PUT of one Lease. The Lease last read or written is kept: its
    resourceVersion makes the next update optimistic."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.lease: dict[str, Any] | None = None

    def get(self, timeout: float) -> LeaseRecord | None:
        try:
            self.lease = self.kube.request(
                "GET", LEASE.path(self.namespace, self.name), timeout=timeout
            )
        except KubeError as e:
            if e.status == 404:
                self.lease = None
                return None
            raise
        return LeaseRecord.from_spec((self.lease or {}).get("spec") or {})

    def create(self, record: LeaseRecord, timeout: float) -> None:
        body = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        self.lease = self.kube.request(
            "POST", LEASE.path(self.namespace), body=body, timeout=timeout
        )

    def update(self, record: LeaseRecord, timeout: float) -> None:
        if self.lease is None:
            raise KubeError(409, "Conflict", "the Lease was not read before this update")
        body = {**self.lease, "spec": record.to_spec()}
        self.lease = self.kube.request(
            "PUT", LEASE.path(self.namespace, self.name), body=body, timeout=timeout
        )


# What a request to the API server may fail with: refused, timed out, reset.
REQUEST_ERRORS = (KubeError, urllib3.exceptions.HTTPError, OSError)


def utc_now() -> datetime:
    return datetime.now(UTC)


class LeaderElection:
    """The loop: acquire (retrying every retry period, jittered), then renew every retry
    period; a renewal that does not succeed within the renew deadline loses leadership
    (`on_stopped`), and the loop goes back to acquiring. `is_leading()` is exact at any
    moment: a leader that has not renewed for the renew deadline is no longer leading,
    even before the loop gets to say so."""

    def __init__(
        self,
        config: ElectionConfig,
        lock: LeaseLock,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
    ) -> None:
        self.config = config
        self.lock = lock
        self.elector = Elector(config)
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.wall = wall
        self._leading = False
        self._renewed_at = -math.inf  # when the last successful write was sent
        self._reported_holder: str | None = None
        self._mutex = threading.Lock()  # one attempt (or the release) at a time

    def is_leading(self) -> bool:
        return self._leading and self.clock() - self._renewed_at < self.config.renew_deadline

    # -- one attempt (blocking; runs in a thread)

    def try_acquire_or_renew(self, deadline: float) -> bool:
        """client-go's tryAcquireOrRenew; every request ends by `deadline` (monotonic)."""

        def timeout() -> float:
            left = deadline - self.clock()
            if left <= 0:
                raise TimeoutError("the renew deadline passed")
            return left

        with self._mutex:
            now, wall = self.clock(), self.wall()
            record = self.elector.renewal(now, wall)
            if record is not None:
                try:
                    self.lock.update(record, timeout())
                    self.elector.wrote(record, self.clock())
                    return True
                except REQUEST_ERRORS as e:
                    log.debug("renewing %s optimistically failed (%s); reading it", self._l, e)
            try:
                current = self.lock.get(timeout())
                record = self.elector.claim(current, now, wall)
                if record is None:
                    return False  # held by another, and valid
                if current is None:
                    self.lock.create(record, timeout())
                else:
                    self.lock.update(record, timeout())
            except REQUEST_ERRORS as e:
                lost_race = isinstance(e, KubeError) and e.status in (409, 404)
                (log.debug if lost_race else log.warning)("lease %s: %s", self._l, e)
                return False
            self.elector.wrote(record, self.clock())
            return True

    def release_now(self, timeout: float) -> bool:
        """Give the lease up if it is ours (blocking). Returns whether it was released."""
        deadline = self.clock() + timeout
        with self._mutex:
            try:
                current = self.lock.get(max(deadline - self.clock(), 0.1))
                if current is None:
                    return False
                record = self.elector.release(current, self.clock(), self.wall())
                if record is None:
                    return False
                self.lock.update(record, max(deadline - self.clock(), 0.1))
            except REQUEST_ERRORS as e:
                log.warning("could not release lease %s (it expires by itself): %s", self._l, e)
                return False
            self.elector.wrote(record, self.clock())
            return True

    @property
    def _l(self) -> str:
        return self.config.lease

    # -- the loop

    async def run(self) -> None:
        log.info(
            "leader election: lease %s, identity %s (lease %gs, renew deadline %gs, retry %gs)",
            self._l, self.config.identity, self.config.lease_duration,
            self.config.renew_deadline, self.config.retry_period,
        )  # fmt: skip
        try:
            while True:
                await self._acquire()
                self._start()
                await self._renew()
                self._stop()
        finally:
            self._leading = False

    async def _attempt(self) -> bool:
        started = self.clock()
        deadline = (
            self._renewed_at + self.config.renew_deadline
            if self._leading
            else started + self.config.renew_deadline
        )
        ok = await asyncio.to_thread(self.try_acquire_or_renew, deadline)
        if ok:
            self._renewed_at = started
        self._report_holder()
        return ok

    async def _acquire(self) -> None:
        while not await self._attempt():
            delay = self.config.retry_period * (1 + random.random() * JITTER_FACTOR)
            # Wake when the lease we watch would expire, if that comes first.
            expiry = self.elector.expires_at() - self.clock()
            if self.elector.holder and 0 < expiry < delay:
                delay = expiry + 0.05
            await asyncio.sleep(delay)

    async def _renew(self) -> None:
        """Returns when leadership is lost."""
        while True:
            await asyncio.sleep(self.config.retry_period)
            while self.is_leading():
                if await self._attempt():
                    break
                left = self._renewed_at + self.config.renew_deadline - self.clock()
                await asyncio.sleep(max(min(self.config.retry_period, left), 0))
            if not self.is_leading():
                return

    def _start(self) -> None:
        self._leading = True
        transitions = self.elector.observed.transitions if self.elector.observed else 0
        log.info(
            "became the leader: lease %s held by %s (transitions: %d)",
            self._l, self.config.identity, transitions,
        )  # fmt: skip
        self.on_started()

    def _stop(self) -> None:
        self._leading = False
        log.warning(
            "lost lease %s (not renewed for %gs): stopped reconciling; trying to reacquire",
            self._l, self.config.renew_deadline,
        )  # fmt: skip
        self.on_stopped()

    def _report_holder(self) -> None:
        holder = self.elector.holder
        if holder != self._reported_holder:
            self._reported_holder = holder
            if holder and holder != self.config.identity:
                log.info("lease %s is held by %s: standing by", self._l, holder)

    async def release(self) -> None:
        """Stop leading at once and give the lease up (graceful shutdown). Cancel `run()`
        first."""
        self._leading = False
        if self.elector.is_holder and await asyncio.to_thread(
            self.release_now, self.config.renew_deadline
        ):
            log.info("released lease %s", self._l)
