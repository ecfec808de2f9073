"""faster-whisper behind a single-lane queue: one transcription at a time per model.

A request is decoded first (bad audio fails fast, even while the lane is busy), then
queued; the queue is bounded (a full queue is the caller's 503). The lane runs one job at
a time in a thread and hands segments back as they are decoded, so a stream sends each
one as soon as it exists. A job whose client went away is skipped if it has not started,
and stopped between segments if it has.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

SAMPLE_RATE = 16000


class AudioError(ValueError):
    """The upload cannot be decoded as audio."""


class QueueFull(RuntimeError):
    pass


def decode(file: IO[bytes]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Decode any container PyAV/ffmpeg reads into 16 kHz mono float32 samples."""
    from faster_whisper.audio import decode_audio

    try:
        audio = decode_audio(file, sampling_rate=SAMPLE_RATE)
    except Exception as e:  # PyAV raises many error types for bad input
        raise AudioError(
            "Invalid or corrupted audio data. Ensure the input is a valid audio or video file "
            "(e.g. a complete WAV, MP3, FLAC, OGG, WebM or M4A)."
        ) from e
    if audio.size == 0:
        raise AudioError("The audio contains no samples.")
    return np.asarray(audio, dtype=np.float32)


@dataclass(frozen=True)
class Options:
    task: str = "transcribe"  # or "translate"
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class Job:
    audio: np.ndarray[Any, np.dtype[np.float32]]
    options: Options
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)

    @property
    def duration(self) -> float:
        return float(self.audio.shape[0]) / SAMPLE_RATE


class Transcriber:
    """The model: loads once, transcribes one job at a time."""

    def __init__(self, model_path: str, threads: int = 0, beam_size: int = 5) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(
            model_path, device="auto", compute_type="int8", cpu_threads=threads
        )
        self.beam_size = beam_size

    @property
    def multilingual(self) -> bool:
        return bool(self.model.model.is_multilingual)

    def run(self, job: Job) -> Iterator[tuple[str, Any]]:
        o = job.options
        segments, info = self.model.transcribe(
            job.audio,
            task=o.task,
            language=o.language if self.multilingual else "en",
            initial_prompt=o.prompt,
            temperature=o.temperature,
            word_timestamps=o.words,
            beam_size=self.beam_size,
            condition_on_previous_text=False,
        )
        yield "info", {"language": info.language, "duration": info.duration}
        for s in _segments(segments):
            if job.cancelled.is_set():
                return
            yield "segment", s


def _segments(raw: Iterable[Any]) -> Iterator[Segment]:
    for i, s in enumerate(raw):
        yield Segment(
            id=i,
            start=float(s.start),
            end=float(s.end),
            text=s.text,
            tokens=list(s.tokens),
            temperature=float(s.temperature or 0.0),
            avg_logprob=float(s.avg_logprob),
            compression_ratio=float(s.compression_ratio),
            no_speech_prob=float(s.no_speech_prob),
            words=[(w.word, float(w.start), float(w.end)) for w in (s.words or [])],
        )


class Lane:
    """A bounded queue in front of one Transcriber."""

    def __init__(self, transcriber: Transcriber, max_queue: int) -> None:
        self.transcriber = transcriber
        self.max_queue = max_queue
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.running = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def submit(self, job: Job) -> None:
        # A free lane takes the job at once; a busy one holds at most max_queue waiting.
        if self.running and self.queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self.running} running and {self.queue.qsize()} waiting")
        self.queue.put_nowait(job)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job = await self.queue.get()
            if job.cancelled.is_set():
                continue  # the client left while it waited: nothing to do
            self.running = 1

            def work(job: Job = job) -> None:
                try:
                    for event in self.transcriber.run(job):
                        loop.call_soon_threadsafe(job.events.put_nowait, event)
                    loop.call_soon_threadsafe(job.events.put_nowait, ("done", None))
                except Exception as e:
                    loop.call_soon_threadsafe(job.events.put_nowait, ("error", e))

            try:
                await asyncio.to_thread(work)
            finally:
                self.running = 0
