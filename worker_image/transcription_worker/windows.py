"""Cutting a request's audio into windows of at most 30 s, Whisper's input length.

Windows are cut where nobody speaks, so that no word is split between two of them: at the
quietest moment before each 30 s mark, or -- when the pool filters with VAD -- between the
stretches of speech Silero VAD finds (the silence between them is left out). A window is a
list of sample ranges of the request's audio; `TimeMap` turns times within a window back
into times of the request's audio.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from . import faster_whisper_compat

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE

Audio = np.ndarray[Any, np.dtype[np.float32]]
Ranges = list[tuple[int, int]]


def split_on_silence(
    audio: Audio,
    max_samples: int = WINDOW_SAMPLES,
    search_samples: int = 10 * SAMPLE_RATE,
    frame_samples: int = SAMPLE_RATE // 10,
) -> Ranges:
    """Consecutive ranges covering `audio`, none longer than `max_samples`: each cut is in
    the quietest `frame_samples` (by energy) within the last `search_samples` before the
    limit -- in the middle of the last run of equally quiet frames (a pause)."""
    n = audio.shape[0]
    out: Ranges = []
    start = 0
    while n - start > max_samples:
        lo = start + max_samples - search_samples
        region = audio[lo : start + max_samples].astype(np.float64)
        energy = np.convolve(region * region, np.ones(frame_samples), mode="valid")
        quiet = np.flatnonzero(energy <= energy.min())
        last = int(quiet[-1])
        first = last
        while first > 0 and energy[first - 1] <= energy[last]:
            first -= 1
        cut = lo + (first + last) // 2 + frame_samples // 2
        out.append((start, cut))
        start = cut
    out.append((start, n))
    return out


def group(speech: Ranges, max_samples: int = WINDOW_SAMPLES) -> list[Ranges]:
    """Consecutive speech ranges, gathered into windows of at most `max_samples` of speech
    (each range is at most that long: VAD cuts longer speech)."""
    windows: list[Ranges] = []
    current: Ranges = []
    length = 0
    for a, b in speech:
        if current and length + (b - a) > max_samples:
            windows.append(current)
            current, length = [], 0
        current.append((a, b))
        length += b - a
    if current:
        windows.append(current)
    return windows


def speech_windows(audio: Audio) -> list[Ranges]:
    """Windows of the speech Silero VAD finds (faster-whisper's VAD, its default settings,
    with speech longer than 30 s cut at its last pause)."""
    return group(faster_whisper_compat.speech_timestamps(audio, max_speech_seconds=30))


class TimeMap:
    """Times in a window (its ranges laid end to end) -> times in the request's audio."""

    def __init__(self, ranges: Ranges) -> None:
        self.ends: list[int] = []  # where each range ends, in window samples
        self.shifts: list[float] = []  # seconds to add to a time within each range
        position = 0
        for a, b in ranges:
            self.shifts.append((a - position) / SAMPLE_RATE)
            position += b - a
            self.ends.append(position)

    def index(self, t: float, is_end: bool = False) -> int:
        sample = int(t * SAMPLE_RATE)
        if is_end and sample in self.ends:
            return self.ends.index(sample)  # an end time belongs to the range it ends
        return min(bisect.bisect(self.ends, sample), max(0, len(self.ends) - 1))

    def original(self, t: float, is_end: bool = False, index: int | None = None) -> float:
        if not self.shifts:
            return round(t, 3)
        i = self.index(t, is_end) if index is None else index
        return round(t + self.shifts[i], 3)

    def word(self, start: float, end: float) -> tuple[float, float]:
        """A word's times, both mapped through the range its middle falls in."""
        i = self.index((start + end) / 2)
        return self.original(start, index=i), self.original(end, index=i)
