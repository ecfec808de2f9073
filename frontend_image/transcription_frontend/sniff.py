"""Audio sniffing: what an upload is, read from its first and last bytes, before a worker is
busy with it.

`check_audio` refuses an empty file or one that is no audio container (400), and says which
container it is and how long it plays where the header tells that cheaply (`audio.headers`:
nothing is decoded): the gateway routes on both (an engine that cannot decode the
container, or that transcribes at most so many seconds, gets no such file; `adapters/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from transcription_api.errors import bad_request
from transcription_api.multipart import Upload

from .audio import headers

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
