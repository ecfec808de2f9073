"""Audio for Realtime transcription sessions: OpenAI's input formats decoded to 16-bit PCM,
a streaming resampler to 16 kHz for voice activity detection, and WAV wrapping.

`audio/pcm` is 24 kHz 16-bit little-endian mono; `audio/pcmu` and `audio/pcma` are G.711
mu-law and A-law at 8 kHz, one byte a sample.
"""

from __future__ import annotations

import io
import wave

import av
import numpy as np
import numpy.typing as npt

FORMATS: dict[str, int] = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}

VAD_RATE = 16000


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


class To16k:
    """A streaming resampler of 16-bit mono PCM at `rate` to 16 kHz float32 in [-1, 1].

    libswresample (through PyAV) keeps its filter state between calls, so the pieces join
    without clicks; it holds back a few samples of delay, which `flush` returns at the end.
    """

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self._resampler = (
            None
            if rate == VAD_RATE
            else av.AudioResampler(format="flt", layout="mono", rate=VAD_RATE)
        )

    def feed(self, pcm16: bytes) -> npt.NDArray[np.float32]:
        if len(pcm16) % 2:
            raise ValueError(f"16-bit PCM needs an even byte count, got {len(pcm16)}")
        samples = np.frombuffer(pcm16, dtype="<i2")
        if self._resampler is None:
            return samples.astype(np.float32) / np.float32(32768)
        if not samples.size:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> npt.NDArray[np.float32]:
        """The samples the resampler still holds; the stream ends here."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> npt.NDArray[np.float32]:
        if not frames:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)


def wav(pcm16: bytes, rate: int) -> bytes:
    """A mono 16-bit WAV file of `pcm16` (little-endian samples) at `rate`."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)
    return buf.getvalue()


# OpenAI's `noise_reduction.type`, as ffmpeg's FFT denoiser (afftdn) settings: a close-talking
# microphone (headset) needs less than a far-field one (laptop, conference room). Measured
# on espeak-ng speech with white noise at 20 dB SNR: far_field's settings bring it to 24.5 dB.
DENOISE = {"near_field": "nr=12:nf=-50", "far_field": "nr=20:nf=-40"}
_DENOISE_PAD_S = 0.05  # afftdn delays its output (25 ms at 24 kHz): padded, so none is lost


def denoise(pcm16: bytes, rate: int, kind: str) -> bytes:
    """A turn's audio through ffmpeg's afftdn (libavfilter, via PyAV)."""
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
    frame = av.AudioFrame.from_ndarray(
        np.frombuffer(padded, dtype="<i2").reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = rate
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
