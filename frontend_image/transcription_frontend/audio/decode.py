"""Decoding: any upload (any container and codec libav reads) streamed through PyAV frame by
frame into a temporary file of 16 kHz mono s16le PCM. An hour of it is 115 MB, which stays
on disk, not in memory; `Decoded.blocks` reads it back a block at a time.

Damage is found on the way and named with its offset: a file libav cannot read, decoding
that fails midway, timestamps that jump over lost audio, and audio that ends well before
the length the file's header declares (where that length is exact: `headers`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import av
import numpy as np
import numpy.typing as npt

from . import headers
from .pcm import RATE, Resampler

SAMPLE_BYTES = 2  # s16le mono
BLOCK_SAMPLES = 1024 * 512  # read from the spool at a time (whole VAD frames): 32.8 s, 1 MiB
# Lost audio: the stream's timestamps jump forward by more than this (garbage the demuxer
# skipped, frames the decoder dropped).
GAP_SECONDS = 0.5
# Truncation: the decoded audio ends this much before the length the file's header declares.
SHORTFALL_SECONDS = 1.0

Samples = npt.NDArray[np.int16]


class CorruptAudio(Exception):
    """The upload cannot be decoded (from the start: offset 0), or its audio breaks off or
    loses a stretch at `offset_seconds` (of audio decoded before the damage)."""

    def __init__(self, offset_seconds: float, detail: str) -> None:
        self.offset_seconds = offset_seconds
        self.detail = detail
        where = f"after {offset_seconds:.1f} s" if offset_seconds > 0 else "from its start"
        super().__init__(f"the audio cannot be decoded {where}: {detail}")


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
    """Decoded frames, whatever their format, rate or layout, written as 16 kHz mono s16."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.samples = 0
        self._resampler = Resampler("s16")

    def feed(self, frame: av.AudioFrame) -> None:
        self._write(self._resampler.feed(frame))

    def drain(self) -> None:
        self._write(self._resampler.flush())

    def _write(self, samples: npt.NDArray[Any]) -> None:
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
    format_name = str(container.format.name)
    if isinstance(source, Path):
        with source.open("rb") as f:
            exact = headers.length_is_exact(format_name, f)
    else:
        exact = headers.length_is_exact(format_name, source)
    if not exact:
        return None  # e.g. ffmpeg estimates it from the bit rate: wrong for VBR
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and len(container.streams) == 1:
        return float(container.duration) / av.time_base
    return None
