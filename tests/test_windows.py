"""Pure parts of the faster-whisper worker: cutting audio into windows on silence, mapping
window times back, request options, and the device checks (real CTranslate2, no GPU here)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from transcription_worker.device import DeviceError, check_gpus, cpu_count, unusable
from transcription_worker.transcriber import FALLBACK_TEMPERATURES, Options
from transcription_worker.windows import (
    SAMPLE_RATE,
    WINDOW_SAMPLES,
    TimeMap,
    group,
    split_on_silence,
)

SR = SAMPLE_RATE


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * SR)).astype(np.float32)


def with_pauses(seconds: float, pauses: list[float]) -> np.ndarray:
    """`seconds` of loud noise with 300 ms of silence centred at each of `pauses`."""
    audio = noise(seconds)
    for p in pauses:
        audio[int((p - 0.15) * SR) : int((p + 0.15) * SR)] = 0
    return audio


def test_short_audio_is_one_window() -> None:
    assert split_on_silence(noise(29.9)) == [(0, int(29.9 * SR))]
    assert split_on_silence(noise(30)) == [(0, WINDOW_SAMPLES)]


def test_long_audio_is_cut_in_its_pauses() -> None:
    audio = with_pauses(75, [24.0, 47.5, 61.0])
    windows = split_on_silence(audio)
    cuts = [b / SR for _, b in windows[:-1]]
    # Each cut falls in the pause before the 30 s limit: at 24 s, then 47.5 s (the pause at
    # 61 s is not needed: 47.5 + 30 > 75).
    assert cuts == pytest.approx([24.0, 47.5], abs=0.1)
    assert windows[0][0] == 0 and windows[-1][1] == len(audio)
    assert all(a == b for (_, a), (b, _) in itertools.pairwise(windows))
    assert all(b - a <= WINDOW_SAMPLES for a, b in windows)


def test_audio_without_pauses_is_cut_at_its_quietest_moment_before_30_s() -> None:
    audio = noise(70)
    audio[int(27 * SR) : int(27.1 * SR)] *= 0.2  # quieter, not silent
    windows = split_on_silence(audio)
    assert windows[0][1] / SR == pytest.approx(27.05, abs=0.06)
    assert all(b - a <= WINDOW_SAMPLES for a, b in windows)
    assert sum(b - a for a, b in windows) == len(audio)


def test_silence_is_cut_in_the_middle_of_the_search_region() -> None:
    windows = split_on_silence(np.zeros(65 * SR, dtype=np.float32))
    assert [round((b - a) / SR, 1) for a, b in windows] == [25.0, 25.0, 15.0]


def test_vad_speech_is_grouped_into_windows_of_at_most_30_s() -> None:
    s = SR
    speech = [(0, 10 * s), (12 * s, 25 * s), (26 * s, 33 * s), (40 * s, 70 * s), (80 * s, 81 * s)]
    assert group(speech) == [
        [(0, 10 * s), (12 * s, 25 * s), (26 * s, 33 * s)],  # 30 s of speech exactly
        [(40 * s, 70 * s)],
        [(80 * s, 81 * s)],
    ]
    assert group([]) == []


def test_time_map_puts_window_times_back_where_they_were_spoken() -> None:
    # A window of two speech ranges: 2-5 s and 10-12 s of the request's audio.
    m = TimeMap([(2 * SR, 5 * SR), (10 * SR, 12 * SR)])
    assert m.original(0.0) == 2.0
    assert m.original(2.5) == 4.5
    assert m.original(3.5) == 10.5  # 0.5 s into the second range
    assert m.original(3.0, is_end=True) == 5.0  # an end belongs to the range it ends
    assert m.original(3.0) == 10.0  # a start, to the range it starts
    # A word is mapped through the range its middle falls in, both ends alike.
    assert m.word(2.9, 3.4) == (9.9, 10.4)
    assert TimeMap([(SR, 2 * SR)]).original(0.25) == 1.25
    assert TimeMap([]).original(0.5) == 0.5


def test_temperature_keeps_its_openai_meaning() -> None:
    assert Options(temperature=0).temperatures == FALLBACK_TEMPERATURES
    assert FALLBACK_TEMPERATURES[0] == 0 and FALLBACK_TEMPERATURES[-1] == 1
    assert Options(temperature=0.4).temperatures == (0.4,)


def test_cpu_count_follows_the_cgroup_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_count(tmp_path) == min(2, len(__import__("os").sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_count(tmp_path) >= 1
    assert cpu_count(tmp_path / "missing") >= 1


def test_a_gpu_the_worker_cannot_see_is_refused_with_the_reason() -> None:
    with pytest.raises(DeviceError) as e:
        check_gpus(1)  # this machine has no CUDA device
    msg = str(e.value)
    assert "was given 1 GPU(s) but CTranslate2 sees 0 CUDA device(s)" in msg
    assert "will not decode on the CPU instead" in msg
    assert "nvidia.com/gpu" in msg


def test_a_gpu_without_cuda_libraries_names_the_cuda_image() -> None:
    msg = unusable(1, RuntimeError("Library libcublas.so.12 is not found or cannot be loaded"))
    assert "cannot decode on them: Library libcublas.so.12 is not found" in msg
    assert "worker_image/Dockerfile.cuda" in msg and "fasterWhisperCuda" in msg
    assert "Dockerfile.cuda" not in unusable(
        1, RuntimeError("CUDA failed with error out of memory")
    )
