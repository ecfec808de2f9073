"""Work in audio-seconds, as this frontend replica sees it: the audio each request brings a
pool, and how fast the pool's workers get through it. What the autoscaler scales on
(load.py sums it over the replicas, scaler.py answers KEDA).

A request's audio counts for a pool from the moment its length is known until its answer has
been sent (a `Ticket`), at one of three stages:
- arriving: its upload still streaming (counted once the file's first 4 KiB have arrived:
  `sniff.audio_seconds_from_head`, the header's length, else an estimate from the
  Content-Length), being parsed, or (long audio) decoded and cut; counted for the pool a
  plain request to the deployment it names goes to first, until it is routed (its other
  fields may send it to another: so this stage adds to a pool's metric, and wakes no pool
  from zero);
- queued: held while its pools have no worker (hold.py), or (long audio) the chunks of the
  file that have not started; each chunk that has counts as a request of its own
  (longaudio/);
- in flight: at a worker, from the first byte sent until the answer has been sent. A request
  served by a fallback pool because the pool it prefers had no ready worker counts for the
  preferred pool too (`spilled`), as `Router.spill` counts it.
Every request counts at least `MIN_SECONDS` (a chat request without audio, a short clip:
Whisper decodes at least a 30 s window for it).

The decode rate: audio seconds one worker endpoint gets through per second while it is busy.
Each endpoint's `Meter` adds the audio of every answer (200) it sent, and the time it had at
least one of this replica's requests, both as sums that decay with time constant `TAU`
(an exponentially weighted moving average in continuous time). The busy time is shared out
among the requests in flight (each gets its part of every moment: a second with four in
flight is a quarter second each) and added when each request ends, with its audio: a request
still running weighs nothing yet, so a long one does not lower the rate while it runs.

The level the autoscaler reads: a pool's audio now (every stage), or, when higher, its
time-weighted average over the last moments (an exponentially weighted moving average in
continuous time, time constant `SMOOTH_SECONDS`, brought up to date at each change). Clients
of a batching pool get their answers together and send their next requests a moment later:
the pool's audio drops to nothing between batches although the load is steady, and an HPA
that reads the metric in such a gap, twice within its scale-down window, removes a replica
the load needs (issue 36's e2e run: a vLLM replica removed 30 s into its start). The
average bridges the gaps; the level now still scales up at once on a burst; when the load
really ends the average is gone within a few `SMOOTH_SECONDS`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from . import metrics
from .sniff import audio_seconds_from_head

MIN_SECONDS = 1.0
TAU = 120.0  # seconds: the decode rate's memory
# The pool's default rate weighs as much as this much measured busy time (`decode_rate`).
PRIOR_SECONDS = 10.0
# A meter idle this long weighs nothing any more (e^-10): forgotten.
FORGET_SECONDS = 10 * TAU
SMOOTH_SECONDS = 5.0  # the autoscaler's level: the memory of its average
FADE = 5  # an average this many SMOOTH_SECONDS after the audio ended is 0 (e^-5 left)


class Stage(StrEnum):
    ARRIVING = "arriving"
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"


SPILLED = "spilled"  # the audio in flight elsewhere that this pool would have served first
STAGES = (*Stage, SPILLED)


class DecodeSample(BaseModel):
    """A pool's decode measurement on one replica, as decaying sums (`TAU`) over its
    endpoints."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    decoded: float = Field(default=0.0, ge=0, description="Audio seconds answered (200).")
    busy: float = Field(
        default=0.0, ge=0, description="Seconds an endpoint had a request of this replica."
    )
    window: float = Field(
        default=0.0, ge=0,
        description="Seconds the endpoints have been measured: what `busy` of all replicas "
        "together cannot exceed.",
    )  # fmt: skip


def decode_rate(samples: list[DecodeSample], prior: float) -> float:
    """Audio seconds one worker decodes per second: the samples of every frontend replica
    together, with `prior` (the pool's default rate) weighing as `PRIOR_SECONDS` of busy
    time: the default until something is measured, the measurement soon after. Replicas
    whose requests share an endpoint each count its busy time: their sum is capped at the
    longest window, the time the endpoints were measured (busy all along)."""
    decoded = sum(s.decoded for s in samples)
    busy = sum(s.busy for s in samples)
    if sum(1 for s in samples if s.busy) > 1:
        busy = min(busy, max(s.window for s in samples))
    return (decoded + prior * PRIOR_SECONDS) / (busy + PRIOR_SECONDS)


@dataclass
class Meter:
    """One worker endpoint's decoding, as this replica sees it."""

    pool: str
    since: float
    at: float  # when the sums were last brought up to date
    in_flight: int = 0
    decoded: float = 0.0
    busy: float = 0.0
    shares: float = 0.0  # the busy seconds one request in flight all along has had

    def advance(self, now: float) -> None:
        if self.in_flight:
            self.shares += (now - self.at) / self.in_flight
        f = math.exp(-(now - self.at) / TAU)
        self.busy *= f
        self.decoded *= f
        self.at = now

    def start(self, now: float) -> float:
        """A request starts: the mark its share of the busy time is counted from."""
        self.advance(now)
        self.in_flight += 1
        return self.shares

    def end(self, now: float, mark: float, seconds: float) -> None:
        """The request started at `mark` ends, `seconds` of audio decoded."""
        self.advance(now)
        self.in_flight -= 1
        self.busy += self.shares - mark
        self.decoded += seconds

    def sample(self, now: float) -> DecodeSample:
        """The sums as of the last start or end, decayed to `now`."""
        f = math.exp(-(now - self.at) / TAU)
        window = TAU * (1 - math.exp(-(now - self.since) / TAU))
        return DecodeSample(decoded=self.decoded * f, busy=self.busy * f, window=window)


@dataclass
class Level:
    """A pool's audio seconds (every stage) now, and their time-weighted average."""

    smooth: float  # the average's time constant (0: the level now)
    at: float  # when `average` was last brought up to date
    now: float = 0.0
    average: float = 0.0

    def set(self, at: float, value: float) -> None:
        self.average = self.averaged(at)
        self.at, self.now = at, value

    def averaged(self, at: float) -> float:
        """The average at `at`, the level having held since the last change."""
        if self.smooth <= 0 or (not self.now and at - self.at >= FADE * self.smooth):
            return self.now
        return self.now + (self.average - self.now) * math.exp(-(at - self.at) / self.smooth)


class Ticket:
    """One request's audio, counted for one pool at one stage until `close`."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.pool: str | None = None
        self.stage = Stage.ARRIVING
        self.seconds = 0.0
        self.spilled_from: str | None = None
        self.closed = False
        self.at: tuple[Meter, float] | None = None  # the endpoint it is at, and its mark

    def counted(self) -> list[tuple[str, str]]:
        """The (pool, stage) sums its audio is in."""
        if self.closed or self.pool is None:
            return []
        here = (self.pool, self.stage.value)
        return [here, (self.spilled_from, SPILLED)] if self.spilled_from else [here]

    def count(self, seconds: float, pool: str | None = None) -> None:
        """The request's audio is `seconds` long (or now known better); it counts for `pool`
        (None: the pool it counts for already)."""
        self.work.move(self, pool or self.pool, self.stage, max(seconds, MIN_SECONDS),
                       self.spilled_from)  # fmt: skip

    def expect(self, pool: str | None) -> None:
        """Count its audio (if known yet) for `pool`, the pool it is likely to go to."""
        self.work.move(self, pool, self.stage, self.seconds, self.spilled_from)

    def on_file_head(self, content_length: str | None) -> Callable[[bytes], None] | None:
        """What counts an upload while it arrives, from its file's first bytes
        (`parse_upload`'s `on_file_head`); None without a Content-Length."""
        if not content_length or not content_length.isdigit():
            return None

        def heard(head: bytes) -> None:
            seconds = audio_seconds_from_head(head, int(content_length))
            if seconds is not None:
                self.count(seconds)

        return heard

    def queued(self, pool: str) -> None:
        self.work.move(self, pool, Stage.QUEUED, self.seconds)

    def close(self) -> None:
        self.work.move(self, None, self.stage, self.seconds)
        self.closed = True


class Work:
    """The audio this replica counts for each pool, and its workers' meters."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, smooth: float | None = None
    ) -> None:
        self.clock = clock
        self.smooth = SMOOTH_SECONDS if smooth is None else smooth
        self._seconds: dict[tuple[str, str], float] = defaultdict(float)
        self._tickets: dict[tuple[str, str], int] = defaultdict(int)
        self._levels: dict[str, Level] = {}  # by pool
        self._meters: dict[str, Meter] = {}  # by endpoint URL

    def ticket(self) -> Ticket:
        return Ticket(self)

    def seconds(self, pool: str, stage: str) -> float:
        """Audio seconds counted for `pool` at `stage` (a Stage, or SPILLED)."""
        return self._seconds.get((pool, stage), 0.0)

    def move(
        self, ticket: Ticket, pool: str | None, stage: Stage, seconds: float,
        spilled_from: str | None = None,
    ) -> None:  # fmt: skip
        """Count `ticket` for `pool` (None: for none) at `stage`, `seconds` long."""
        if ticket.closed:
            return
        self._add(ticket, -1)
        ticket.pool, ticket.stage, ticket.seconds = pool, stage, seconds
        ticket.spilled_from = spilled_from
        self._add(ticket, 1)

    def level(self, pool: str) -> float:
        """The audio seconds the autoscaler reads for `pool`: those counted now or, when
        higher, their average over the last moments (`SMOOTH_SECONDS`)."""
        level = self._levels.get(pool)
        if level is None:
            return 0.0
        return max(level.now, level.averaged(self.clock()))

    def _add(self, ticket: Ticket, sign: int) -> None:
        now = self.clock()
        for pool, stage in ticket.counted():
            key = (pool, stage)
            self._tickets[key] += sign
            # Exactly 0 once nothing counts: no rounding left behind.
            left = self._seconds[key] + sign * ticket.seconds
            self._seconds[key] = left if self._tickets[key] else 0.0
            metrics.BACKLOG.labels(pool=pool, stage=stage).set(self._seconds[key])
            level = self._levels.get(pool)
            if level is None:
                level = self._levels[pool] = Level(self.smooth, at=now)
            level.set(now, sum(self.seconds(pool, s) for s in STAGES))

    # ------------------------------------------------------------------ decode rate

    def started(self, ticket: Ticket, pool: str, url: str, spilled_from: str | None) -> None:
        """The request of `ticket` is at endpoint `url` of `pool` now (in place of
        `spilled_from`'s, which had no ready worker)."""
        self.move(ticket, pool, Stage.IN_FLIGHT, ticket.seconds, spilled_from)
        now = self.clock()
        meter = self._meters.get(url)
        if meter is None or meter.pool != pool:
            meter = self._meters[url] = Meter(pool, since=now, at=now)
        ticket.at = meter, meter.start(now)

    def ended(self, ticket: Ticket, answered: bool) -> None:
        """The request of `ticket` left its endpoint: `answered` (200), its audio counts
        as decoded."""
        if ticket.at is None:
            return
        meter, mark = ticket.at
        ticket.at = None
        meter.end(self.clock(), mark, ticket.seconds if answered else 0.0)
        if answered:
            sample = self.sample(meter.pool)
            if sample.busy > 0:
                metrics.DECODE_RATE.labels(pool=meter.pool).set(sample.decoded / sample.busy)

    def sample(self, pool: str) -> DecodeSample:
        """`pool`'s decode measurement on this replica, now."""
        now = self.clock()
        for url, m in list(self._meters.items()):
            if not m.in_flight and now - m.at > FORGET_SECONDS:
                del self._meters[url]
        samples = [m.sample(now) for m in self._meters.values() if m.pool == pool]
        return DecodeSample(
            decoded=sum(s.decoded for s in samples),
            busy=sum(s.busy for s in samples),
            window=sum(s.window for s in samples),
        )
