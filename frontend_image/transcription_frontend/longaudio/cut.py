"""Long audio cut on silence: decode any upload to spooled 16 kHz PCM, find silences with
Silero VAD, choose chunk boundaries there, and encode each chunk as a small FLAC file.

`decode` streams the upload through libav (PyAV) frame by frame into a temporary file of
16 kHz mono s16le PCM: an hour of it is 115 MB, which stays on disk, not in memory.
`find_cuts` reads that file back in blocks, runs Silero over it (one probability per 32 ms
frame: 450 KB for an hour) and cuts it into contiguous chunks, each at most
`max_chunk_seconds`, ending in the middle of a silence wherever one exists. `encode` turns a
chunk into a 16 kHz mono FLAC (or WAV) file in memory: about 0.5 MB for 30 s.

The chunks cover the whole audio with no gap and no overlap (silences are not dropped), so
a chunk's timestamps become global ones by adding its `start`.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import tempfile
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import av
import numpy as np
import numpy.typing as npt

from .. import vad

RATE = 16000  # samples per second of the spooled PCM
SAMPLE_BYTES = 2  # s16le mono
BLOCK_SAMPLES = 1024 * vad.FRAME  # read from the spool at a time: 32.8 s, 1 MiB
# What Silero scores in one call: 8.2 s. Larger batches are hardly faster, and ONNX Runtime's
# memory grows with them (an hour: +7 MB at 256 frames a call, +28 MB at 1024).
VAD_BLOCK_SAMPLES = 256 * vad.FRAME
# Silero's hysteresis: once below threshold - NEG_OFFSET, a frame is silence (as in
# faster-whisper's and vad.TurnDetector's use of it).
NEG_OFFSET = 0.15
WINDOW_BEFORE_TARGET = 8.0  # a chunk may end this long before its target
# Lost audio: the stream's timestamps jump forward by more than this (garbage the demuxer
# skipped, frames the decoder dropped).
GAP_SECONDS = 0.5
# Truncation: the decoded audio ends this much before the length the file's header declares.
SHORTFALL_SECONDS = 1.0
# Containers whose header states the audio's length exactly (not estimated from a bit rate).
# MP3 is one only with a Xing/Info/VBRI frame count; raw AAC/ADTS and others are not.
EXACT_LENGTH_FORMATS = frozenset(
    {"flac", "mov", "mp4", "m4a", "matroska", "webm", "ogg", "wav", "w64", "aiff", "caf"}
)
# normalize=True: the 99th percentile of the frames' RMS levels (the loud speech) is brought
# to this level, the gain kept within these bounds; the VAD's input only.
NORMALIZE_LEVEL = 0.25
NORMALIZE_PERCENTILE = 99.0
NORMALIZE_GAIN = (0.1, 100.0)

Samples = npt.NDArray[np.int16]
Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ChunkSettings:
    """How long audio is cut. The last three fields mean what OpenAI's `server_vad`
    chunking strategy says; `normalize` is what its `"auto"` strategy adds.

    - `max_chunk_seconds`: no chunk is longer (what the engine takes whole);
    - `target_chunk_seconds`: a chunk ends in a silence between `target - 8 s` (at least a
      quarter of the maximum) and the maximum, and a cut starts a new one;
    - `threshold`: Silero speech probability at or above which a 32 ms frame is speech;
      frames below `threshold - 0.15` are silence, those in between uncertain;
    - `silence_duration_ms`: a silence at least this long is a preferred cut;
    - `prefix_padding_ms`: accepted for `server_vad`'s sake. Chunks are contiguous and cut
      in the middle of a silence, so each already starts with half the silence before its
      speech (at least this much when that silence is twice as long); it moves no cut;
    - `normalize`: bring the audio's loudness to a standard level before the VAD sees it
      (the chunks' audio is not changed).
    """

    max_chunk_seconds: float = 30.0
    target_chunk_seconds: float = 25.0
    threshold: float = 0.5
    silence_duration_ms: int = 500
    prefix_padding_ms: int = 300
    normalize: bool = False

    def __post_init__(self) -> None:
        if not self.max_chunk_seconds >= 1.0:
            raise ValueError(f"max_chunk_seconds must be at least 1, got {self.max_chunk_seconds}")
        if not 0 < self.target_chunk_seconds <= self.max_chunk_seconds:
            raise ValueError(
                f"target_chunk_seconds must be in (0, max_chunk_seconds="
                f"{self.max_chunk_seconds}], got {self.target_chunk_seconds}"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold}")
        if self.silence_duration_ms < 0 or self.prefix_padding_ms < 0:
            raise ValueError("silence_duration_ms and prefix_padding_ms must not be negative")

    @property
    def neg_threshold(self) -> float:
        """Below this probability a frame is silence (Silero's hysteresis)."""
        return max(self.threshold - NEG_OFFSET, 0.01)

    @property
    def window_seconds(self) -> float:
        """How far into a chunk its end may come first: `target - 8 s`, at least a quarter
        of the maximum."""
        return max(self.target_chunk_seconds - WINDOW_BEFORE_TARGET, 0.25 * self.max_chunk_seconds)


class CorruptAudio(Exception):
    """The upload cannot be decoded (from the start: offset 0), or its audio breaks off or
    loses a stretch at `offset_seconds` (of audio decoded before the damage)."""

    def __init__(self, offset_seconds: float, detail: str) -> None:
        self.offset_seconds = offset_seconds
        self.detail = detail
        where = f"after {offset_seconds:.1f} s" if offset_seconds > 0 else "from its start"
        super().__init__(f"the audio cannot be decoded {where}: {detail}")


@dataclass(frozen=True)
class Chunk:
    """A stretch of the audio, in seconds from the start of the whole."""

    index: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Decoded:
    """Audio decoded into a spooled file of 16 kHz mono s16le PCM; `close` deletes it."""

    pcm: Path
    seconds: float

    @property
    def samples(self) -> int:
        return round(self.seconds * RATE)

    def blocks(
        self, start: int = 0, stop: int | None = None, size: int = BLOCK_SAMPLES
    ) -> Iterator[Samples]:
        """Samples `start` to `stop` (indexes; default: all), `size` at a time."""
        stop = self.samples if stop is None else min(stop, self.samples)
        with self.pcm.open("rb") as f:
            f.seek(start * SAMPLE_BYTES)
            position = start
            while position < stop:
                data = f.read(min(size, stop - position) * SAMPLE_BYTES)
                if len(data) < SAMPLE_BYTES:
                    return
                block = np.frombuffer(data[: len(data) // SAMPLE_BYTES * SAMPLE_BYTES], "<i2")
                yield block
                position += block.size

    def close(self) -> None:
        self.pcm.unlink(missing_ok=True)

    def __enter__(self) -> Decoded:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _reason(error: Exception) -> str:
    """libav's words for an error, without PyAV's errno prefix and file name."""
    strerror = getattr(error, "strerror", None)
    return str(strerror) if strerror else str(error)


class _Spool:
    """Writes decoded frames, whatever their format, rate or layout, as 16 kHz mono s16.

    A resampler takes one input format; a stream that changes it midway (chained Ogg, an
    MP3 that changes rate) gets a fresh one after the old one is drained."""

    def __init__(self, out: io.BufferedWriter) -> None:
        self.out = out
        self.samples = 0
        self._resampler: Any = None
        self._input: tuple[str, str, int] | None = None

    def feed(self, frame: Any) -> None:
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        if key != self._input:
            self.drain()
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            self._input = key
        self._write(self._resampler.resample(frame))

    def drain(self) -> None:
        if self._resampler is not None:
            self._write(self._resampler.resample(None))
            self._resampler = None
            self._input = None

    def _write(self, frames: list[Any]) -> None:
        for frame in frames:
            samples = frame.to_ndarray().reshape(-1)
            self.out.write(samples.astype("<i2", copy=False).tobytes())
            self.samples += samples.size


def decode(source: Path | IO[bytes], spool_dir: Path | None = None) -> Decoded:
    """Decode the first audio stream of `source` (any container and codec libav reads; a
    path, or a seekable binary file, all of it: libav seeks from its byte 0) to a spooled
    16 kHz mono s16le file in `spool_dir` (default: the temporary directory), a frame at a
    time.

    Raises CorruptAudio: at 0.0 when libav cannot read the file or it has no audio stream;
    at the end of the last good audio when decoding fails midway, when the timestamps jump
    over lost audio, or when the audio ends well before the length its header declares
    (truncation; detectable only where the header states it exactly: not in MP3 files
    without a Xing/Info/VBRI frame, nor in raw PCM WAV, whose length is its size).
    """
    if not isinstance(source, Path):
        source.seek(0)
    try:
        # mode "r" said: a spooled upload's file object has mode "w+b", from which PyAV
        # would guess an output container
        container = av.open(
            str(source) if isinstance(source, Path) else source, mode="r",
            metadata_errors="ignore",
        )  # fmt: skip
    except av.error.FFmpegError as e:
        raise CorruptAudio(0.0, f"libav cannot read it as audio ({_reason(e)})") from e
    with container:
        stream = next(iter(container.streams.audio), None)
        if stream is None:
            kinds = ", ".join(sorted({s.type for s in container.streams})) or "none"
            raise CorruptAudio(
                0.0,
                f"it has no audio stream (libav reads it as {container.format.name}, "
                f"with streams: {kinds})",
            )
        fd, name = tempfile.mkstemp(prefix="longaudio-", suffix=".s16le", dir=spool_dir)
        pcm = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                spool = _Spool(out)
                _decode_stream(container, stream, spool)
            seconds = spool.samples / RATE
            declared = _declared_seconds(source, container, stream)
            if declared is not None and seconds < declared - SHORTFALL_SECONDS:
                raise CorruptAudio(
                    seconds,
                    f"the file declares {declared:.1f} s of audio but it ends after "
                    f"{seconds:.1f} s (truncated or damaged)",
                )
        except BaseException:
            pcm.unlink(missing_ok=True)
            raise
    return Decoded(pcm=pcm, seconds=seconds)


def _decode_stream(container: Any, stream: Any, spool: _Spool) -> None:
    expected: float | None = None  # where the next frame should start, in stream seconds
    try:
        for packet in container.demux(stream):
            for frame in packet.decode():
                start = frame.time
                if start is not None and expected is not None and start - expected > GAP_SECONDS:
                    raise CorruptAudio(
                        spool.samples / RATE,
                        f"{start - expected:.1f} s of audio are missing or unreadable "
                        f"(its timestamps jump from {expected:.1f} s to {start:.1f} s)",
                    )
                span = frame.samples / frame.sample_rate
                if start is not None:
                    expected = start + span
                elif expected is not None:
                    expected += span
                spool.feed(frame)
        spool.drain()
    except av.error.FFmpegError as e:
        raise CorruptAudio(spool.samples / RATE, f"libav fails to decode it ({_reason(e)})") from e


def _declared_seconds(source: Path | IO[bytes], container: Any, stream: Any) -> float | None:
    """The audio's length as the file's header states it, where it is exact."""
    names = set(str(container.format.name).split(","))
    if "mp3" in names:
        if isinstance(source, Path):
            with source.open("rb") as f:
                counted = _mp3_counts_frames(f)
        else:
            counted = _mp3_counts_frames(source)
        if not counted:
            return None  # ffmpeg estimates it from the bit rate: wrong for VBR
    elif not names & EXACT_LENGTH_FORMATS:
        return None
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and len(container.streams) == 1:
        return float(container.duration) / av.time_base
    return None


def _mp3_counts_frames(f: IO[bytes]) -> bool:
    """Whether the first frame of the MP3 file `f` is a Xing/Info/VBRI header (a frame
    count)."""
    f.seek(0)
    head = f.read(10)
    if head[:3] == b"ID3" and len(head) == 10:
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14
        size |= (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
        f.seek(10 + size + (10 if head[5] & 0x10 else 0))
    else:
        f.seek(0)
    data = f.read(8192)
    sync = 0
    while (sync := data.find(b"\xff", sync)) != -1 and sync + 1 < len(data):
        if data[sync + 1] & 0xE0 == 0xE0:
            frame = data[sync : sync + 200]
            return any(tag in frame for tag in (b"Xing", b"Info", b"VBRI"))
        sync += 1
    return False


def speech_probabilities(
    decoded: Decoded, settings: ChunkSettings, model: vad.SpeechModel | None = None
) -> Floats:
    """Silero's speech probability of each whole 32 ms frame of the audio (normalised first
    if the settings say so), read from the spool a block at a time."""
    model = model if model is not None else vad.Silero()
    model.reset()
    gain = _normalizing_gain(decoded) if settings.normalize else 1.0
    parts: list[Floats] = []
    for block in decoded.blocks(size=VAD_BLOCK_SAMPLES):
        samples = block.astype(np.float32) / np.float32(32768)
        if gain != 1.0:
            samples = np.clip(samples * np.float32(gain), -1.0, 1.0)
        parts.append(model.probabilities(samples))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def _normalizing_gain(decoded: Decoded) -> float:
    """The gain that brings the loud frames (the 99th percentile of 32 ms RMS levels) to
    NORMALIZE_LEVEL, within NORMALIZE_GAIN; 1 for digital silence."""
    levels: list[Floats] = []
    for block in decoded.blocks():
        whole = block.size // vad.FRAME * vad.FRAME
        if not whole:
            continue
        frames = block[:whole].reshape(-1, vad.FRAME).astype(np.float32) / np.float32(32768)
        levels.append(np.sqrt(np.mean(np.square(frames), axis=1)))
    if not levels:
        return 1.0
    level = float(np.percentile(np.concatenate(levels), NORMALIZE_PERCENTILE))
    if level < 1e-5:
        return 1.0
    low, high = NORMALIZE_GAIN
    return min(max(NORMALIZE_LEVEL / level, low), high)


def find_cuts(decoded: Decoded, settings: ChunkSettings) -> list[Chunk]:
    """Contiguous chunks covering the whole audio, each at most `max_chunk_seconds`, cut
    in silences Silero finds (see `choose_cuts`)."""
    if decoded.seconds <= settings.max_chunk_seconds:
        return [Chunk(0, 0.0, decoded.seconds)]
    return choose_cuts(speech_probabilities(decoded, settings), decoded.samples, settings)


def choose_cuts(probabilities: Floats, samples: int, settings: ChunkSettings) -> list[Chunk]:
    """Chunks of `samples` samples of 16 kHz audio from per-frame speech probabilities.

    From each chunk's start, its end is sought in a window from `settings.window_seconds`
    to `max_chunk_seconds` later; the audio left after the last cut is at most the maximum.
    In the window the end is, in order of preference, the middle of:
    1. the longest run of silence (frames below `threshold - 0.15`) lasting at least
       `silence_duration_ms`;
    2. the longest run of frames below `threshold`, however short;
    3. the frame of lowest probability (no silence at all: a cut in speech cannot be
       avoided).
    Equally long runs: the one nearest the target wins.
    """
    limit = round(settings.max_chunk_seconds * RATE)
    earliest = round(settings.window_seconds * RATE)
    target = round(settings.target_chunk_seconds * RATE)
    bounds = [0]
    while samples - bounds[-1] > limit:
        start = bounds[-1]
        end = _cut(probabilities, start + earliest, start + limit, start + target, settings)
        bounds.append(end)
    bounds.append(samples)
    return [
        Chunk(index, first / RATE, last / RATE)
        for index, (first, last) in enumerate(itertools.pairwise(bounds))
    ]


def _cut(probabilities: Floats, low: int, high: int, target: int, settings: ChunkSettings) -> int:
    """Where to cut between samples `low` and `high` (see `choose_cuts`)."""
    first = -(-low // vad.FRAME)  # the frames wholly inside the window
    last = min(high // vad.FRAME, probabilities.size)
    if last <= first:
        return high
    window = probabilities[first:last]
    shortest = max(1, math.ceil(settings.silence_duration_ms / vad.FRAME_MS))
    runs = [r for r in _runs(window < settings.neg_threshold) if r[1] - r[0] >= shortest]
    if not runs:
        runs = _runs(window < settings.threshold)
    if not runs:
        return (first + int(np.argmin(window))) * vad.FRAME + vad.FRAME // 2

    def middle(run: tuple[int, int]) -> int:
        return (2 * first + run[0] + run[1]) * vad.FRAME // 2

    best = max(runs, key=lambda r: (r[1] - r[0], -abs(middle(r) - target)))
    return middle(best)


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """The [start, end) index ranges where `mask` is true."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def encode(decoded: Decoded, chunk: Chunk, fmt: str = "flac") -> bytes:
    """The chunk's audio as a 16 kHz mono 16-bit file, "flac" (lossless, about half the
    size) or "wav", in memory."""
    first, last = round(chunk.start * RATE), round(chunk.end * RATE)
    buf = io.BytesIO()
    if fmt == "wav":
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(SAMPLE_BYTES)
            w.setframerate(RATE)
            for block in decoded.blocks(first, last):
                w.writeframes(block.tobytes())
        return buf.getvalue()
    if fmt != "flac":
        raise ValueError(f"chunks are encoded as flac or wav, not {fmt!r}")
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=RATE, layout="mono", format="s16")
        pts = 0
        for block in decoded.blocks(first, last):
            frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = RATE
            frame.pts = pts
            pts += block.size
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()
