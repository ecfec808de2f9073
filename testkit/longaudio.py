"""Long recordings for the long-audio tests and benchmarks: espeak-ng sentences joined by
pauses of chosen lengths, so where every sentence lies is known to the sample; recordings
with no silence at all; hour-long files made cheaply; damaged copies of files; a
recording's first sentences as a file of their own.
"""

from __future__ import annotations

import random
import subprocess
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from testkit.audio import HARD_SENTENCES, SENTENCES, require_tools, speak
from transcription_frontend.audio.encode import wav

RATE = 16000
# espeak-ng's own silence before and after a sentence is digital near-zero; speech starts
# where a sample first exceeds this (-60 dBFS) and ends where one last does.
SPEECH_FLOOR = 33
EDGE_SECONDS = 0.25  # silence before the first sentence and after the last

Samples = npt.NDArray[np.int16]


@dataclass(frozen=True)
class Spoken:
    """A sentence and where its speech lies in the recording, in seconds."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class Recording:
    wav: Path
    seconds: float
    sentences: tuple[Spoken, ...]

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.sentences)

    def pauses(self) -> list[tuple[float, float]]:
        """The silences: before the first sentence, between sentences, after the last."""
        edges = [0.0, *(t for s in self.sentences for t in (s.start, s.end)), self.seconds]
        return [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)]

    def sentence_at(self, t: float) -> Spoken | None:
        """The sentence being spoken at `t` seconds, if any."""
        return next((s for s in self.sentences if s.start < t < s.end), None)

    def pause_at(self, t: float) -> tuple[float, float] | None:
        """The pause `t` seconds falls in, if any."""
        return next((p for p in self.pauses() if p[0] <= t <= p[1]), None)


def read_wav(path: Path) -> Samples:
    with wave.open(str(path), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2), path
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def wav_of(samples: npt.ArrayLike) -> bytes:
    """A 16 kHz WAV of `samples` (numbers, clipped to 16 bits)."""
    return wav(np.clip(np.asarray(samples), -32768, 32767).astype("<i2").tobytes(), RATE)


def write_wav(path: Path, samples: npt.ArrayLike) -> Path:
    path.write_bytes(wav_of(samples))
    return path


def spoken(text: str, directory: Path) -> Samples:
    """`text` spoken by espeak-ng at 16 kHz, without its silence before and after."""
    samples = read_wav(speak(text, directory))
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > SPEECH_FLOOR)
    return samples[loud[0] : loud[-1] + 1]


def long_recording(
    directory: Path,
    seconds: float = 210.0,
    *,
    pause_range: tuple[float, float] = (0.3, 1.5),
    pause_list: Sequence[float] | None = None,
    sentences: Sequence[str] | None = None,
    seed: int = 0,
    noise_dbfs: float | None = -60.0,
    gain_db: float = 0.0,
    name: str = "long",
) -> Recording:
    """A WAV of sentences (default: SENTENCES and HARD_SENTENCES, shuffled, repeated) until
    at least `seconds`, with a pause after each: `pause_list` cycled, or lengths drawn
    uniformly from `pause_range`. A faint white noise floor (`noise_dbfs`; None: digital
    silence) covers everything; `gain_db` scales the speech."""
    require_tools()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pool = list(sentences if sentences is not None else SENTENCES + HARD_SENTENCES)
    gain = 10 ** (gain_db / 20)
    pieces: list[Samples] = [np.zeros(round(EDGE_SECONDS * RATE), dtype=np.int16)]
    placed: list[Spoken] = []
    position = pieces[0].size
    order: list[str] = []
    while position < seconds * RATE:
        if not order:
            order = rng.sample(pool, len(pool))
        text = order.pop()
        speech = spoken(text, directory)
        if gain != 1.0:
            speech = np.round(speech * gain).astype(np.int16)
        if placed:  # the pause before this sentence
            pause = (
                pause_list[(len(placed) - 1) % len(pause_list)]
                if pause_list
                else rng.uniform(*pause_range)
            )
            pieces.append(np.zeros(round(pause * RATE), dtype=np.int16))
            position += pieces[-1].size
        placed.append(Spoken(text, position / RATE, (position + speech.size) / RATE))
        pieces.append(speech)
        position += speech.size
    pieces.append(np.zeros(round(EDGE_SECONDS * RATE), dtype=np.int16))
    audio = np.concatenate(pieces).astype(np.float64)
    if noise_dbfs is not None:
        noise = np.random.default_rng(seed).standard_normal(audio.size)
        audio += noise * 32768 * 10 ** (noise_dbfs / 20)
    path = write_wav(directory / f"{name}.wav", np.round(audio))
    return Recording(path, audio.size / RATE, tuple(placed))


def excerpt(recording: Recording, seconds: float, out: Path) -> Recording:
    """The start of `recording` up to about `seconds`: its sentences that end by then (at
    least the first), cut in the middle of the pause after the last of them, as a WAV of
    its own."""
    kept = [s for s in recording.sentences if s.end <= seconds] or list(recording.sentences[:1])
    pause = recording.pause_at(kept[-1].end + 1e-6) or (kept[-1].end, kept[-1].end)
    stop = round((pause[0] + pause[1]) / 2 * RATE)
    samples = read_wav(recording.wav)[:stop]
    return Recording(write_wav(out, samples), samples.size / RATE, tuple(kept))


def babble(directory: Path, seconds: float = 70.0, voices: int = 3, seed: int = 0) -> Path:
    """Speech with no silence anywhere: `voices` streams of sentences spoken back to back,
    each starting at a different point, mixed."""
    require_tools()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pool = SENTENCES + HARD_SENTENCES
    total = round(seconds * RATE)
    mix = np.zeros(total, dtype=np.float64)
    for voice in range(voices):
        stream = np.concatenate([spoken(t, directory) for t in rng.sample(pool, len(pool))])
        stream = np.tile(stream, total // stream.size + 2)
        offset = rng.randrange(stream.size // 4) + voice * RATE
        mix += stream[offset : offset + total] / voices * 1.5
    return write_wav(directory / f"babble-{voices}.wav", np.round(mix))


def bursts(seconds: float) -> bytes:
    """A WAV of 440 Hz tone bursts, 2.5 s on and 2.5 s off: long audio with gaps to cut in
    and no speech (for stand-in workers)."""
    t = np.arange(round(seconds * RATE)) / RATE
    return wav_of(3000 * np.sin(2 * np.pi * 440 * t) * (np.sin(2 * np.pi * 0.2 * t) > 0))


def tone(directory: Path, seconds: float = 70.0, hz: float = 440.0) -> Path:
    """A steady sine tone: no speech, no silence."""
    t = np.arange(round(seconds * RATE)) / RATE
    directory.mkdir(parents=True, exist_ok=True)
    return write_wav(directory / f"tone-{hz:g}.wav", 8000 * np.sin(2 * np.pi * hz * t))


def looped(source: Path, seconds: float, out: Path) -> Path:
    """`source` repeated for `seconds`, packets copied, not re-encoded (ffmpeg -stream_loop):
    an hour-long file in seconds. `out`'s suffix must suit `source`'s codec."""
    require_tools()
    if not out.exists():
        subprocess.run(
            [
                "ffmpeg",
                "-loglevel",
                "error",
                "-y",
                "-stream_loop",
                "-1",
                "-i",
                str(source),
                "-t",
                f"{seconds:g}",
                "-c",
                "copy",
                str(out),
            ],
            check=True,
        )
    return out


def damaged(source: Path, out: Path, at: float, garbage: int | None = 20000, seed: int = 0) -> Path:
    """A copy of `source` damaged at the fraction `at` of its bytes: `garbage` random bytes
    written over it there, or (garbage=None) the file cut off there."""
    data = bytearray(source.read_bytes())
    cut = int(len(data) * at)
    if garbage is None:
        del data[cut:]
    else:
        noise = random.Random(seed).randbytes(garbage)
        data[cut : cut + garbage] = noise
    out.write_bytes(bytes(data))
    return out
