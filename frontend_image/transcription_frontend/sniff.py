"""Audio sniffing: what an upload is, read from its first and last bytes, before a worker is
busy with it.

`check_audio` refuses an empty file or one that is no audio container (400), and says which
container it is and how long it plays where the header tells that cheaply (`audio.headers`:
nothing is decoded): the gateway routes on both (an engine that cannot decode the
container, or that transcribes at most so many seconds, gets no such file; `adapters/`).

Autoscaling counts every request's audio (work.py), so it needs a length for each, even
while the upload is still arriving: `audio_seconds` is the header's length, else an
estimate from the file's size at the container's typical bit rate; `audio_seconds_from_head`
reads it from the file's first bytes and the request's Content-Length.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import IO

from transcription_api.errors import bad_request
from transcription_api.multipart import Upload

from .audio import headers

# Bits a second of audio takes in the containers whose header does not tell their length
# (or not before the file's end: Ogg's is on its last page), typical of speech as clients
# send it; any other container is taken for 16 kHz 16-bit mono PCM. Autoscaling's estimate
# only: routing never guesses a length.
TYPICAL_BITS_PER_SECOND = {"mp4": 96_000, "webm": 64_000, "ogg": 64_000, "aac": 96_000,
                           "wma": 64_000, "amr": 12_200, "mp3": 128_000}  # fmt: skip
PCM_BITS_PER_SECOND = 256_000

# What users call these containers, for error messages.
DESCRIPTIONS = {"mp4": "MP4/M4A (AAC)", "webm": "WebM/Matroska", "aac": "AAC (ADTS)",
                "wma": "ASF/WMA", "amr": "AMR"}  # fmt: skip


@dataclass(frozen=True)
class AudioInfo:
    """What the gateway knows of an upload without decoding it."""

    container: str  # `headers.container`'s name for it
    seconds: float | None = None  # None: the header does not say (cheaply)

    @property
    def description(self) -> str:
        return DESCRIPTIONS.get(self.container, self.container)


def check_audio(upload: Upload) -> AudioInfo:
    """The upload's container and duration; 400 for an empty file or no audio container."""
    if upload.size == 0:
        raise bad_request("the uploaded file is empty", param="file", code="empty_file")
    assert upload.file is not None
    try:
        return probe(upload.file, upload.size)
    finally:
        upload.file.seek(0)


def probe(f: IO[bytes], size: int) -> AudioInfo:
    f.seek(0)
    head = f.read(headers.HEAD)
    name = headers.container(head)
    if name is None:
        raise bad_request(
            "the file is not a recognised audio or video container (wav, mp3, flac, "
            "ogg, webm, m4a, mp4 ...)",
            param="file",
            code="invalid_audio",
        )
    return AudioInfo(name, headers.seconds(f, size, name, head))


def audio_seconds(audio: AudioInfo, size: int) -> float:
    """How long the `size` bytes of `audio` play: the header's length, else an estimate at
    the container's typical bit rate."""
    if audio.seconds is not None:
        return audio.seconds
    return size * 8 / TYPICAL_BITS_PER_SECOND.get(audio.container, PCM_BITS_PER_SECOND)


def audio_seconds_from_head(head: bytes, size: int) -> float | None:
    """`audio_seconds` of a file still arriving, from its first bytes (`head`) and its size, or
    the request's Content-Length (a little more: the form around the file); None when the
    head is no audio container."""
    name = headers.container(head)
    if name is None:
        return None
    seconds = headers.seconds(io.BytesIO(head), size, name, head)
    return audio_seconds(AudioInfo(name, seconds), size)
