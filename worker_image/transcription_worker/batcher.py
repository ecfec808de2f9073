"""The lane: a bounded queue in front of the model that decodes requests in batches.

Every request's audio is cut into windows of at most 30 s. Whenever the model is free, the
lane takes up to `max_batch_size` windows -- round-robin over the requests admitted, oldest
first, so a long recording cannot hold back a short one -- and decodes them as one batch.
A request that arrives while a batch runs joins the next one: continuous batching at the
granularity of a window. In a sequential pool, a batch holds windows of the oldest request
only (one request at a time; a long one still decodes its windows together).

Interactive requests first. A request the gateway marks background (`PRIORITY_HEADER`:
long audio's chunks) is batched only when no interactive request has a window ready: while
one has, the next batch holds interactive windows only, none of the background ones -- not
even in a batch's free slots, since on a CPU a batch of two windows costs about twice one,
and a short request's window would pay for the chunk's. (A lane with parallel batches runs
them on separate GPUs: a free one may take background windows while interactive ones
decode on another.) A short request that arrives while a chunk's window decodes still
waits for that batch to end; it no longer shares the next. In a sequential pool, the
request served next is the oldest interactive one, else the oldest background one.
Starvation is bounded: a background request that had a window ready while
`background_wait` (8) batches in a row began without it counts as interactive until one of
its windows is batched -- under interactive load that never stops, background work still
gets one batch in nine.

A short request that arrives while a batch of background windows decodes waits for it to
end (a batch is not interrupted), and a batch of N windows takes about N times one on a
CPU. So while interactive requests are about -- one admitted, or one in the last
`interactive_recent_s` (5) seconds -- a batch of background windows holds at most
`background_batch_size` of them: 1 on a CPU worker (`main`), which bounds that wait to one
window; with no interactive request about, background batches are full again, so a long
file alone loses nothing. On GPUs, where a batch costs little more than one window, the
limit is the batch size. And a batch is one round of the temperature fallback
(`transcriber`): a window whose text looks wrong comes back ready at the next temperature and
is scheduled again like any ready window, so an interactive window goes between two rounds
of a background one instead of waiting for all of them (seconds each: a repetition loop at
beam 5, then 5 samples a temperature).

Each request gets its segments in order, as soon as they and everything before them are
decoded, so a stream sends text while the rest is still being decoded. A request whose
client went away is dropped before its next window is scheduled. The queue is bounded: a
request beyond `capacity` is refused (the caller's 503).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import metrics
from .transcriber import Options, Transcriber, Window
from .windows import SAMPLE_RATE, Audio

log = logging.getLogger(__name__)


# Batches in a row a background job with a window ready may be passed over before it is
# served as interactive (module docstring).
BACKGROUND_WAIT = 8
# How long after an interactive request was admitted the lane still expects more (and keeps
# background batches to `background_batch_size`).
INTERACTIVE_RECENT_S = 5.0


class QueueFull(RuntimeError):
    pass


@dataclass(eq=False)
class Job:
    """One request: its audio and options in, ("info" | "segment" | "done" | "error", value)
    events out."""

    audio: Audio
    options: Options
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    windows: list[Window] | None = None  # None until cut
    in_flight: int = 0  # windows of this job in running batches
    handed_out: int = 0  # windows whose segments have all been sent
    segments: int = 0  # segments sent
    info_sent: bool = False
    background: bool = False  # the gateway's own background work: after interactive jobs
    passed_over: int = 0  # batches begun in a row without this (background) job's ready windows

    @property
    def duration(self) -> float:
        return float(self.audio.shape[0]) / SAMPLE_RATE

    def ready(self) -> list[Window]:
        """Windows that can go into the next batch."""
        return [w for w in self.windows or [] if not w.busy and not w.done]

    def hand_out(self) -> bool:
        """Send what is decoded, in order; True when everything has been sent."""
        windows = self.windows or []
        if not self.info_sent:
            if windows and windows[0].language is None:
                return False  # the language is detected on the first window's first step
            language = (windows[0].language if windows else None) or self.options.language
            self.events.put_nowait(
                ("info", {"language": language or "en", "duration": self.duration})
            )
            self.info_sent = True
        while self.handed_out < len(windows):
            w = windows[self.handed_out]
            if w.busy:
                return False  # being decoded in another batch right now
            for s in w.segments:
                s.id = self.segments
                self.segments += 1
                self.events.put_nowait(("segment", s))
            w.segments = []
            if not w.done:
                return False
            self.handed_out += 1
        self.events.put_nowait(("done", None))
        return True


class Lane:
    """Batches the windows of concurrent requests through one Transcriber."""

    def __init__(
        self,
        transcriber: Transcriber,
        max_queue: int,
        *,
        max_batch_size: int | None = None,
        sequential: bool = False,
        background_wait: int = BACKGROUND_WAIT,
        background_batch_size: int | None = None,
        interactive_recent_s: float = INTERACTIVE_RECENT_S,
    ) -> None:
        self.transcriber = transcriber
        self.max_queue = max_queue
        self.max_batch_size = max_batch_size or transcriber.decoding.max_batch_size
        self.sequential = sequential
        self.background_wait = background_wait
        # While interactive requests are about, at most this many background windows in a
        # batch: the batch an interactive request arrives during is one it waits for.
        self.background_batch_size = background_batch_size or self.max_batch_size
        self.interactive_recent_s = interactive_recent_s
        self.last_interactive = -math.inf  # when an interactive request was last admitted
        self.jobs: list[Job] = []  # admitted, not finished; oldest first
        self.batches = 0  # batches decoded so far
        self.largest_batch = 0  # most windows decoded together so far
        self._free = transcriber.workers
        self._busy_at = 0.0  # when the time batches ran was last counted (`_busy`)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # (the loop keeps no weak references)

    @property
    def capacity(self) -> int:
        """Requests admitted at once: those one round of batches decodes, plus `max_queue`."""
        slots = 1 if self.sequential else self.transcriber.workers * self.max_batch_size
        return slots + self.max_queue

    @property
    def running(self) -> int:
        return sum(1 for j in self.jobs if j.in_flight)

    @property
    def waiting(self) -> int:
        return len(self.jobs) - self.running

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def submit(self, job: Job) -> None:
        self.jobs = [j for j in self.jobs if not j.cancelled.is_set() or j.in_flight]
        if len(self.jobs) >= self.capacity:
            raise QueueFull(f"{self.running} running and {self.waiting} waiting")
        self.jobs.append(job)
        if not job.background:
            self.last_interactive = time.monotonic()
        asyncio.get_running_loop().create_task(self._cut(job))

    async def _cut(self, job: Job) -> None:
        try:
            job.windows = await asyncio.to_thread(self.transcriber.windows, job.audio, job.options)
        except Exception as e:
            self._finish(job, e)
            return
        if not job.windows:  # nothing to decode (VAD found no speech)
            job.hand_out()
            self._finish(job)
        self._poke()

    def _poke(self) -> None:
        if self._wake:
            self._wake.set()

    def urgent(self, job: Job) -> bool:
        """Whether `job` is batched with the interactive ones: it is one, or it is background
        work that has been passed over `background_wait` batches in a row."""
        return not job.background or job.passed_over >= self.background_wait

    def interactive_about(self) -> bool:
        """Whether an interactive request is admitted, or was in the last
        `interactive_recent_s` seconds (the next may come soon)."""
        recent = time.monotonic() - self.last_interactive < self.interactive_recent_s
        return recent or any(not j.background for j in self.jobs)

    def next_batch(self) -> list[Window]:
        """Up to `max_batch_size` windows that can be decoded together: round-robin over the
        admitted interactive requests (oldest first) when any has a window ready, else over
        the background ones; the first request's next window sets the key."""
        for job in [j for j in self.jobs if j.cancelled.is_set() and not j.in_flight]:
            self._finish(job)
        ready = [(j, q) for j in self.jobs if j.windows is not None and (q := j.ready())]
        if self.sequential and any(j.in_flight for j in self.jobs):
            return []  # one request at a time
        queues = [(j, q) for j, q in ready if self.urgent(j)] or ready
        if self.sequential:
            queues = queues[:1]
        if not queues:
            return []
        key = queues[0][1][0].key
        size = self.max_batch_size
        if not any(self.urgent(j) for j, _ in queues) and self.interactive_about():
            size = self.background_batch_size
        batch: list[Window] = []
        taken: set[Job] = set()
        depth = 0
        while len(batch) < size and any(len(q) > depth for _, q in queues):
            for job, q in queues:
                if depth < len(q) and q[depth].key == key and len(batch) < size:
                    batch.append(q[depth])
                    taken.add(job)
            depth += 1
        for job, _ in ready:  # the aging bound: count the batches a background job misses
            job.passed_over = 0 if job in taken else job.passed_over + int(job.background)
        return batch

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._free:
                batch = self.next_batch()
                if not batch:
                    break
                self._busy(1)
                owners = self._claim(batch)
                self._running.add(asyncio.create_task(self._run(batch, owners)))
                self._running = {t for t in self._running if not t.done()}

    def _claim(self, batch: list[Window]) -> list[Job]:
        owners = []
        for w in batch:
            job = next(j for j in self.jobs if j.windows and w in j.windows)
            w.busy = True
            job.in_flight += 1
            owners.append(job)
        return owners

    def _busy(self, batches: int) -> None:
        """`batches` more (or fewer) run now: the time at least one ran is counted."""
        now = time.monotonic()
        if self._free < self.transcriber.workers:
            metrics.BUSY_SECONDS.inc(now - self._busy_at)
        self._busy_at = now
        self._free -= batches

    async def _run(self, batch: list[Window], owners: list[Job]) -> None:
        error: Exception | None = None
        try:
            await asyncio.to_thread(self.transcriber.step, batch)
            self.batches += 1
            self.largest_batch = max(self.largest_batch, len(batch))
            metrics.BATCH_WINDOWS.observe(len(batch))
        except Exception as e:  # the model failed: every request in the batch gets the error
            log.exception("decoding a batch of %d windows failed", len(batch))
            error = e
        finally:
            self._busy(-1)
        for w, job in zip(batch, owners, strict=True):
            w.busy = False
            job.in_flight -= 1
        for job in dict.fromkeys(owners):
            if job not in self.jobs:
                continue
            if error is not None:
                self._finish(job, error)
            elif job.cancelled.is_set():
                if not job.in_flight:
                    self._finish(job)
            elif job.hand_out():
                self._finish(job)
        self._poke()

    def _finish(self, job: Job, error: Exception | None = None) -> None:
        if error is not None:
            job.events.put_nowait(("error", error))
        for w in job.windows or []:
            w.features = w.encoded = None
        if job in self.jobs:
            self.jobs.remove(job)
