"""The faster-whisper worker's lane, watched: the real model, each batch it decodes recorded
with whether each window's request was background work, and held at `gate` before it
decodes (for a test to line requests up behind it); and requests admitted to a lane (cut
into windows) without its loop running, for `Lane.next_batch` to be asked directly."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from transcription_worker.batcher import Job, Lane
from transcription_worker.engine import Transcriber, Window


class RecordingTranscriber:
    """The real Transcriber; every batch the lane gives it is recorded as the list of
    `background` flags of its windows' requests (`lane` is set once the Lane exists), then
    waits for `gate` (open unless a test clears it) and is decoded."""

    def __init__(self, real: Transcriber) -> None:
        self.real = real
        self.multilingual = real.multilingual
        self.decoding, self.workers, self.windows = real.decoding, real.workers, real.windows
        self.lane: Lane | None = None
        self.batches: list[list[bool]] = []
        self.gate = threading.Event()
        self.gate.set()

    def step(self, batch: list[Window]) -> None:
        assert self.lane is not None
        jobs = list(self.lane.jobs)  # (a copy: the lane's loop runs in another thread)
        self.batches.append(
            [next(j for j in jobs if j.windows and w in j.windows).background for w in batch]
        )
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        self.real.step(batch)


def watched_lane(real: Transcriber, **lane: Any) -> tuple[Lane, RecordingTranscriber]:
    recorder = RecordingTranscriber(real)
    watched = Lane(recorder, **lane)  # type: ignore[arg-type]
    recorder.lane = watched
    return watched, recorder


async def admit(lane: Lane, jobs: list[Job]) -> None:
    """Submit `jobs` in order and wait until each is cut into windows; the lane's loop is
    not started, so nothing is decoded until the caller asks for batches."""
    for job in jobs:
        lane.submit(job)
        for _ in range(6000):  # (the lane offers no event for it; 30 s at most)
            if job.windows is not None:
                break
            await asyncio.sleep(0.005)
        assert job.windows is not None, "the lane never cut the request into windows"
