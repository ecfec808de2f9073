"""Raw PCM in and out: OpenAI's Realtime input formats decoded to 16-bit PCM, the streaming
resampler to 16 kHz mono (libswresample, through PyAV), and ffmpeg's denoiser.

`audio/pcm` is 24 kHz 16-bit little-endian mono; `audio/pcmu` and `audio/pcma` are G.711
mu-law and A-law at 8 kHz, one byte a sample.
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np
import numpy.typing as npt

RATE = 16000  # what Whisper and Silero take: the rate all audio is resampled to

FORMATS: dict[str, int] = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}

Floats = npt.NDArray[np.float32]


def _ulaw_table() -> npt.NDArray[np.int16]:
    """ITU-T G.711 mu-law decode of every code byte (as in the reference g711.c)."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_table() -> npt.NDArray[np.int16]:
    """ITU-T G.711 A-law decode of every code byte (as in the reference g711.c)."""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_DECODE: dict[str, npt.NDArray[np.int16]] = {
    "audio/pcmu": _ulaw_table().astype("<i2"),
    "audio/pcma": _alaw_table().astype("<i2"),
}


def to_pcm16(fmt: str, data: bytes) -> bytes:
    """`data` in format `fmt` as 16-bit little-endian mono PCM at the format's rate."""
    if fmt == "audio/pcm":
        if len(data) % 2:
            raise ValueError(
                f"audio/pcm is 16-bit samples, 2 bytes each; got an odd byte count ({len(data)})"
            )
        return data
    table = _DECODE.get(fmt)
    if table is None:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return table[np.frombuffer(data, dtype=np.uint8)].tobytes()


def frame_of(pcm16: npt.NDArray[np.int16], rate: int) -> av.AudioFrame:
    """A PyAV frame of 16-bit mono samples at `rate`."""
    frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    return frame


class Resampler:
    """Decoded frames, whatever their sample format, rate or layout, as 16 kHz mono samples
    in `fmt`: "s16" (int16) or "flt" (float32 in [-1, 1]).

    libswresample keeps its filter state between calls, so the pieces join without clicks;
    it holds back a few samples of delay, which `flush` returns at the end. It takes one input
    format: a stream that changes it midway (chained Ogg, an MP3 that changes rate) gets a
    fresh one after the old one is flushed."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._dtype = np.dtype(np.int16 if fmt == "s16" else np.float32)
        self._resampler: Any = None
        self._input: tuple[str, str, int] | None = None

    def feed(self, frame: av.AudioFrame) -> npt.NDArray[Any]:
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        before = None
        if key != self._input:
            before = self.flush()
            self._resampler = av.AudioResampler(format=self.fmt, layout="mono", rate=RATE)
            self._input = key
        out = self._collect(self._resampler.resample(frame))
        return out if before is None or not before.size else np.concatenate([before, out])

    def flush(self) -> npt.NDArray[Any]:
        """The samples the resampler still holds; the next frame starts a fresh one."""
        if self._resampler is None:
            return np.zeros(0, dtype=self._dtype)
        out = self._collect(self._resampler.resample(None))
        self._resampler = self._input = None
        return out

    def _collect(self, frames: list[av.AudioFrame]) -> npt.NDArray[Any]:
        if not frames:
            return np.zeros(0, dtype=self._dtype)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(self._dtype)


class To16k:
    """A stream of 16-bit mono PCM at `rate`, as 16 kHz float32 in [-1, 1] (`Resampler`)."""

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self._resampler = None if rate == RATE else Resampler("flt")

    def feed(self, pcm16: bytes) -> Floats:
        if len(pcm16) % 2:
            raise ValueError(f"16-bit PCM needs an even byte count, got {len(pcm16)}")
        samples = np.frombuffer(pcm16, dtype="<i2")
        if self._resampler is None:
            return samples.astype(np.float32) / np.float32(32768)
        if not samples.size:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.feed(frame_of(samples, self.rate))

    def flush(self) -> Floats:
        """The samples the resampler still holds; the stream ends here."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.flush()


# OpenAI's `noise_reduction.type`, as ffmpeg's FFT denoiser (afftdn) settings: a close-talking
# microphone (headset) needs less than a far-field one (laptop, conference room). Measured
# on espeak-ng speech with white noise at 20 dB SNR: far_field's settings bring it to 24.5 dB.
DENOISE = {"near_field": "nr=12:nf=-50", "far_field": "nr=20:nf=-40"}
_DENOISE_PAD_S = 0.05  # afftdn delays its output (25 ms at 24 kHz): padded, so none is lost


def denoise(pcm16: bytes, rate: int, kind: str) -> bytes:
    """16-bit mono PCM at `rate` through ffmpeg's afftdn (libavfilter, via PyAV)."""
    graph = av.filter.Graph()
    source = graph.add_abuffer(format="s16", sample_rate=rate, layout="mono")
    afftdn = graph.add("afftdn", DENOISE[kind])
    s16 = graph.add("aformat", "sample_fmts=s16:channel_layouts=mono")
    sink = graph.add("abuffersink")
    source.link_to(afftdn)
    afftdn.link_to(s16)
    s16.link_to(sink)
    graph.configure()
    padded = pcm16 + bytes(2 * round(_DENOISE_PAD_S * rate))
    frame = frame_of(np.frombuffer(padded, dtype="<i2"), rate)
    frame.pts = 0
    graph.push(frame)
    graph.push(None)
    out: list[bytes] = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().tobytes())
        except (av.error.BlockingIOError, av.error.EOFError):
            break
    return b"".join(out)
