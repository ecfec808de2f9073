"""Voice activity: Silero VAD run as a stream, over whole spooled files (long audio's cuts),
and the turn detection OpenAI calls `server_vad` on top of it (Realtime sessions).

Silero VAD v6 is the ONNX model faster-whisper ships. It is loaded from faster-whisper's
package directory without importing the package (which would load ctranslate2 into the
gateway). The model takes 512-sample frames of 16 kHz audio (32 ms), each preceded by the
64 samples before it, and carries an LSTM state (h, c) from frame to frame; its first
input dimension is the sequence of frames, so one frame a call with the state carried over
gives the same probabilities as faster-whisper's whole-clip batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime  # type: ignore[import-untyped]

from transcription_api.silero import model_path

FRAME = 512  # samples of 16 kHz audio a probability covers
CONTEXT = 64  # samples of the previous frame the model sees before each frame
FRAME_MS = 32
SAMPLES_PER_MS = 16
MIN_SPEECH_MS = 96  # speech shorter than this, then silence, is no turn
# Silero's hysteresis: once below threshold - NEG_OFFSET, a frame is silence (as in
# faster-whisper's use of it).
NEG_OFFSET = 0.15
# What Silero scores in one call at most: 8.2 s. Larger batches are hardly faster, and
# ONNX Runtime's memory grows with them (an hour: +7 MB at 256 frames a call, +28 MB at 1024).
BATCH_FRAMES = 256
BLOCK_SAMPLES = BATCH_FRAMES * FRAME  # a file's audio, read this much at a time
# Normalizing: the 99th percentile of the frames' RMS levels (the loud speech) is brought to
# this level, the gain kept within these bounds; the VAD's input only.
NORMALIZE_LEVEL = 0.25
NORMALIZE_PERCENTILE = 99.0
NORMALIZE_GAIN = (0.1, 100.0)

Floats = npt.NDArray[np.float32]
Samples = npt.NDArray[np.int16]


def neg_threshold(threshold: float) -> float:
    """Below this probability a frame is silence, for speech at `threshold` and above."""
    return max(threshold - NEG_OFFSET, 0.01)


@functools.cache
def _inference_session(path: Path) -> Any:
    """One ONNX Runtime session per model file, shared by all streams (its `run` is
    thread-safe; each stream keeps its own state), on one thread as faster-whisper's
    SileroVADModel configures it.

    Its memory arena is on (faster-whisper turns it off): it keeps the buffers of a call
    (at most BATCH_FRAMES) for the next. Without it, and with glibc's mmap threshold fixed
    (transcription_frontend.heap), every call maps and unmaps them afresh: Silero over an
    hour took 7.4 s instead of 6.5 s here, for the same 4-5 MB."""
    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    opts.enable_cpu_mem_arena = True
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(
        str(path), sess_options=opts, providers=["CPUExecutionProvider"]
    )


class Silero:
    """Silero VAD v6 over a stream of 16 kHz float32 samples: one speech probability for
    each completed 512-sample frame, state carried between calls."""

    def __init__(self, path: Path | None = None) -> None:
        self._session = _inference_session(path or model_path())
        self._batch = np.empty((BATCH_FRAMES, CONTEXT + FRAME), dtype=np.float32)  # reused
        self.reset()

    def reset(self) -> None:
        """Forget the stream: state, context and any incomplete frame."""
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def probabilities(self, samples16k: npt.ArrayLike) -> Floats:
        """Speech probabilities of the frames `samples16k` completes (possibly none)."""
        new = np.asarray(samples16k, dtype=np.float32).reshape(-1)
        audio = np.concatenate([self._pending, new]) if self._pending.size else new
        count = audio.size // FRAME
        self._pending = audio[count * FRAME :].copy()
        if not count:
            return np.zeros(0, dtype=np.float32)
        frames = audio[: count * FRAME].reshape(count, FRAME)
        return np.concatenate(
            [self._score(frames[i : i + BATCH_FRAMES]) for i in range(0, count, BATCH_FRAMES)]
        )

    def _score(self, frames: Floats) -> Floats:
        """One ONNX call over whole frames (at most BATCH_FRAMES), the state carried on."""
        batch = self._batch[: len(frames)]  # its leading rows: C-contiguous
        batch[0, :CONTEXT] = self._context
        batch[1:, :CONTEXT] = frames[:-1, -CONTEXT:]
        batch[:, CONTEXT:] = frames
        out, self._h, self._c = self._session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._context = frames[-1, -CONTEXT:].copy()
        return np.asarray(out, dtype=np.float32).reshape(-1)


class SpeechModel(Protocol):
    """What turn detection needs of a VAD model (Silero, or a stand-in in tests)."""

    def probabilities(self, samples16k: npt.ArrayLike) -> Floats: ...

    def reset(self) -> None: ...


# --------------------------------------------------------------------------- whole files


def probabilities(blocks: Iterable[Samples], model: SpeechModel, gain: float = 1.0) -> Floats:
    """The speech probability of each whole 32 ms frame of the 16 kHz 16-bit samples in
    `blocks` (of BLOCK_SAMPLES for the least memory), each first multiplied by `gain` and
    clipped; the model starts afresh."""
    model.reset()
    parts: list[Floats] = []
    for block in blocks:
        samples = block.astype(np.float32)
        samples *= np.float32(gain / 32768)
        if gain != 1.0:
            np.clip(samples, -1.0, 1.0, out=samples)
        parts.append(model.probabilities(samples))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def normalizing_gain(blocks: Iterable[Samples]) -> float:
    """The gain that brings the loud frames of the samples in `blocks` (each a whole number
    of frames but the last; the 99th percentile of 32 ms RMS levels) to NORMALIZE_LEVEL,
    within NORMALIZE_GAIN; 1 for digital silence."""
    levels: list[Floats] = []
    for block in blocks:
        whole = block.size // FRAME * FRAME
        if not whole:
            continue
        frames = block[:whole].reshape(-1, FRAME).astype(np.float32) / np.float32(32768)
        levels.append(np.sqrt(np.mean(np.square(frames), axis=1)))
    if not levels:
        return 1.0
    level = float(np.percentile(np.concatenate(levels), NORMALIZE_PERCENTILE))
    if level < 1e-5:
        return 1.0
    low, high = NORMALIZE_GAIN
    return min(max(NORMALIZE_LEVEL / level, low), high)


# --------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class ServerVad:
    """OpenAI's `server_vad` turn detection parameters, with its defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


Event = SpeechStarted | SpeechStopped


class TurnDetector:
    """Speech started / stopped events from 16 kHz audio, timed in milliseconds of audio
    since the session's first sample.

    A turn begins at a frame whose probability reaches `threshold` and is announced once
    MIN_SPEECH_MS of speech frames follow without a drop to silence; it is reported from
    that first frame less `prefix_padding_ms` (not before 0 nor the previous turn's end).
    Once speech has begun, frames count as silence from the first one below
    `threshold - 0.15` (Silero's hysteresis) until one reaches `threshold` again; after
    `silence_duration_ms` of silence the turn ends, at the silence's start plus
    `silence_duration_ms`, so it includes the silence.
    """

    def __init__(self, settings: ServerVad, model: SpeechModel) -> None:
        self.settings = settings
        self.model = model
        self.neg_threshold = neg_threshold(settings.threshold)
        self._origin_ms = 0  # where frame 0 of the model's stream starts on the timeline
        self._frames = 0  # frames the model has scored since the origin
        self._floor_ms = 0  # no turn starts before this: the last turn's end, or a clear
        self._candidate_ms: int | None = None  # first frame of speech not yet announced
        self._candidate_frames = 0
        self._speaking = False
        self._silence_ms: int | None = None  # start of the current silence in a turn

    @property
    def speaking(self) -> bool:
        """Whether a turn has been announced and has not ended."""
        return self._speaking

    @property
    def position_ms(self) -> int:
        """The end of the audio scored so far (complete frames), on the session timeline."""
        return self._origin_ms + self._frames * FRAME_MS

    def reset(self, at_ms: int) -> None:
        """Start over at `at_ms` (the buffer was cleared there): the timeline continues,
        model and turn state restart, and no turn is reported from before `at_ms`."""
        self.model.reset()
        self._origin_ms = at_ms
        self._frames = 0
        self._floor_ms = at_ms
        self._candidate_ms = None
        self._candidate_frames = 0
        self._speaking = False
        self._silence_ms = None

    def feed(self, samples16k: npt.ArrayLike) -> list[Event]:
        events: list[Event] = []
        for probability in self.model.probabilities(samples16k):
            event = self._frame(float(probability), self.position_ms)
            self._frames += 1
            if event is not None:
                events.append(event)
        return events

    def _frame(self, probability: float, start_ms: int) -> Event | None:
        settings = self.settings
        if self._speaking:
            if probability >= settings.threshold:
                self._silence_ms = None
            elif probability < self.neg_threshold and self._silence_ms is None:
                self._silence_ms = start_ms
            if (
                self._silence_ms is not None
                and start_ms + FRAME_MS - self._silence_ms >= settings.silence_duration_ms
            ):
                end_ms = self._silence_ms + settings.silence_duration_ms
                self._speaking = False
                self._silence_ms = None
                self._floor_ms = end_ms
                return SpeechStopped(audio_end_ms=end_ms)
            return None
        if self._candidate_ms is None:
            if probability < settings.threshold:
                return None
            self._candidate_ms = start_ms
            self._candidate_frames = 0
        elif probability < self.neg_threshold:
            self._candidate_ms = None  # a blip: speech too short to be a turn
            return None
        self._candidate_frames += 1
        if self._candidate_frames * FRAME_MS < MIN_SPEECH_MS:
            return None
        start = max(self._floor_ms, self._candidate_ms - settings.prefix_padding_ms, 0)
        self._candidate_ms = None
        self._speaking = True
        return SpeechStarted(audio_start_ms=start)
