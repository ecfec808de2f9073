"""Quotas: how much audio each tenant may send, in audio seconds (tenants.py says who is
which tenant).

A tenant's quota (`spec.frontend.tenants[].quota`) is a token bucket per window it sets:
per minute, a bucket that holds `audioSecondsPerMinute` and refills at that many a minute;
per day, one that holds `audioSecondsPerDay` and refills at that many a day (rolling, as
OpenAI's per-day limits are). Unset: no bucket, no limit.

A request is charged once its audio's length is known (the header's, else the estimate
autoscaling uses: `sniff.audio_seconds`), before it is routed: a long file its whole
length, a realtime session each committed turn, a chat request its audio parts. It fits
when every bucket holds its length; one longer than a replica's share of a bucket fits
when that bucket is full, and owes the rest, which the refill pays back. When the request
ends, its charge is corrected to the seconds its answer reports (a refund, or an extra
charge); one not answered 200 is refunded whole. A request that does not fit gets 429 in
OpenAI's shape (type `audio_seconds`, code `rate_limit_exceeded`) with `Retry-After` (whole
seconds until it fits), `retry-after-ms`, and the `x-ratelimit-*-audio-seconds` headers of
the window that refused it; every answer to a charged request carries those of the window
with the least left, so that clients can pace themselves. A request longer than a window's
whole quota can never fit, and a quota of 0 refuses everything: both get 429 saying so,
with `x-should-retry: false` (the OpenAI SDKs then do not retry).

Replicas: each frontend replica enforces its share of the quota, quota / N, where N is the
number of ready frontend replicas it knows (its peers, load.py; 1 while it knows none), as
Envoy's local rate limit does: no state is shared, and the sum is the quota when requests
spread evenly over the replicas. A client that keeps one connection open meets one
replica, and so its share only. The headers report the whole quota, and this replica's
estimate of what is left of it (its share's remaining times N).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from transcription_api.errors import APIError
from transcription_api.frontend import TenantQuota, TenantSpec

from . import metrics

TYPE = "audio_seconds"  # the 429's `type`, as OpenAI's names "tokens" or "requests"
RATE_LIMITED = "rate_limit_exceeded"
NO_QUOTA = "insufficient_quota"  # OpenAI's code for an account with no quota at all


class Window(StrEnum):
    MINUTE = "minute"
    DAY = "day"


PERIOD = {Window.MINUTE: 60.0, Window.DAY: 86_400.0}
FIELD = {Window.MINUTE: "audioSecondsPerMinute", Window.DAY: "audioSecondsPerDay"}


def windows(quota: TenantQuota) -> dict[Window, int]:
    """The windows a quota sets, with their quotas."""
    out = {Window.MINUTE: quota.audio_seconds_per_minute, Window.DAY: quota.audio_seconds_per_day}
    return {w: q for w, q in out.items() if q is not None}


def duration(seconds: float) -> str:
    """A duration as OpenAI's `x-ratelimit-reset-*` headers write it (Go's): `120ms`,
    `2.5s`, `1m2.5s`, `1h0m0s`; whole milliseconds, rounded up."""
    ms = _up(max(seconds, 0.0) * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _up(x: float) -> int:
    """`x` rounded up, but for floating point's noise (0.1 s is not 101 ms)."""
    return math.ceil(x - 1e-6)


@dataclass
class Bucket:
    """One window of one tenant's quota on this replica: `level` audio seconds as of `at`
    (below 0: owed)."""

    quota: int  # the whole quota, all replicas together
    period: float
    level: float = math.inf  # full at the first look
    at: float = 0.0

    def look(self, now: float, share: int) -> tuple[float, float]:
        """Refill to `now`: this replica's (capacity, refill rate per second)."""
        capacity = self.quota / share
        rate = capacity / self.period
        self.level = min(capacity, self.level + (now - self.at) * rate)
        self.at = now
        return capacity, rate


@dataclass(frozen=True)
class Standing:
    """Where a tenant stands in one window, as the `x-ratelimit-*` headers say it."""

    window: Window
    limit: int  # the whole quota
    remaining: float  # of the whole quota, as this replica estimates it
    reset: float  # seconds until the bucket is full again

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-audio-seconds": str(self.limit),
            "x-ratelimit-remaining-audio-seconds": str(max(0, math.floor(self.remaining))),
            "x-ratelimit-reset-audio-seconds": duration(self.reset),
        }


class Charge:
    """What one request was charged, until it ends (`settle`)."""

    def __init__(self, quotas: Quotas, tenant: str, seconds: float, standing: Standing) -> None:
        self.quotas = quotas
        self.tenant = tenant
        self.seconds = seconds
        self.standing = standing  # after the charge: what its answer's headers say

    def settle(self, seconds: float | None) -> None:
        """The request ended: `seconds` of audio served (its answer's), or None when it was
        not served (refunded whole)."""
        served = seconds if seconds is not None else 0.0
        self.quotas.take(self.tenant, served - self.seconds)
        self.seconds = served
        if seconds is not None:
            metrics.TENANT_AUDIO.labels(tenant=self.tenant, outcome="served").inc(served)


class Quotas:
    """Every tenant's buckets on this replica. `share`: how many replicas share each quota
    (the ready frontend replicas known)."""

    def __init__(
        self, tenants: Iterable[TenantSpec], share: Callable[[], int] = lambda: 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.share = share
        self.clock = clock
        self._buckets = {
            t.name: {w: Bucket(q, PERIOD[w]) for w, q in windows(t.quota).items()} for t in tenants
        }

    def admit(self, tenant: TenantSpec, seconds: float) -> Charge | None:
        """Charge `tenant` for `seconds` of audio (None: it has no quota); 429 if they do not
        fit (the module's docstring)."""
        buckets = self._buckets.get(tenant.name)
        if not buckets:
            return None
        now, share = self.clock(), max(1, self.share())
        waits: dict[Window, float] = {}
        for window, b in buckets.items():
            capacity, rate = b.look(now, share)
            if b.quota == 0 or seconds > b.quota:
                refused(tenant.name, window, seconds)
                if b.quota == 0:
                    raise no_quota(tenant.name, window)
                raise never_fits(tenant.name, window, seconds, self._standing(window, b, share))
            need = min(seconds, capacity)
            if seconds and b.level < need:
                waits[window] = (need - b.level) / rate
        if waits:
            window = max(waits, key=lambda w: waits[w])
            refused(tenant.name, window, seconds)
            standing = self._standing(window, buckets[window], share)
            raise rate_limited(tenant.name, window, seconds, waits[window], standing)
        for b in buckets.values():
            b.level -= seconds
        least = min(buckets, key=lambda w: buckets[w].level * share)
        return Charge(self, tenant.name, seconds, self._standing(least, buckets[least], share))

    def check_open(self, tenant: TenantSpec) -> None:
        """429 if `tenant`'s quota is 0 in some window: nothing it sends can be served (a
        realtime session is refused before it opens)."""
        for window, b in self._buckets.get(tenant.name, {}).items():
            if b.quota == 0:
                refused(tenant.name, window, 0.0)
                raise no_quota(tenant.name, window)

    def take(self, tenant: str, seconds: float) -> None:
        """`seconds` more (less: a refund) from each of `tenant`'s buckets."""
        now, share = self.clock(), max(1, self.share())
        for b in self._buckets.get(tenant, {}).values():
            b.look(now, share)
            b.level = min(b.level - seconds, b.quota / share)

    def _standing(self, window: Window, b: Bucket, share: int) -> Standing:
        capacity = b.quota / share
        reset = (capacity - b.level) / (capacity / b.period) if capacity else 0.0
        return Standing(window, b.quota, b.level * share, reset)


def refused(tenant: str, window: Window, seconds: float) -> None:
    """The metrics of a request the quota of `window` refused."""
    metrics.TENANT_AUDIO.labels(tenant=tenant, outcome="refused").inc(seconds)
    metrics.TENANT_REJECTIONS.labels(tenant=tenant, reason=f"quota_{window}").inc()


def _per(window: Window) -> str:
    return f"audio seconds per {window}"


def rate_limited(
    tenant: str, window: Window, seconds: float, wait: float, standing: Standing
) -> APIError:
    return APIError(
        429,
        f"Rate limit reached for tenant `{tenant}` on {_per(window)}: Limit {standing.limit}, "
        f"Remaining {max(0.0, standing.remaining):.1f}, Requested {seconds:.1f}. Please try "
        f"again in {duration(wait)}.",
        type=TYPE, code=RATE_LIMITED,
        headers={"Retry-After": str(max(1, _up(wait))),
                 "retry-after-ms": str(max(1, _up(wait * 1000))), **standing.headers()},
    )  # fmt: skip


def never_fits(tenant: str, window: Window, seconds: float, standing: Standing) -> APIError:
    return APIError(
        429,
        f"This request's audio ({seconds:.1f} s) is longer than tenant `{tenant}`'s whole "
        f"quota of {standing.limit} {_per(window)} (spec.frontend.tenants[].quota."
        f"{FIELD[window]}): it can never fit, so retrying will not help. Split the audio, or "
        "ask the gateway's operators for a larger quota.",
        type=TYPE, code=RATE_LIMITED, headers={"x-should-retry": "false", **standing.headers()},
    )  # fmt: skip


def no_quota(tenant: str, window: Window) -> APIError:
    return APIError(
        429,
        f"Tenant `{tenant}`'s quota is 0 {_per(window)} (spec.frontend.tenants[].quota."
        f"{FIELD[window]}): it may not send any audio. Ask the gateway's operators to raise it.",
        type=TYPE, code=NO_QUOTA, headers={"x-should-retry": "false"},
    )  # fmt: skip
