"""The faster-whisper worker's lane, watched: the real model, each batch it decodes recorded
with whether each window's request was background work, and held at `gate` before it
decodes (for a test to line requests up behind it); and requests admitted to a lane (cut
into windows) without its loop running, for `Lane.next_batch` to be asked directly. For the
temperature fallback: each step's fallback rounds recorded, every decoder call's results
recorded, and the attempt the fallback chose when all its rounds ran in one step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from transcription_worker import faster_whisper_compat, transcriber
from transcription_worker.batcher import Job, Lane
from transcription_worker.transcriber import Attempt, Transcriber, Window


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
        self.rounds: list[list[int]] = []  # each batch's windows' fallback round (0: first)
        self.gate = threading.Event()
        self.gate.set()

    def step(self, batch: list[Window]) -> None:
        assert self.lane is not None
        jobs = list(self.lane.jobs)  # (a copy: the lane's loop runs in another thread)
        self.batches.append(
            [next(j for j in jobs if j.windows and w in j.windows).background for w in batch]
        )
        self.rounds.append([w.fallback for w in batch])
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


async def results(job: Job) -> tuple[list[Any], str]:
    """A job's segments, and how it ended ("done" or "error"), read from its events (two
    minutes at most between two of them)."""
    segments: list[Any] = []
    while True:
        kind, value = await asyncio.wait_for(job.events.get(), 120)
        if kind == "segment":
            segments.append(value)
        elif kind in ("done", "error"):
            return segments, kind


async def until(condition: Any) -> None:
    """Wait (without blocking the lane's loop) until `condition()` holds; a minute at most."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


class DecoderCalls:
    """Stands in for a Transcriber's CTranslate2 model: every `generate` call goes to the
    real one, and its temperature (0 for beam search) and results are recorded."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[tuple[float, list[Any]]] = []

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self.real.generate(*args, **kwargs)
        self.calls.append((float(kwargs.get("sampling_temperature", 0.0)), list(outputs)))
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def attempt(out: Any, temperature: float, tokenizer: Any) -> Attempt:
    """A decoder result as the fallback weighs it (faster-whisper's rules)."""
    tokens = out.sequences_ids[0]
    avg_logprob = out.scores[0] * len(tokens) / (len(tokens) + 1)
    ratio = faster_whisper_compat.compression_ratio(tokenizer.decode(tokens).strip())
    return (out, avg_logprob, temperature, ratio)


def chosen_in_one_step(attempts: list[Attempt], temperatures: tuple[float, ...]) -> Attempt:
    """What the fallback chose when all its rounds ran inside one step (the transcriber before
    rounds became steps, and faster-whisper's `generate_with_fallback`): the first
    acceptable attempt in temperature order; after the last temperature, the most probable
    readable one, reported at the last temperature."""
    for a in attempts[: len(temperatures)]:
        if transcriber._acceptable(a[0], a[1], a[3]):
            return a
    assert len(attempts) == len(temperatures), "a round too few or too many"
    readable = [a for a in attempts if a[3] <= transcriber.COMPRESSION_RATIO_THRESHOLD]
    best = max(readable or attempts, key=lambda a: a[1])
    return (best[0], best[1], temperatures[-1], best[3])
